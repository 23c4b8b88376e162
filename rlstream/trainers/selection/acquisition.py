"""The predictive sampler's pure functions: how informative a group of G is expected to be at
a predicted pass rate, how likely outcomes are under a prediction of a given strength,
per-family quotas of a batch, and a diverse pick (maximal marginal relevance)."""

from __future__ import annotations

from typing import Protocol

import numpy as np
from scipy.special import betaln

from rlstream.trainers.envs import Prompt


class Predictor(Protocol):
    """What the sampler needs from a PPM (PromptPredictiveModel satisfies it)."""

    version: int

    def predict(self, prompts: list[Prompt]) -> np.ndarray: ...
    def embed(self, prompts: list[Prompt]) -> np.ndarray: ...
    def observe(self, prompts: list[Prompt], successes, attempts) -> None: ...
    def fit(self, steps: int | None = None) -> float: ...
    def state_dict(self) -> dict: ...
    def load_state_dict(self, state: dict) -> None: ...


def strength_loglik(pred, successes, attempts, strengths: np.ndarray) -> np.ndarray:
    """(prompts, strengths): log P(s of n | prediction mu, prior strength k) under a
    beta-binomial, log B(k mu + s, k (1 - mu) + n - s) - log B(k mu, k (1 - mu)), up to the
    binomial coefficient (which does not depend on k).

    >>> ll = strength_loglik([0.5], [2], [4], np.array([1.0, 100.0]))
    >>> bool(ll[0, 1] > ll[0, 0])  # 2 of 4 at a prediction of 0.5: a strong prior fits best
    True
    """
    mu = np.clip(np.asarray(pred, dtype=float), 1e-3, 1 - 1e-3)[:, None]
    s = np.asarray(successes, dtype=float)[:, None]
    n = np.asarray(attempts, dtype=float)[:, None]
    k = strengths[None, :]
    return betaln(k * mu + s, k * (1 - mu) + n - s) - betaln(k * mu, k * (1 - mu))


def informativeness(theta: np.ndarray, group_size: int) -> np.ndarray:
    """P(a group of `group_size` Bernoulli(theta) rewards is not all equal).

    >>> informativeness(np.array([0.5, 0.0, 1.0]), 2).tolist()
    [0.5, 0.0, 0.0]
    """
    return 1.0 - theta**group_size - (1.0 - theta) ** group_size


def expected_informativeness(
    alpha: np.ndarray, beta: np.ndarray, group_size: int, tilt: float = 0.0
) -> np.ndarray:
    """E[(1 - theta)^tilt x informativeness(theta)] under theta ~ Beta(alpha, beta), in closed
    form from the Beta moments E[theta^a (1 - theta)^b] = B(alpha + a, beta + b) / B(alpha, beta).

    With tilt 0 it is the posterior predictive probability that a group of `group_size` is
    not all equal (the beta-binomial's mass off 0 and G): an uncertain posterior puts mass on
    the extremes and scores lower than a confident one at the same mean.
    >>> round(float(expected_informativeness(np.array([1.0]), np.array([1.0]), 2)[0]), 4)
    0.3333
    """

    def moment(a: float, b: float) -> np.ndarray:
        return np.exp(betaln(alpha + a, beta + b) - betaln(alpha, beta))

    g = group_size
    return moment(0, tilt) - moment(g, tilt) - moment(0, g + tilt)


def stratum_quotas(mass: np.ndarray, available: np.ndarray, n: int, rng) -> np.ndarray:
    """Integer slots per stratum summing to min(n, available.sum()), proportional to `mass`
    (equal shares where every mass is 0), never above a stratum's `available` candidates.

    Randomised rounding: the fractional parts are drawn in proportion to their size.
    >>> stratum_quotas(np.array([3.0, 1.0]), np.array([10, 10]), 4, None).tolist()
    [3, 1]
    """
    quota = np.zeros(len(mass), dtype=np.int64)
    want = min(n, int(available.sum()))
    while quota.sum() < want:
        open_ = quota < available
        m = np.where(open_, np.maximum(mass, 0.0), 0.0)
        m = m if m.sum() > 0 else open_.astype(float)
        raw = (want - quota.sum()) * m / m.sum()
        add = np.minimum(np.floor(raw).astype(np.int64), available - quota)
        if add.sum() == 0:  # only fractions left: one slot, drawn in proportion to them
            frac = raw - np.floor(raw)
            p = frac if frac.sum() > 0 else m
            add[rng.choice(len(m), p=p / p.sum())] = 1
        quota += add
    return quota


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
