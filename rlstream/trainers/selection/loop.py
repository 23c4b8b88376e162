"""The selection RL loop: one arm (sampler x seed) of GRPO from a shared pre-trained policy.

`run_arm(blob, pool, eval_set, "ppm", seed, Config(), ArmArgs())` -> `ArmResult`, one row a step:
rollouts spent (cumulative, DAPO's discarded rounds included), wasted (zero-variance) rollouts,
the rollouts actually trained on, batch reward, held-out greedy accuracy every `eval_every` steps
(pass@1 every `pass1_every`), per-family accuracy, and wall time split into selection
(`select` + the sampler's `update`, i.e. PPM fits), sampling (rollout + verification) and
the policy update. Batches come from the shared `collect` (DAPO's rounds through `fill_batch`)
and updates from the training core's `rl_update`, as in the in-process loop.
For the PPM sampler the loop also keeps calibration pairs: the PPM's prediction for each
held-out (never rolled-out) prompt, made *before* the evaluation samples, against the pass
rate those samples observe.
"""

from __future__ import annotations

import hashlib
import io
import tarfile
import time
from dataclasses import dataclass, field

import numpy as np
import torch

from rlstream.config import Config
from rlstream.trainers.collect import collect, threads
from rlstream.trainers.core import TrainState, rl_update
from rlstream.trainers.envs import Prompt
from rlstream.trainers.evaluate import evaluate_with
from rlstream.trainers.policy import Policy, policy_from_bytes
from rlstream.trainers.selection.compute import Compute, measure_prefill_ratio
from rlstream.trainers.selection.policy_features import tuned_args
from rlstream.trainers.selection.predictive import PredictiveArgs
from rlstream.trainers.selection.registry import build_sampler, policy_moved, split_arm


@dataclass
class ArmArgs:
    """What an arm does besides training (the training settings are the run's Config)."""

    eval_every: int = 2
    """steps between held-out greedy evaluations (steps-to-target is interpolated between)"""
    pass1_every: int = 20
    """steps between pass@1 evaluations (sampled, costlier); the last step always has one"""
    final_eval_samples: int = 16
    """samples per held-out prompt at the last step (test-time allocation needs pass rates)"""
    threads: int = 1
    """torch threads (2 shared cores: 1 avoids contention, the PPM needs 1)"""
    ppm: PredictiveArgs = field(default_factory=tuned_args)
    """PPM-sampler settings (tuned on the default pool: see the bench report)"""

    def __post_init__(self):
        if self.eval_every < 1 or self.pass1_every < 1:
            raise ValueError("eval_every and pass1_every must be >= 1")


def arm_spec(name: str, cfg: Config) -> tuple[str, list[str]]:
    """An arm's sampler and PPM featurizers: 'ppm:confidence' -> ('ppm', ['confidence']);
    a plain name takes cfg.ppm_feature_spec()."""
    return split_arm(name, cfg.ppm_feature_spec())


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
    start_policy: str = ""
    """fingerprint of the policy the arm started from (policy_fingerprint): arms of one pool
    compare only when it is the same"""
    warm_start: dict | None = None
    """what this arm's PPM started from, if anything: source arm, observations, fits, the
    prior strength its predictions carried"""
    ppm_state: dict | None = None
    """the PPM sampler's final `warm_state` (kept beside the arm's JSON, not in it)"""
    prefill_ratio: dict | None = None
    """a prefill token's cost in decoded tokens, measured on the starting policy at the arm's
    start (`compute.measure_prefill_ratio`): what the pool's compute figures charge"""


def policy_fingerprint(blob: bytes) -> str:
    """The first 12 hex digits of a SHA-256 over the policy's files, names and contents in name
    order (`policy_to_bytes`' tar): the same weights give the same fingerprint however often
    they are pre-trained again, while a hash of the tar itself changes with its headers' file
    times (arms saved before 12-06 carry that one)."""
    h = hashlib.sha256()
    with tarfile.open(fileobj=io.BytesIO(blob)) as tar:
        for member in sorted((m for m in tar.getmembers() if m.isfile()), key=lambda m: m.name):
            h.update(member.name.encode() + b"\0")
            h.update(tar.extractfile(member).read())
    return h.hexdigest()[:12]


def evaluate_heldout(policy: Policy, prompts: list[Prompt], k: int, cfg: Config, seed: int):
    """The shared evaluator's figures, and per-prompt pass rates of k samples when k > 0."""
    ev = evaluate_with(policy.model, policy.tok, prompts, cfg, k, seed)
    rates = ev.pop("pass_rates", None)
    return ev, None if rates is None else np.array(rates)


def run_arm(
    blob: bytes,
    pool: list[Prompt],
    eval_set: list[Prompt],
    sampler_name: str,
    seed: int,
    cfg: Config,
    a: ArmArgs | None = None,
    on_step=None,
    keep_policy: bool = False,
    warm: tuple[str, dict] | None = None,
) -> ArmResult:
    """RL-train a copy of the policy in `blob` with one sampler; see the module docstring.

    cfg: the run's settings (rl.steps, rl.lr, ...; its seed is replaced by `seed`);
    on_step(row) is called after every step (progress display); warm: (source, another run's
    `PredictiveSampler.warm_state`) a PPM arm starts from, with its neighbourhood, as a
    `--ppm-from` run's scheduler does."""
    a = a or ArmArgs()
    torch.set_num_threads(a.threads)
    cfg = Config(**{**cfg.__dict__, "seed": seed})
    state = TrainState(cfg, policy=policy_from_bytes(blob))
    state.start_rl()
    sampler = build_sampler(cfg, pool, state.policy, name=sampler_name, ppm_args=a.ppm)
    res = ArmResult(sampler_name, seed, [], start_policy=policy_fingerprint(blob))
    res.prefill_ratio = measure_prefill_ratio(
        state.policy(), [p.text for p in pool[: tuned_args().candidate_pool]],
        min(cfg.rl.max_new_tokens, 16),
    )[1]  # fmt: skip
    ppm = getattr(sampler, "ppm", None)
    if warm is not None:
        if ppm is None:
            raise ValueError(f"sampler {sampler_name!r} has no PPM to warm-start")
        sampler.start_from(warm[1], neighbours=True)
        res.warm_start = {"source": warm[0], "observations": len(ppm.s), "fits": ppm.version,
                          "prior_strength": sampler.prior_strength()}  # fmt: skip
    ev, _ = evaluate_heldout(state.policy(), eval_set, 0, cfg, seed)
    res.rows.append({"step": 0, "rollouts": 0, "wasted": 0, "trained_rollouts": 0} | ev)
    trained, steps, rolled = 0, cfg.rl.steps, Compute()
    for step in range(steps):
        batch = collect(state.policy(), sampler, cfg.rl, step, state.sample_gen, env=cfg.env)
        rolled.add(batch.compute.prefilled, batch.compute.decoded)
        scored = getattr(sampler, "compute", None) or Compute()  # samplers reading no policy
        res.score_records += len(getattr(sampler, "last_records", []))
        t0 = time.perf_counter()
        m = rl_update(state, batch.experience)
        t_update = time.perf_counter() - t0
        policy_moved(sampler)
        exp, G = batch.experience, cfg.rl.group_size
        trained += len(exp)
        row = {
            "step": step + 1,
            "rollouts": sampler.rollouts,
            "wasted": sampler.wasted_rollouts,
            "trained_rollouts": trained,
            "reward": float(np.mean(exp.rewards)) if len(exp) else float("nan"),
            "trained_zero_var_share": m["zero_variance_groups"] / max(1, len(exp) // G),
            "t_select": batch.t_select,
            "screened": getattr(sampler, "screened", 0),  # candidates scored (PPM sampler)
            "t_sample": batch.t_sample,
            "t_update": t_update,
            "n_trained": len(batch.prompts),
            # cumulative tokens (selection/compute.py): the rollouts', and scoring's
            "rollout_decoded": rolled.decoded,
            "rollout_prefilled": rolled.prefilled,
            "select_decoded": scored.decoded,
            "select_prefilled": scored.prefilled,
        }
        last = step + 1 == steps
        if (step + 1) % a.eval_every == 0 or last:
            row |= _evaluate_step(
                state.policy(), sampler, eval_set, cfg, a, step + 1, seed, last, res
            )
        res.rows.append(row)
        if on_step is not None:
            on_step(row)
    res.policy = state.policy() if keep_policy else None
    res.ppm_state = sampler.warm_state() if ppm is not None else None
    return res


def _evaluate_step(policy, sampler, eval_set, cfg: Config, a: ArmArgs, step, seed, last, res):
    """Held-out figures after `step` updates; for the PPM arm, its predictions made before
    these samples exist (calibration pairs) and, at the last step, the allocation inputs."""
    k = a.final_eval_samples if last else cfg.eval.samples
    k = k if last or step % a.pass1_every == 0 else 0
    ppm, pred = getattr(sampler, "ppm", None), None
    if ppm is not None and k:
        with threads(1):
            pred = ppm.predict(eval_set)
    ev, rates = evaluate_heldout(policy, eval_set, k, cfg, seed + step - 1)
    if pred is not None:
        res.calibration += [(float(p), float(r) * k, k) for p, r in zip(pred, rates, strict=True)]
        if last:
            with threads(1):
                int8 = ppm.predict(eval_set, int8=True)
            res.allocation = {
                "pred": pred.tolist(),
                "pred_int8": int8.tolist(),
                "observed": rates.tolist(),
                "k": k,
                # the predictions' worth in rollouts, per prompt (its family's, prior 'fit')
                "strength": sampler.prompt_strengths(eval_set).tolist(),
                "task": [p.task for p in eval_set],
            }
    return ev
