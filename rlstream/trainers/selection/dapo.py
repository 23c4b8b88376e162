"""DAPO dynamic sampling (arXiv 2503.14476): roll out, drop zero-variance groups, refill.

The filter is a pure function (`dapo_filter`). `DynamicSamplingSampler` is the stateful side:
`select` returns the next round of candidates (a fresh batch at the first call of a step),
`update` filters that round's groups into the pending batch, `needs_more` says whether another
round is due, and `take_batch` hands the filled batch to the learner. `fill_batch` drives the
whole exchange given a rollout callable, which is how a loop should use it:

    batch = fill_batch(sampler, rollout, batch_size)   # rollout(prompts) -> rewards per group
    learner.step(... groups batch.positions ...)

Every rollout of a discarded group is counted (`wasted_rollouts`): that is DAPO's price.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from rlstream.registry import register_sampler
from rlstream.trainers.envs import Prompt
from rlstream.trainers.selection.base import GroupOutcome, PoolSampler
from rlstream.trainers.selection.records import Selection, make_record


def is_zero_variance(rewards: list[float], eps: float = 1e-6) -> bool:
    """Whether all G rewards are equal (within eps): the group's GRPO advantages are all zero."""
    return max(rewards) - min(rewards) <= eps


def dapo_filter(groups_rewards: list[list[float]], capacity: int, eps: float = 1e-6) -> list[int]:
    """Indices of the groups to admit: non-zero variance, in order, at most `capacity`.

    groups_rewards: one list of G rewards per prompt. Zero-variance groups are never admitted.

    >>> dapo_filter([[1, 1], [0, 1], [0, 0], [1, 0]], capacity=5)
    [1, 3]
    >>> dapo_filter([[1, 0], [0, 1]], capacity=1)
    [0]
    """
    keep = [i for i, r in enumerate(groups_rewards) if not is_zero_variance(r, eps)]
    return keep[: max(0, capacity)]


@dataclass
class DapoBatch:
    """A filled (or capped) DAPO batch and what it cost."""

    prompts: list[Prompt] = field(default_factory=list)
    """admitted prompts, in admission order"""
    rewards: list[list[float]] = field(default_factory=list)
    """their G rewards"""
    positions: list[tuple[int, int]] = field(default_factory=list)
    """(round, index within that round's candidates) of each admitted group"""
    rounds: int = 0
    """generation rounds used"""
    generated_groups: int = 0
    """groups rolled out in all rounds"""
    discarded_groups: int = 0
    """zero-variance groups dropped"""
    overflow_groups: int = 0
    """non-zero-variance groups dropped because the batch was already full"""
    full: bool = False
    """whether the batch reached its size before the round cap"""


@dataclass
class DapoArgs:
    max_rounds: int = 8
    """cap on generation rounds per batch (DAPO's max_num_gen_batches)"""
    oversample: float = 1.0
    """candidates drawn per missing group in the first round"""
    max_round_factor: float = 4.0
    """no round draws more than max_round_factor * batch_size candidates"""
    eps: float = 1e-6
    """rewards closer than eps count as equal"""

    def __post_init__(self):
        if self.max_rounds < 1:
            raise ValueError("max_rounds must be >= 1: at least one generation round is needed")
        if self.oversample < 1 or self.max_round_factor < 1:
            raise ValueError(
                "oversample and max_round_factor must be >= 1 (fewer candidates "
                "than missing groups can never fill the batch)"
            )


@register_sampler("dapo")
class DynamicSamplingSampler(PoolSampler):
    """Uniform candidates, rolled out, zero-variance groups dropped, refilled up to a round cap."""

    def __init__(self, pool: list[Prompt], seed: int = 0, args: DapoArgs | None = None):
        super().__init__(pool, seed)
        self.args = args or DapoArgs()
        self.pending: DapoBatch | None = None
        self.batch_size = 0
        self.keep_rate = 1.0  # running share of admitted groups, sizes later rounds

    def round_size(self) -> int:
        """Candidates for the next round: missing groups / expected keep rate, capped."""
        a, b = self.args, self.pending
        missing = self.batch_size - len(b.prompts)
        factor = a.oversample if b.rounds == 0 else 1 / max(self.keep_rate, 0.05)
        return min(math.ceil(missing * factor), math.ceil(a.max_round_factor * self.batch_size))

    def select_scored(self, step: int, batch_size: int) -> Selection:
        if self.pending is None or not self.needs_more:
            self.pending, self.batch_size = DapoBatch(), batch_size
        pos = self.draw(self.round_size())
        prompts = [self.pool[i] for i in pos]
        rate = self.empirical_rate(self.stats.of_pool[pos])
        recs = [
            make_record(p, r, None, self.name, True, f"dapo_round_{self.pending.rounds}")
            for p, r in zip(prompts, rate, strict=True)
        ]
        return Selection(prompts, recs)

    def observe(self, prompts: list[Prompt], idx: np.ndarray, outcomes: list[GroupOutcome]):
        pass  # filtering needs the raw rewards: see update

    def update(self, prompts: list[Prompt], rewards: list[list[float]]) -> None:
        """Count the round's rollouts, admit its non-zero-variance groups into the pending batch."""
        super().update(prompts, rewards)
        if self.pending is None:
            raise RuntimeError("update() before select(): DAPO filters the round it handed out")
        b, r = self.pending, self.pending.rounds
        keep = dapo_filter(rewards, self.batch_size - len(b.prompts), self.args.eps)
        zero = sum(is_zero_variance(g, self.args.eps) for g in rewards)
        b.prompts += [prompts[i] for i in keep]
        b.rewards += [list(rewards[i]) for i in keep]
        b.positions += [(r, i) for i in keep]
        b.rounds += 1
        b.generated_groups += len(rewards)
        b.discarded_groups += zero
        b.overflow_groups += len(rewards) - zero - len(keep)
        b.full = len(b.prompts) >= self.batch_size
        self.keep_rate = 0.5 * self.keep_rate + 0.5 * (len(rewards) - zero) / len(rewards)

    @property
    def needs_more(self) -> bool:
        """Whether the pending batch is short and the round cap allows another round."""
        b = self.pending
        return b is not None and not b.full and b.rounds < self.args.max_rounds

    def take_batch(self) -> DapoBatch:
        """The pending batch (possibly short when the cap was hit); starts a new one next select."""
        if self.pending is None:
            raise RuntimeError("no batch: call select() and update() first")
        b, self.pending = self.pending, None
        return b

    def extra_state(self) -> dict:
        return {"pending": self.pending, "batch_size": self.batch_size, "keep": self.keep_rate}

    def load_extra_state(self, state: dict) -> None:
        self.pending, self.batch_size = state["pending"], state["batch_size"]
        self.keep_rate = state["keep"]


def fill_batch(
    sampler: DynamicSamplingSampler,
    rollout: Callable[[list[Prompt]], list[list[float]]],
    batch_size: int,
    step: int = 0,
) -> DapoBatch:
    """Run DAPO rounds until the batch is full or the round cap is reached.

    rollout: generates G completions per prompt and returns their rewards (one list per prompt);
    the loop keeps its own per-round samples and uses `batch.positions` to pick the admitted ones.
    """
    sampler.pending = None
    while True:
        prompts = sampler.select(step, batch_size)
        sampler.update(prompts, rollout(prompts))
        if not sampler.needs_more:
            return sampler.take_batch()
