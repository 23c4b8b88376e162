"""Synthetic pools and a fixed predictor for the selection tests (no policy, no rollouts)."""

from __future__ import annotations

import numpy as np

from rlstream.trainers.envs.base import Prompt, make_prompt


def synthetic_pool(n: int, task: str = "syn") -> list[Prompt]:
    """n distinct prompts 'q0?', 'q1?', ..."""
    return [make_prompt(task, f"q{i}?", str(i), 1) for i in range(n)]


def clustered_embeddings(
    n_clusters: int, per_cluster: int, dim: int = 16, noise: float = 0.05, seed: int = 0
) -> tuple[np.ndarray, np.ndarray]:
    """(N, dim) embeddings around orthogonal cluster centres and the (N,) cluster labels."""
    rng = np.random.default_rng(seed)
    centres = np.eye(dim)[:n_clusters]
    labels = np.repeat(np.arange(n_clusters), per_cluster)
    return centres[labels] + noise * rng.standard_normal((len(labels), dim)), labels


def bernoulli_rewards(pass_rates: list[float], group_size: int, rng: np.random.Generator):
    """One group of 0/1 rewards per pass rate."""
    return [(rng.random(group_size) < p).astype(float).tolist() for p in pass_rates]


class FixedPredictor:
    """A 'PPM' with known predictions: prompt_id -> pass rate; embeddings looked up by id."""

    def __init__(self, rates: dict[str, float], emb: dict[str, np.ndarray] | None = None):
        self.rates, self.emb, self.version = rates, emb or {}, 1
        self.observed = 0

    def predict(self, prompts):
        return np.array([self.rates[p.prompt_id] for p in prompts])

    def embed(self, prompts):
        return np.stack([self.emb[p.prompt_id] for p in prompts])

    def observe(self, prompts, successes, attempts):
        self.observed += len(prompts)

    def fit(self, steps=None):
        return 0.0

    def state_dict(self):
        return {"observed": self.observed}

    def load_state_dict(self, s):
        self.observed = s["observed"]
