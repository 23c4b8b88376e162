"""Prompt selection behind one interface; the loop asks for a batch and reports rewards back.

Only `uniform` lives here for now; DAPO, GRESO, MoPPS and the PPM selector plug in via SAMPLERS.
"""

from __future__ import annotations

import random
from typing import Protocol

from rlstream.trainers.envs import Prompt


class PromptSampler(Protocol):
    def select(self, step: int, batch_size: int) -> list[Prompt]:
        """The prompts to roll out at this step."""
        ...

    def update(self, prompts: list[Prompt], rewards: list[list[float]]) -> None:
        """Rewards of each selected prompt's G completions, after scoring."""
        ...

    def state_dict(self) -> dict: ...
    def load_state_dict(self, state: dict) -> None: ...


class UniformSampler:
    """Uniformly at random (with replacement) from a fixed pool of train prompts."""

    def __init__(self, pool: list[Prompt], seed: int = 0):
        if not pool:
            raise ValueError("the prompt pool is empty")
        self.pool, self.rng = pool, random.Random(seed)
        self.seen = 0

    def select(self, step: int, batch_size: int) -> list[Prompt]:
        return [self.pool[self.rng.randrange(len(self.pool))] for _ in range(batch_size)]

    def update(self, prompts: list[Prompt], rewards: list[list[float]]) -> None:
        self.seen += len(prompts)

    def state_dict(self) -> dict:
        return {"rng": self.rng.getstate(), "seen": self.seen}

    def load_state_dict(self, state: dict) -> None:
        self.rng.setstate(state["rng"])
        self.seen = state["seen"]


SAMPLERS = {"uniform": UniformSampler}


def make_sampler(name: str, pool: list[Prompt], seed: int) -> PromptSampler:
    if name not in SAMPLERS:
        raise ValueError(f"unknown sampler {name!r}; known: {sorted(SAMPLERS)}")
    return SAMPLERS[name](pool, seed)
