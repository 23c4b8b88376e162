"""The selection RL loop: one arm (sampler x seed) of GRPO from a shared pre-trained policy.

`run_arm(blob, pool, eval_set, "ppm", seed, LoopArgs())` -> `ArmResult` with one row per step:
rollouts spent (cumulative, DAPO's discarded rounds included), wasted (zero-variance) rollouts,
the rollouts actually trained on, batch reward, held-out greedy accuracy every `eval_every` steps
(pass@1 every `pass1_every`), per-family accuracy, and wall time split into selection
(`select` + the sampler's `update`, i.e. PPM fits), sampling (rollout + verification) and
the policy update. DAPO goes through `fill_batch`; every other sampler through select/update.
For the PPM sampler the loop also keeps calibration pairs: the PPM's prediction for each
held-out (never rolled-out) prompt, made *before* the evaluation samples, against the pass
rate those samples observe.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import numpy as np
import torch

from rlstream.trainers.backend import CosineSchedule
from rlstream.trainers.envs import Prompt, verify
from rlstream.trainers.policy import (
    Policy,
    make_learner,
    policy_from_bytes,
    rollout,
    score,
    to_experience,
)
from rlstream.trainers.rl import Experience, RLArgs
from rlstream.trainers.sampling import sample
from rlstream.trainers.selection.dapo import DynamicSamplingSampler, fill_batch
from rlstream.trainers.selection.policy_features import (
    check_features,
    make_policy_ppm_sampler,
    tuned_args,
)
from rlstream.trainers.selection.predictive import PredictiveArgs
from rlstream.trainers.selection.registry import make_selection_sampler


@dataclass
class LoopArgs:
    """GRPO settings default to the local loop's (rlstream.trainers.local.Args)."""

    steps: int = 80
    """RL steps (one update each)"""
    prompts_per_step: int = 32
    """prompts trained on per step (B)"""
    group_size: int = 8
    """completions per prompt (G)"""
    temperature: float = 1.0
    """rollout and pass@1 temperature"""
    max_new_tokens: int = 8
    """longest completion"""
    rl_lr: float = 1e-4
    """RL learning rate, cosine-decayed to a tenth over `steps`"""
    kl_coef: float = 0.0
    """KL penalty to the frozen pre-trained reference"""
    eval_every: int = 2
    """steps between held-out greedy evaluations (steps-to-target is interpolated between)"""
    pass1_every: int = 20
    """steps between pass@1 evaluations (sampled, costlier); the last step always has one"""
    eval_samples: int = 8
    """samples per held-out prompt for pass@1 (and PPM calibration)"""
    final_eval_samples: int = 16
    """samples per held-out prompt at the last step (test-time allocation needs pass rates)"""
    threads: int = 1
    """torch threads (2 shared cores: 1 avoids contention, the PPM needs 1)"""
    ppm: PredictiveArgs = field(default_factory=tuned_args)
    """PPM-sampler settings (tuned on the default pool: see the bench report)"""
    ppm_features: str = "reference"
    """PPM featurizers (comma-separated): reference (the policy's probability of the reference
    answer at the rollout temperature; one teacher-forced pass), confidence (its probability of
    its own greedy answer; one greedy decode, no reference answer), hidden (policy state at the
    last prompt token), text (char n-grams). An arm named `ppm:<featurizers>` overrides this.
    Default pool, 5 seeds: reference r 0.90 on unseen prompts; confidence alone r 0.64; with
    text r 0.54 (the n-grams overfit)"""

    def __post_init__(self):
        if self.steps < 1 or self.eval_every < 1 or self.pass1_every < 1:
            raise ValueError("steps, eval_every and pass1_every must be >= 1")
        check_features(self.ppm_features)


def arm_spec(name: str, a: LoopArgs) -> tuple[str, list[str]]:
    """An arm's sampler and PPM featurizers: 'ppm:confidence' -> ('ppm', ['confidence']);
    a plain name takes `a.ppm_features`. Only the PPM sampler takes featurizers."""
    base, _, feats = name.partition(":")
    if feats and base != "ppm":
        raise ValueError(f"arm {name!r}: only ppm takes featurizers (ppm:<featurizers>)")
    return base, check_features(feats or a.ppm_features)


@dataclass
class ArmResult:
    sampler: str
    seed: int
    rows: list[dict]
    """one dict per step (and a step-0 evaluation row)"""
    calibration: list[tuple[float, float, int]] = field(default_factory=list)
    """(predicted, successes, attempts) on unseen held-out prompts, PPM arm only"""
    allocation: dict | None = None
    """final PPM predictions and observed pass rates on held-out prompts, PPM arm only"""
    score_records: int = 0
    """prompt_scores decision records the sampler produced (publishable; counted here)"""
    policy: Policy | None = None
    """the trained policy, when run_arm was asked to keep it"""


def make_arm_sampler(name: str, pool: list[Prompt], seed: int, policy: Policy, a: LoopArgs):
    """The registered sampler; the PPM one (`ppm[:featurizers]`) reads the featurizers named."""
    base, features = arm_spec(name, a)
    if base != "ppm":
        return make_selection_sampler(base, pool, seed)
    return make_policy_ppm_sampler(
        pool, seed, lambda: policy, features, a.ppm, a.temperature, a.max_new_tokens
    )


@torch.no_grad()
def evaluate_heldout(policy: Policy, prompts: list[Prompt], k: int, a: LoopArgs, seed: int):
    """Greedy accuracy (+ by family) and, when k > 0, per-prompt pass rates of k samples."""
    texts = [p.text for p in prompts]
    s = sample(policy.model, policy.tok, texts, 1, a.max_new_tokens, temperature=0)
    ok = np.array([verify(c, p) for c, p in zip(s.texts, prompts, strict=True)], dtype=float)
    out: dict = {"greedy": float(ok.mean())}
    for fam in sorted({p.task for p in prompts}):
        out[f"greedy_{fam}"] = float(ok[[p.task == fam for p in prompts]].mean())
    rates = None
    if k:
        g = torch.Generator().manual_seed(seed + 123)
        s = sample(policy.model, policy.tok, texts, k, a.max_new_tokens, a.temperature, generator=g)
        hits = [verify(c, prompts[j]) for c, j in zip(s.texts, s.prompt_index, strict=True)]
        rates = np.array(hits, dtype=float).reshape(len(prompts), k).mean(1)
        out["pass1"] = float(rates.mean())
    return out, rates


def _merge(parts: list[Experience]) -> Experience:
    cols = [[], [], [], [], [], []]
    for e in parts:
        for c, v in zip(
            cols,
            (
                e.prompt_tokens,
                e.completion_tokens,
                e.old_logprobs,
                e.rewards,
                e.group_ids,
                e.policy_version,
            ),
            strict=True,
        ):
            c += v
    return Experience(*cols)


def collect_dapo(sampler: DynamicSamplingSampler, policy, learner, a: LoopArgs, step, gen):
    """DAPO rounds via fill_batch; returns (experience of admitted groups, prompts, rewards,
    seconds spent rolling out)."""
    rounds, t_roll, G = [], 0.0, a.group_size

    def roll(prompts: list[Prompt]) -> list[list[float]]:
        nonlocal t_roll
        t = time.perf_counter()
        s = rollout(policy, prompts, G, a.max_new_tokens, a.temperature, gen)
        rewards, _ = score(prompts, s)
        rounds.append((prompts, s, rewards))
        t_roll += time.perf_counter() - t
        return [rewards[i * G : (i + 1) * G] for i in range(len(prompts))]

    batch = fill_batch(sampler, roll, a.prompts_per_step, step)
    parts = []
    for r, i in batch.positions:
        prompts, s, rewards = rounds[r]
        e = to_experience(prompts, s, rewards, learner.version).select(range(i * G, (i + 1) * G))
        e.group_ids = [f"r{r}:{g}" for g in e.group_ids]
        parts.append(e)
    return _merge(parts), batch.prompts, batch.rewards, t_roll


def rl_step(sampler, policy, learner, a: LoopArgs, step: int, gen) -> tuple[Experience, dict]:
    """Select, roll out, score, report to the sampler; returns the experience and timings."""
    G = a.group_size
    if isinstance(sampler, DynamicSamplingSampler):
        t0 = time.perf_counter()
        exp, prompts, rewards, t_roll = collect_dapo(sampler, policy, learner, a, step, gen)
        total = time.perf_counter() - t0
        return exp, {"t_select": total - t_roll, "t_sample": t_roll, "n_trained": len(prompts)}
    t0 = time.perf_counter()
    prompts = sampler.select(step, a.prompts_per_step)
    t1 = time.perf_counter()
    s = rollout(policy, prompts, G, a.max_new_tokens, a.temperature, gen)
    rewards, _ = score(prompts, s)
    t2 = time.perf_counter()
    with _threads(1):  # the PPM fit: 1 thread is ~25x faster than 2 on a shared box
        sampler.update(prompts, [rewards[i * G : (i + 1) * G] for i in range(len(prompts))])
    t3 = time.perf_counter()
    exp = to_experience(prompts, s, rewards, learner.version)
    return exp, {"t_select": (t1 - t0) + (t3 - t2), "t_sample": t2 - t1, "n_trained": len(prompts)}


class _threads:
    def __init__(self, n: int):
        self.n = n

    def __enter__(self):
        self.before = torch.get_num_threads()
        torch.set_num_threads(self.n)

    def __exit__(self, *exc):
        torch.set_num_threads(self.before)


def run_arm(
    blob: bytes,
    pool: list[Prompt],
    eval_set: list[Prompt],
    sampler_name: str,
    seed: int,
    a: LoopArgs,
    on_step=None,
    keep_policy: bool = False,
) -> ArmResult:
    """RL-train a copy of the policy in `blob` with one sampler; see the module docstring.

    on_step(row) is called after every step (progress display)."""
    torch.set_num_threads(a.threads)
    torch.manual_seed(seed)
    policy = policy_from_bytes(blob)
    learner = make_learner(
        policy, RLArgs(algo="grpo", lr=a.rl_lr, kl_coef=a.kl_coef), backend="torch", seed=seed
    )
    sampler = make_arm_sampler(sampler_name, pool, seed, policy, a)
    features = arm_spec(sampler_name, a)[1]
    ppm = getattr(sampler, "ppm", None)
    gen = torch.Generator().manual_seed(seed + 7)
    sched = CosineSchedule(a.rl_lr, 0, a.steps, a.rl_lr / 10)
    res = ArmResult(sampler_name, seed, [])
    ev, _ = evaluate_heldout(policy, eval_set, 0, a, seed)
    res.rows.append({"step": 0, "rollouts": 0, "wasted": 0, "trained_rollouts": 0} | ev)
    trained = 0
    for step in range(a.steps):
        learner.backend.set_lr(sched(step))
        exp, t = rl_step(sampler, policy, learner, a, step, gen)
        res.score_records += len(getattr(sampler, "last_records", []))
        t0 = time.perf_counter()
        if len(exp):  # a DAPO batch can come back empty when every round was zero-variance
            learner.step(exp)
        t["t_update"] = time.perf_counter() - t0
        policy.version = learner.version
        if ppm is not None and features != ["text"]:
            ppm.refresh_features()  # policy features move with the policy
        trained += len(exp)
        G = a.group_size
        zero = sum(len(set(exp.rewards[i : i + G])) == 1 for i in range(0, len(exp), G))
        row = {
            "step": step + 1,
            "rollouts": sampler.rollouts,
            "wasted": sampler.wasted_rollouts,
            "trained_rollouts": trained,
            "reward": float(np.mean(exp.rewards)) if len(exp) else float("nan"),
            "trained_zero_var_share": zero / max(1, len(exp) // G),
        } | t
        last = step + 1 == a.steps
        if (step + 1) % a.eval_every == 0 or last:
            k = a.final_eval_samples if last else a.eval_samples
            k = k if last or (step + 1) % a.pass1_every == 0 else 0
            pred = None
            if ppm is not None and k:
                with _threads(1):
                    pred = ppm.predict(eval_set)  # before any of these samples exist
            ev, rates = evaluate_heldout(policy, eval_set, k, a, seed + step)
            row |= ev
            if pred is not None:
                res.calibration += [
                    (float(p), float(r) * k, k) for p, r in zip(pred, rates, strict=True)
                ]
                if last:
                    with _threads(1):
                        int8 = ppm.predict(eval_set, int8=True)
                    res.allocation = {
                        "pred": pred.tolist(),
                        "pred_int8": int8.tolist(),
                        "observed": rates.tolist(),
                        "k": k,
                    }
        res.rows.append(row)
        if on_step is not None:
            on_step(row)
    res.policy = policy if keep_policy else None
    return res
