"""The PPM-predictive sampler (GPS-style): predicted intermediate difficulty + diversity + a floor.

Per step:
1. a minimum uniform share of the batch is drawn uniformly from the whole pool (expected share
   exactly `uniform_share`), so no region starves even when its estimate collapsed;
2. a candidate pool is drawn; the PPM predicts each candidate's pass rate mu; a Beta posterior
   per candidate combines that prediction as a prior worth `prior_strength` rollouts with the
   prompt's own decayed outcomes, and one Thompson sample theta is drawn from it (uncertain
   prompts get explored, confident ones exploited);
3. informativeness v = 4 theta (1 - theta) (1 at 0.5, 0 at 0 or 1); candidates with
   v >= ppm_threshold are preferred, the rest only fill a shortfall;
4. greedy max-marginal-relevance picks: score = (1 - w) v + w d, with d the cosine distance
   (halved, in [0, 1]) to the nearest prompt already picked this step, w = diversity_weight.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

import numpy as np

from rlstream.trainers.envs import Prompt
from rlstream.trainers.selection.base import GroupOutcome, PoolSampler
from rlstream.trainers.selection.mopps import beta_mean_std
from rlstream.trainers.selection.ppm import PPMArgs, PromptPredictiveModel
from rlstream.trainers.selection.records import Selection, make_record
from rlstream.trainers.selection.registry import register_sampler


class Predictor(Protocol):
    """What the sampler needs from a PPM (PromptPredictiveModel satisfies it)."""

    version: int

    def predict(self, prompts: list[Prompt]) -> np.ndarray: ...
    def embed(self, prompts: list[Prompt]) -> np.ndarray: ...
    def observe(self, prompts: list[Prompt], successes, attempts) -> None: ...
    def fit(self, steps: int | None = None) -> float: ...
    def state_dict(self) -> dict: ...
    def load_state_dict(self, state: dict) -> None: ...


def informativeness(theta: np.ndarray) -> np.ndarray:
    """4 p (1 - p): the Bernoulli reward variance scaled to [0, 1] (1 at p = 0.5).

    >>> informativeness(np.array([0.5, 0.0, 0.25])).tolist()
    [1.0, 0.0, 0.75]
    """
    return 4.0 * theta * (1.0 - theta)


def mmr_select(
    value: np.ndarray,
    emb: np.ndarray,
    k: int,
    diversity_weight: float,
    eligible: np.ndarray | None = None,
) -> tuple[list[int], list[bool]]:
    """Greedy max-marginal-relevance: k picks maximising (1-w) value + w distance-to-picked.

    value: (C,) in [0, 1]; emb: (C, D) (normalised inside); eligible: (C,) bool, picked first.
    Returns the picked indices in order and, per pick, whether it came from the eligible set.
    """
    c = len(value)
    e = emb / np.maximum(np.linalg.norm(emb, axis=1, keepdims=True), 1e-8)
    dist = np.ones(c)  # distance to the nearest pick so far, (1 - cos) / 2 in [0, 1]
    free = np.ones(c, dtype=bool)
    elig = np.ones(c, dtype=bool) if eligible is None else eligible.astype(bool)
    picks, from_elig = [], []
    for _ in range(min(k, c)):
        pool = free & elig if (free & elig).any() else free
        score = np.where(pool, (1 - diversity_weight) * value + diversity_weight * dist, -np.inf)
        j = int(np.argmax(score))
        picks.append(j)
        from_elig.append(bool(elig[j]))
        free[j] = False
        dist = np.minimum(dist, (1 - e @ e[j]) / 2)
    return picks, from_elig


@dataclass
class PredictiveArgs:
    candidate_pool: int = 256
    """candidates scored per step (capped at the pool size; at least the batch size)"""
    ppm_threshold: float = 0.7
    """minimum informativeness 4p(1-p) to be preferred (0.7: p in [0.23, 0.77])"""
    diversity_weight: float = 0.3
    """weight of the distance-to-picked term in the greedy selection"""
    uniform_share: float = 0.1
    """expected share of each batch drawn uniformly from the whole pool"""
    prior_strength: float = 4.0
    """rollouts the PPM prediction is worth as a Beta prior for a prompt"""
    decay: float = 0.9
    """per-update decay of a prompt's own outcome counts (the policy moves on)"""
    fit_steps: int = 20
    """PPM gradient steps per fit"""
    fit_every: int = 1
    """fit the PPM after every fit_every-th update (the fit dominates this sampler's overhead)"""

    def __post_init__(self):
        if not 0 <= self.ppm_threshold <= 1:
            raise ValueError(f"ppm_threshold is on 4p(1-p), in [0, 1]; got {self.ppm_threshold}")
        if not 0 <= self.diversity_weight <= 1 or not 0 <= self.uniform_share <= 1:
            raise ValueError("diversity_weight and uniform_share are weights in [0, 1]")
        if self.prior_strength <= 0:
            raise ValueError("prior_strength must be > 0 (a Beta prior needs positive mass)")
        if self.fit_every < 1:
            raise ValueError(f"fit_every counts updates and must be >= 1, got {self.fit_every}")
        if self.candidate_pool < 1 or not 0 <= self.decay <= 1:
            raise ValueError("candidate_pool must be >= 1 and decay in [0, 1]")


@register_sampler("ppm")
class PredictiveSampler(PoolSampler):
    """GPS-style selection driven by a prompt predictive model."""

    def __init__(
        self,
        pool: list[Prompt],
        seed: int = 0,
        args: PredictiveArgs | None = None,
        ppm: Predictor | None = None,
        embeddings: np.ndarray | None = None,
    ):
        super().__init__(pool, seed)
        self.args = args or PredictiveArgs()
        self.ppm = ppm or PromptPredictiveModel(PPMArgs(seed=seed))
        if embeddings is not None and len(embeddings) != len(pool):
            raise ValueError(f"{len(embeddings)} embeddings for a pool of {len(pool)} prompts")
        self.embeddings = embeddings
        self.own_s = np.zeros(len(self.stats))  # decayed successes per prompt
        self.own_f = np.zeros(len(self.stats))  # decayed failures

    def embed(self, pos: np.ndarray) -> np.ndarray:
        if self.embeddings is not None:
            return self.embeddings[pos]
        return self.ppm.embed([self.pool[i] for i in pos])

    def posterior(self, pos: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Beta(alpha, beta) per candidate: PPM prior worth prior_strength + own decayed counts."""
        mu = np.clip(self.ppm.predict([self.pool[i] for i in pos]), 1e-3, 1 - 1e-3)
        sidx, k = self.stats.of_pool[pos], self.args.prior_strength
        return k * mu + self.own_s[sidx], k * (1 - mu) + self.own_f[sidx]

    def select_scored(self, step: int, batch_size: int) -> Selection:
        a = self.args
        u = a.uniform_share * batch_size
        n_uni = int(u) + int(self.rng.random() < u - int(u))
        n_pred = batch_size - n_uni
        recs, chosen = [], []
        if n_pred > 0:
            size = min(len(self.pool), max(a.candidate_pool, n_pred))
            pos = self.draw(size, replace=False)
            alpha, beta = self.posterior(pos)
            theta = self.rng.beta(alpha, beta)
            value = informativeness(theta)
            picks, elig = mmr_select(
                value, self.embed(pos), n_pred, a.diversity_weight, value >= a.ppm_threshold
            )
            mean, std = beta_mean_std(alpha, beta)
            reason = {
                j: "informative" if e else "below_threshold_fill"
                for j, e in zip(picks, elig, strict=True)
            }
            for j, p in enumerate(pos):
                recs.append(
                    make_record(
                        self.pool[p],
                        mean[j],
                        std[j],
                        self.name,
                        j in reason,
                        reason.get(j, "not_picked"),
                        self.ppm.version,
                    )
                )
            chosen += [self.pool[pos[j]] for j in picks]
            if len(picks) < n_pred:  # tiny pool: fill the rest uniformly
                n_uni += n_pred - len(picks)
        if n_uni:
            upos = self.draw(n_uni)
            alpha, beta = self.posterior(upos)
            mean, std = beta_mean_std(alpha, beta)
            for j, p in enumerate(upos):
                chosen.append(self.pool[p])
                recs.append(
                    make_record(
                        self.pool[p],
                        mean[j],
                        std[j],
                        self.name,
                        True,
                        "uniform_share",
                        self.ppm.version,
                    )
                )
        return Selection(chosen, recs)

    def observe(self, prompts: list[Prompt], idx: np.ndarray, outcomes: list[GroupOutcome]):
        d = self.args.decay
        touched = np.unique(idx)
        self.own_s[touched] *= d
        self.own_f[touched] *= d
        for i, o in zip(idx, outcomes, strict=True):
            self.own_s[i] += o.successes
            self.own_f[i] += o.attempts - o.successes
        self.ppm.observe(prompts, [o.successes for o in outcomes], [o.attempts for o in outcomes])
        if self.stats.version % self.args.fit_every == 0:
            self.ppm.fit(self.args.fit_steps)

    def extra_state(self) -> dict:
        return {
            "own_s": self.own_s.copy(),
            "own_f": self.own_f.copy(),
            "ppm": self.ppm.state_dict(),
        }

    def load_extra_state(self, state: dict) -> None:
        self.own_s[:], self.own_f[:] = state["own_s"], state["own_f"]
        self.ppm.load_state_dict(state["ppm"])
