"""GRESO (arXiv 2506.02177): skip prompts that were zero-variance for k consecutive rollouts.

A prompt whose last k groups were all correct (or all wrong) is skipped before rollout with
probability 1 - p^k. Two exploration probabilities are kept, p_easy for prompts that were last
all correct and p_hard for all wrong, each moved by `step` (0.01) within [p_min, p_max]
(0.05, 0.95) after every update: down (skip more) when that kind's share of zero-variance groups
in the step exceeds its target, up otherwise. Skipping costs nothing, so the sampler keeps
drawing until the batch is full. It cannot score prompts it has never rolled out.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from rlstream.registry import register_sampler
from rlstream.trainers.envs import Prompt
from rlstream.trainers.selection.base import GroupOutcome, PoolSampler
from rlstream.trainers.selection.records import Selection, make_record


def greso_skip_probability(streak: np.ndarray, p: np.ndarray | float) -> np.ndarray:
    """Skip probability 1 - p**k for consecutive zero-variance counts k (k = 0: never skipped).

    >>> greso_skip_probability(np.array([0, 1, 3]), 0.5).tolist()
    [0.0, 0.5, 0.875]
    """
    return 1.0 - np.power(p, np.asarray(streak, dtype=float))


def greso_adapt(
    p: float,
    observed_ratio: float,
    target_ratio: float,
    step: float = 0.01,
    p_min: float = 0.05,
    p_max: float = 0.95,
) -> float:
    """One adaptation of an exploration probability toward a target zero-variance ratio.

    Too many zero-variance groups -> explore less (p - step); otherwise p + step; clipped.

    >>> round(greso_adapt(0.5, 0.4, 0.125), 2), round(greso_adapt(0.5, 0.0, 0.125), 2)
    (0.49, 0.51)
    """
    p = p - step if observed_ratio > target_ratio else p + step
    return float(min(p_max, max(p_min, p)))


@dataclass
class GresoArgs:
    p_init: float = 0.5
    """initial exploration probability (both kinds)"""
    target_zero_var: float = 0.25
    """target share of zero-variance groups per step"""
    easy_share: float = 0.5
    """part of the target given to all-correct groups (the rest to all-wrong)"""
    step: float = 0.01
    """adaptation step of p"""
    p_min: float = 0.05
    """lower bound of p"""
    p_max: float = 0.95
    """upper bound of p"""
    candidate_factor: int = 4
    """candidates drawn per missing prompt in each drawing round"""
    max_draw_rounds: int = 16
    """drawing rounds before the rest of the batch is filled uniformly"""

    def __post_init__(self):
        if not 0 < self.p_min <= self.p_init <= self.p_max < 1:
            raise ValueError(
                "need 0 < p_min <= p_init <= p_max < 1 (p is a probability and "
                f"p^k must decay), got {self.p_min}, {self.p_init}, {self.p_max}"
            )
        if not 0 <= self.target_zero_var <= 1 or not 0 <= self.easy_share <= 1:
            raise ValueError("target_zero_var and easy_share are shares in [0, 1]")
        if self.candidate_factor < 1 or self.max_draw_rounds < 1:
            raise ValueError("candidate_factor and max_draw_rounds must be >= 1")


@register_sampler("greso")
class GresoSampler(PoolSampler):
    """Pre-rollout skipping by consecutive zero-variance history, with adaptive p."""

    def __init__(self, pool: list[Prompt], seed: int = 0, args: GresoArgs | None = None):
        super().__init__(pool, seed)
        self.args = args or GresoArgs()
        self.p_easy = self.p_hard = self.args.p_init

    def skip_probability(self, stat_idx: np.ndarray) -> np.ndarray:
        """Per-candidate skip probability from its streak and kind (easy: p_easy, hard: p_hard)."""
        k, kind = self.stats.streak[stat_idx], self.stats.kind[stat_idx]
        p = np.where(kind > 0, self.p_easy, self.p_hard)
        return greso_skip_probability(k, p)

    def select_scored(self, step: int, batch_size: int) -> Selection:
        a, chosen, recs = self.args, [], []
        for _ in range(a.max_draw_rounds):
            missing = batch_size - len(chosen)
            if missing == 0:
                break
            pos = self.draw(missing * a.candidate_factor)
            sidx = self.stats.of_pool[pos]
            skip = self.skip_probability(sidx)
            keep = self.rng.random(len(pos)) >= skip
            rate = self.empirical_rate(sidx)
            for j in range(len(pos)):
                if len(chosen) == batch_size:
                    break  # the rest were never considered: no record, no decision
                p, take = self.pool[pos[j]], bool(keep[j])
                chosen += [p] if take else []
                reason = "greso_keep" if take else "greso_skip"
                recs.append(make_record(p, rate[j], None, self.name, take, reason))
        for i in self.draw(batch_size - len(chosen)):
            chosen.append(self.pool[i])
            recs.append(make_record(self.pool[i], 0.5, None, self.name, True, "greso_fill"))
        return Selection(chosen, recs)

    def observe(self, prompts: list[Prompt], idx: np.ndarray, outcomes: list[GroupOutcome]):
        a, n = self.args, len(outcomes)
        easy = sum(o.zero_variance and o.mean >= 0.5 for o in outcomes) / n
        hard = sum(o.zero_variance and o.mean < 0.5 for o in outcomes) / n
        t_easy = a.target_zero_var * a.easy_share
        t_hard = a.target_zero_var * (1 - a.easy_share)
        self.p_easy = greso_adapt(self.p_easy, easy, t_easy, a.step, a.p_min, a.p_max)
        self.p_hard = greso_adapt(self.p_hard, hard, t_hard, a.step, a.p_min, a.p_max)

    def extra_state(self) -> dict:
        return {"p_easy": self.p_easy, "p_hard": self.p_hard}

    def load_extra_state(self, state: dict) -> None:
        self.p_easy, self.p_hard = state["p_easy"], state["p_hard"]
