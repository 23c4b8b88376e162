"""Where the in-process loops get their experience: select prompts, roll out G completions
each, score them, report the rewards to the sampler.

`collect(policy, sampler, rl, step, generator)` -> `Batch`. The in-process loop
(`trainers/local.py`) and the selection benchmark (`trainers/selection/loop.py`) both call it;
the streaming loop gets the same thing from its topics. Three ways to fill a batch:
- a plain sampler: one round of `rl.prompts_per_step` prompts;
- DAPO's `DynamicSamplingSampler`: its own rounds through `fill_batch`;
- `rl.filter_zero_variance` with any other sampler: rounds until `prompts_per_step` groups
  with a learning signal are in, at most `rl.filter_max_rounds` rounds (the rest is filled with
  the last round's zero-variance groups, as the streaming trainer does).
Every rollout generated, discarded ones included, is counted in `Batch.rollouts`.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import torch

from rlstream.config import RLConfig
from rlstream.trainers.envs import Prompt
from rlstream.trainers.policy import Policy, rollout, score, to_experience
from rlstream.trainers.rl import Experience
from rlstream.trainers.selection.compute import Compute
from rlstream.trainers.selection.dapo import DynamicSamplingSampler, fill_batch, is_zero_variance


@dataclass
class Batch:
    experience: Experience
    prompts: list[Prompt] = field(default_factory=list)
    """one prompt per group, in experience order"""
    rewards: list[list[float]] = field(default_factory=list)
    """the G rewards of each group"""
    texts: list[str] = field(default_factory=list)
    """each row's completion"""
    correct: list[bool] = field(default_factory=list)
    """whether each row's verifier accepted it"""
    rollouts: int = 0
    """completions generated for this batch, discarded rounds included"""
    compute: Compute = field(default_factory=Compute)
    """the tokens those completions cost (prompts prefilled, completions decoded)"""
    t_select: float = 0.0
    """seconds in the sampler (select + update: PPM fits)"""
    t_sample: float = 0.0
    """seconds rolling out and verifying"""


class threads:
    """Run a block at n torch threads: the PPM's small fits are ~25x faster at 1 thread than
    at 2 on a shared 2-core box."""

    def __init__(self, n: int):
        self.n = n

    def __enter__(self):
        self.before = torch.get_num_threads()
        torch.set_num_threads(self.n)

    def __exit__(self, *exc):
        torch.set_num_threads(self.before)


@dataclass
class _Round:
    prompts: list[Prompt]
    experience: Experience
    rewards: list[list[float]]
    texts: list[str]
    correct: list[bool]
    compute: Compute


def _roll(policy: Policy, prompts, rl: RLConfig, version: int, gen, reward_fn, tag: str, env):
    s = rollout(policy, prompts, rl.group_size, rl.max_new_tokens, rl.temperature, gen, env)
    rewards, correct = score(prompts, s, reward_fn)
    exp = to_experience(prompts, s, rewards, version)
    if tag:
        exp.group_ids = [f"{tag}:{g}" for g in exp.group_ids]
    G = rl.group_size
    groups = [rewards[i * G : (i + 1) * G] for i in range(len(prompts))]
    compute = Compute()
    compute.add_samples(s)
    return _Round(prompts, exp, groups, s.texts, correct, compute)


def _assemble(picks: list[tuple[_Round, int]], rl: RLConfig, rollouts: int) -> Batch:
    """A batch of the chosen (round, group index) pairs."""
    G, out = rl.group_size, Batch(Experience([], [], [], [], [], []), rollouts=rollouts)
    for r, i in picks:
        rows = list(range(i * G, (i + 1) * G))
        out.experience = out.experience.concat(r.experience.select(rows))
        out.prompts.append(r.prompts[i])
        out.rewards.append(r.rewards[i])
        out.texts += [r.texts[j] for j in rows]
        out.correct += [r.correct[j] for j in rows]
    return out


def collect(
    policy: Policy, sampler, rl: RLConfig, step: int, gen, reward_fn=None, env=None
) -> Batch:
    """One batch of experience for update `step` (see the module docstring)."""
    B, version = rl.prompts_per_step, policy.version
    t_sample = 0.0
    t0 = time.perf_counter()
    rounds: list[_Round] = []

    def roll(prompts: list[Prompt]) -> list[list[float]]:
        nonlocal t_sample
        t = time.perf_counter()
        tag = f"r{len(rounds)}" if len(rounds) or dapo or rl.filter_zero_variance else ""
        rounds.append(_roll(policy, prompts, rl, version, gen, reward_fn, tag, env))
        t_sample += time.perf_counter() - t
        return rounds[-1].rewards

    dapo = isinstance(sampler, DynamicSamplingSampler)
    if dapo:
        batch = fill_batch(sampler, roll, B, step)
        picks = [(rounds[r], i) for r, i in batch.positions]
    else:
        picks, spare = [], []
        for _ in range(rl.filter_max_rounds if rl.filter_zero_variance else 1):
            prompts = sampler.select(step, B)
            rewards = roll(prompts)
            with threads(1):
                sampler.update(prompts, rewards)
            for i, g in enumerate(rewards):
                zero = rl.filter_zero_variance and is_zero_variance(g)
                (spare if zero else picks).append((rounds[-1], i))
            if len(picks) >= B:
                break
        picks = (picks + spare)[:B] if rl.filter_zero_variance else picks
    out = _assemble(picks, rl, sum(len(r.texts) for r in rounds))
    for r in rounds:
        out.compute.add(r.compute.prefilled, r.compute.decoded)
    out.t_sample, out.t_select = t_sample, time.perf_counter() - t0 - t_sample
    return out
