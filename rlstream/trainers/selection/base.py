"""What every selection sampler shares: per-prompt reward statistics and a seeded pool sampler.

`PoolSampler` implements the sampler interface every loop uses (`select`, `update`,
`state_dict`, `load_state_dict`) on top of two hooks a subclass fills in:
`select_scored(step, batch_size) -> Selection` and `observe(prompt_index, outcomes)`.
Randomness comes from one numpy Generator whose state is part of `state_dict`, so a sampler
restored from a checkpoint makes exactly the selections the uninterrupted one would have made.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from rlstream.registry import register_sampler
from rlstream.trainers.envs import Prompt
from rlstream.trainers.selection.records import Selection, make_record


@dataclass(frozen=True)
class GroupOutcome:
    """Summary of one prompt's G rewards."""

    successes: float
    """rollouts whose reward reached the success threshold"""
    attempts: int
    """G, the group size"""
    zero_variance: bool
    """all rewards equal: the group's advantages are all zero and it teaches nothing"""
    mean: float
    """mean reward"""


def group_outcome(rewards: list[float], success_at: float = 0.5, eps: float = 1e-6) -> GroupOutcome:
    """Summarise a group: successes = #(reward >= success_at), zero variance = max - min <= eps.

    >>> group_outcome([1.0, 1.0, 0.0]).successes, group_outcome([1.0, 1.0]).zero_variance
    (2.0, True)
    """
    if not rewards:
        raise ValueError("a group needs at least one reward")
    r = np.asarray(rewards, dtype=float)
    return GroupOutcome(
        float((r >= success_at).sum()), len(r), bool(r.max() - r.min() <= eps), float(r.mean())
    )


class PromptStats:
    """Per-unique-prompt counters over the whole run, indexed by prompt id.

    attempts/successes: totals; streak: consecutive zero-variance groups; kind: +1 when the last
    zero-variance group was all correct, -1 all wrong, 0 otherwise; last_version: the sampler's
    update count when the prompt was last rolled out (-1: never).
    """

    def __init__(self, pool: list[Prompt]):
        self.index: dict[str, int] = {}
        for p in pool:
            self.index.setdefault(p.prompt_id, len(self.index))
        self.of_pool = np.array([self.index[p.prompt_id] for p in pool], dtype=np.int64)
        n = len(self.index)
        self.attempts, self.successes = np.zeros(n), np.zeros(n)
        self.streak, self.kind = np.zeros(n, dtype=np.int64), np.zeros(n, dtype=np.int64)
        self.last_version = np.full(n, -1, dtype=np.int64)
        self.version = 0

    def __len__(self) -> int:
        return len(self.index)

    def extend(self, prompts: list[Prompt]) -> None:
        """Pool entries appended: new prompt ids get zeroed counters (never tried)."""
        for p in prompts:
            self.index.setdefault(p.prompt_id, len(self.index))
        added = [self.index[p.prompt_id] for p in prompts]
        self.of_pool = np.concatenate([self.of_pool, np.array(added, dtype=np.int64)])
        grow = len(self.index) - len(self.attempts)
        if grow:
            self.attempts = np.concatenate([self.attempts, np.zeros(grow)])
            self.successes = np.concatenate([self.successes, np.zeros(grow)])
            self.streak = np.concatenate([self.streak, np.zeros(grow, dtype=np.int64)])
            self.kind = np.concatenate([self.kind, np.zeros(grow, dtype=np.int64)])
            self.last_version = np.concatenate(
                [self.last_version, np.full(grow, -1, dtype=np.int64)]
            )

    def ids(self, prompts: list[Prompt]) -> np.ndarray:
        """Stat indices of prompts (KeyError for a prompt that is not in the pool)."""
        try:
            return np.array([self.index[p.prompt_id] for p in prompts], dtype=np.int64)
        except KeyError as e:
            raise KeyError(f"prompt {e} is not in this sampler's pool") from None

    def record(self, prompts: list[Prompt], outcomes: list[GroupOutcome]) -> np.ndarray:
        """Add one step's outcomes; returns the stat indices; bumps the version once."""
        idx = self.ids(prompts)
        for i, o in zip(idx, outcomes, strict=True):
            self.attempts[i] += o.attempts
            self.successes[i] += o.successes
            if o.zero_variance:
                self.streak[i] += 1
                self.kind[i] = 1 if o.mean >= 0.5 else -1
            else:
                self.streak[i], self.kind[i] = 0, 0
            self.last_version[i] = self.version
        self.version += 1
        return idx

    _FIELDS = ("attempts", "successes", "streak", "kind", "last_version")

    def state_dict(self) -> dict:
        return {f: getattr(self, f).copy() for f in self._FIELDS} | {"version": self.version}

    def load_state_dict(self, s: dict) -> None:
        """Restore counters; a pool that grew since the snapshot keeps zeros for the prompts
        added after it (they are appended, so the saved ones keep their indices)."""
        for f in self._FIELDS:
            getattr(self, f)[: len(s[f])] = s[f]
        self.version = s["version"]


class PoolSampler:
    """Base of the selection samplers: a fixed pool, its stats, one seeded numpy Generator."""

    name = "base"
    success_at = 0.5

    def __init__(self, pool: list[Prompt], seed: int = 0):
        if not pool:
            raise ValueError("the prompt pool is empty: give the sampler at least one prompt")
        self.pool = list(pool)
        self.stats = PromptStats(self.pool)
        self.rng = np.random.default_rng(seed)
        self.last_records: list = []
        self.rollouts = 0
        self.wasted_rollouts = 0

    # --- the sampler interface the loops use --------------------------------------------
    def select(self, step: int, batch_size: int) -> list[Prompt]:
        """The prompts to roll out; the decision records are kept in `last_records`."""
        if batch_size < 1:
            raise ValueError(f"batch_size must be >= 1, got {batch_size}")
        sel = self.select_scored(step, batch_size)
        self.last_records = sel.records
        return sel.prompts

    def update(self, prompts: list[Prompt], rewards: list[list[float]]) -> None:
        """Rewards of each rolled-out prompt's G completions."""
        if len(prompts) != len(rewards):
            raise ValueError(f"{len(prompts)} prompts but {len(rewards)} reward groups")
        outcomes = [group_outcome(r, self.success_at) for r in rewards]
        self.rollouts += sum(o.attempts for o in outcomes)
        self.wasted_rollouts += sum(o.attempts for o in outcomes if o.zero_variance)
        idx = self.stats.record(prompts, outcomes)
        self.observe(prompts, idx, outcomes)

    def state_dict(self) -> dict:
        base = {
            "rng": self.rng.bit_generator.state,
            "stats": self.stats.state_dict(),
            "rollouts": self.rollouts,
            "wasted": self.wasted_rollouts,
        }
        return base | self.extra_state()

    def load_state_dict(self, state: dict) -> None:
        self.rng.bit_generator.state = state["rng"]
        self.stats.load_state_dict(state["stats"])
        self.rollouts, self.wasted_rollouts = state["rollouts"], state["wasted"]
        self.load_extra_state(state)

    def extend(self, prompts: list[Prompt]) -> None:
        """Add prompts to the pool while the run goes on (the live loop follows rl.prompts.v1).
        They start untried; samplers with per-prompt state grow it in `on_extend`."""
        if not prompts:
            return
        before = len(self.stats)
        self.pool += prompts
        self.stats.extend(prompts)
        self.on_extend(prompts, len(self.stats) - before)

    # --- hooks ----------------------------------------------------------------------------
    def on_extend(self, prompts: list[Prompt], new_stats: int) -> None:
        """Subclass hook: `prompts` were appended to the pool, `new_stats` ids to the stats."""

    def select_scored(self, step: int, batch_size: int) -> Selection:
        raise NotImplementedError

    def observe(self, prompts: list[Prompt], idx: np.ndarray, outcomes: list[GroupOutcome]):
        """Subclass hook after the shared stats were updated (idx: stat indices)."""

    def extra_state(self) -> dict:
        return {}

    def load_extra_state(self, state: dict) -> None:
        pass

    # --- helpers --------------------------------------------------------------------------
    def draw(self, n: int, replace: bool = True) -> np.ndarray:
        """n pool positions uniformly at random (without replacement when asked and possible)."""
        if not replace and n <= len(self.pool):
            return self.rng.choice(len(self.pool), size=n, replace=False)
        return self.rng.integers(0, len(self.pool), size=n)

    def empirical_rate(self, stat_idx: np.ndarray) -> np.ndarray:
        """Laplace-smoothed observed pass rate (s + 1) / (n + 2) per stat index."""
        return (self.stats.successes[stat_idx] + 1) / (self.stats.attempts[stat_idx] + 2)


@register_sampler("uniform")
class UniformSelection(PoolSampler):
    """Uniformly at random with replacement: the baseline every other sampler is measured on."""

    def __init__(self, pool: list[Prompt], seed: int = 0, args=None):
        super().__init__(pool, seed)

    def select_scored(self, step: int, batch_size: int) -> Selection:
        pos = self.draw(batch_size)
        prompts = [self.pool[i] for i in pos]
        rate = self.empirical_rate(self.stats.of_pool[pos])
        recs = [
            make_record(p, r, None, self.name, True, "uniform")
            for p, r in zip(prompts, rate, strict=True)
        ]
        return Selection(prompts, recs)
