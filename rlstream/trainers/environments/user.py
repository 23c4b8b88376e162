"""A simulated user: it holds a secret number the policy must ask its way to, one guess a turn,
and answers each wrong guess with a hint (the `guess` task family's prompts).

Its behaviour comes from `env.options`:
  patience   turns the user answers before it leaves (the episode ends, reward 0); default:
             env.max_turns
  noise      the chance that a hint points the wrong way (0 by default)
  reveal     "direction" (higher / lower, the default) or "distance" (higher by 3)
  turn_cost  taken off the reward for each turn after the first (0 by default)
A line that is not a number is answered `a number please`. The right guess ends the episode
with reward 1 less the turn costs.
"""

from __future__ import annotations

import random

from rlstream.config import EnvConfig
from rlstream.trainers.environments.base import Step
from rlstream.trainers.envs.tools import HIGHER, LOWER, hint


class SimulatedUser:
    def __init__(self, settings: EnvConfig):
        self.patience = int(settings.option("patience", settings.max_turns))
        self.noise = float(settings.option("noise", 0.0))
        self.distance = settings.option("reveal", "direction") == "distance"
        self.turn_cost = float(settings.option("turn_cost", 0.0))
        self.secret, self.turns, self.rng = 0, 0, random.Random()

    async def reset(self, prompt) -> str:
        self.secret, self.turns = int(prompt.answer), 0
        self.rng = random.Random(f"{prompt.prompt_id}:{id(self)}")
        return ""

    async def step(self, action: str) -> Step:
        self.turns += 1
        text = action.strip()
        guess = int(text) if text.isdigit() else None
        if guess == self.secret:
            return Step("", max(0.0, 1.0 - self.turn_cost * (self.turns - 1)), True)
        if self.turns >= self.patience:
            return Step("", 0.0, True, {"left": True})
        if guess is None:
            return Step("a number please\n", 0.0, False)
        said = hint(self.secret, guess, self.distance)
        if self.rng.random() < self.noise:  # a careless user points the wrong way
            said = said.replace(HIGHER, "\0").replace(LOWER, HIGHER).replace("\0", LOWER)
        return Step(said + "\n", 0.0, False)

    async def close(self) -> None:
        pass
