"""The world: an environment whose dynamics are a model of a small world, with difficulty
settings (the `walk` task family's prompts; its rules in `trainers/envs/walk.py`).

Each step applies a policy line `+` or `-` to the walker and answers where it landed; reaching
the goal ends the episode with reward 1. The dynamics follow the prompt's difficulty (a move
slips the other way with probability 0, 0.15, 0.15 at difficulty 1, 2, 3), so a curriculum
over difficulties (`selection.curriculum`) makes the world harder as the policy improves.
`env.options`: `slip` overrides the slip probability for every prompt; `seed` fixes the
dynamics' randomness (default: a fresh draw per episode). Served on another machine with
`rlstream env serve world`, it is the design notes' world-model service.
"""

from __future__ import annotations

import random

from rlstream.config import EnvConfig
from rlstream.trainers.environments.base import Step
from rlstream.trainers.envs.walk import SLIP, ends, move


class World:
    def __init__(self, settings: EnvConfig):
        self.slip_option = settings.option("slip")
        self.seed = settings.option("seed")
        self.position = self.goal = 0
        self.slip, self.rng = 0.0, random.Random()

    async def reset(self, prompt) -> str:
        self.position, self.goal = ends(prompt)
        self.slip = float(SLIP.get(prompt.difficulty, 0.0) if self.slip_option is None
                          else self.slip_option)  # fmt: skip
        self.rng = random.Random(f"{self.seed}:{prompt.prompt_id}" if self.seed is not None
                                 else None)  # fmt: skip
        return ""

    async def step(self, action: str) -> Step:
        slipped = self.rng.random() < self.slip
        self.position = move(self.position, action, slipped)
        if self.position == self.goal:
            return Step("", 1.0, True, {"slipped": slipped})
        return Step(f"{self.position}\n", 0.0, False, {"slipped": slipped})

    async def close(self) -> None:
        pass
