"""MoPPS (arXiv 2507.04632): per-prompt Beta posteriors, decayed to the prior, Thompson-sampled.

After each rollout of a prompt: alpha <- lambda*alpha + (1-lambda)*alpha0 + successes and
beta <- lambda*beta + (1-lambda)*beta0 + failures. To select, draw a candidate pool several
times larger than the batch, sample a pass rate from each candidate's posterior, and keep the
B candidates whose sample is closest to the target (0.5). Cannot generalise across prompts.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from rlstream.registry import register_sampler
from rlstream.trainers.envs import Prompt
from rlstream.trainers.selection.base import GroupOutcome, PoolSampler
from rlstream.trainers.selection.records import Selection, make_record


def beta_decay_update(
    alpha: np.ndarray,
    beta: np.ndarray,
    successes: np.ndarray,
    failures: np.ndarray,
    decay: float,
    alpha0: float,
    beta0: float,
) -> tuple[np.ndarray, np.ndarray]:
    """MoPPS posterior update, elementwise over prompts (all arrays shape (N,)).

    >>> beta_decay_update(np.array([3.0]), np.array([2.0]), np.array([2.0]), np.array([1.0]),
    ...                   0.5, 1.0, 1.0)
    (array([4.]), array([2.5]))
    """
    a = decay * alpha + (1 - decay) * alpha0 + successes
    b = decay * beta + (1 - decay) * beta0 + failures
    return a, b


def beta_mean_std(alpha: np.ndarray, beta: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Mean and standard deviation of Beta(alpha, beta), elementwise."""
    n = alpha + beta
    return alpha / n, np.sqrt(alpha * beta / (n * n * (n + 1)))


def closest_to_target(samples: np.ndarray, k: int, target: float = 0.5) -> np.ndarray:
    """Indices of the k samples closest to target, closest first (stable on ties)."""
    return np.argsort(np.abs(samples - target), kind="stable")[:k]


@dataclass
class MoppsArgs:
    alpha0: float = 1.0
    """prior alpha (pseudo-successes)"""
    beta0: float = 1.0
    """prior beta (pseudo-failures)"""
    decay: float = 0.9
    """lambda: weight of the old posterior; 1 - lambda pulls it back to the prior"""
    candidate_factor: int = 4
    """candidate pool = candidate_factor * batch size (MoPPS: several times B)"""
    target: float = 0.5
    """pass rate whose prompts are preferred"""

    def __post_init__(self):
        if self.alpha0 <= 0 or self.beta0 <= 0:
            raise ValueError("alpha0 and beta0 must be > 0 for a proper Beta prior")
        if not 0 <= self.decay <= 1:
            raise ValueError(f"decay is a weight in [0, 1], got {self.decay}")
        if self.candidate_factor < 1:
            raise ValueError("candidate_factor must be >= 1 (the pool is a multiple of B)")


@register_sampler("mopps")
class MoppsSampler(PoolSampler):
    """Thompson sampling over decayed per-prompt Beta posteriors; the B closest to 0.5 win."""

    def __init__(self, pool: list[Prompt], seed: int = 0, args: MoppsArgs | None = None):
        super().__init__(pool, seed)
        self.args = a = args or MoppsArgs()
        self.alpha = np.full(len(self.stats), a.alpha0)
        self.beta = np.full(len(self.stats), a.beta0)

    def select_scored(self, step: int, batch_size: int) -> Selection:
        a = self.args
        pos = self.draw(min(len(self.pool), a.candidate_factor * batch_size), replace=False)
        if len(pos) < batch_size:  # tiny pool: allow repeats rather than fail
            pos = np.concatenate([pos, self.draw(batch_size - len(pos))])
        sidx = self.stats.of_pool[pos]
        theta = self.rng.beta(self.alpha[sidx], self.beta[sidx])
        keep = closest_to_target(theta, batch_size, a.target)
        mean, std = beta_mean_std(self.alpha[sidx], self.beta[sidx])
        chosen = np.zeros(len(pos), dtype=bool)
        chosen[keep] = True
        recs = [
            make_record(
                self.pool[p],
                mean[j],
                std[j],
                self.name,
                chosen[j],
                "closest_to_target" if chosen[j] else "far_from_target",
            )
            for j, p in enumerate(pos)
        ]
        return Selection([self.pool[pos[j]] for j in keep], recs)

    def observe(self, prompts: list[Prompt], idx: np.ndarray, outcomes: list[GroupOutcome]):
        a = self.args
        for i, o in zip(idx, outcomes, strict=True):  # a prompt twice in a batch: two updates
            s, f = np.array([o.successes]), np.array([o.attempts - o.successes])
            na, nb = beta_decay_update(
                self.alpha[[i]], self.beta[[i]], s, f, a.decay, a.alpha0, a.beta0
            )
            self.alpha[i], self.beta[i] = na[0], nb[0]

    def on_extend(self, prompts: list[Prompt], new_stats: int) -> None:
        a = self.args
        self.alpha = np.concatenate([self.alpha, np.full(new_stats, a.alpha0)])
        self.beta = np.concatenate([self.beta, np.full(new_stats, a.beta0)])

    def extra_state(self) -> dict:
        return {"alpha": self.alpha.copy(), "beta": self.beta.copy()}

    def load_extra_state(self, state: dict) -> None:
        self.alpha[:], self.beta[:] = state["alpha"], state["beta"]
