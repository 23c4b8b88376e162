"""Adapter: any reasoning-gym dataset as a task family (`rg:<name>`), imported lazily."""

from __future__ import annotations

import random
from dataclasses import dataclass, field

from rlstream.trainers.envs.base import Prompt, make_prompt


@dataclass
class ReasoningGymTask:
    """Prompts from `reasoning_gym.create_dataset(dataset)`; scored by the dataset's own scorer."""

    dataset: str
    pool_size: int = 1000
    difficulties: tuple[int, ...] = (1,)
    name: str = ""
    _pools: dict = field(default_factory=dict, repr=False)
    _entries: dict = field(default_factory=dict, repr=False)

    def __post_init__(self):
        self.name = self.name or f"rg:{self.dataset}"

    def _pool(self, seed: int):
        if seed not in self._pools:
            import reasoning_gym

            self._pools[seed] = reasoning_gym.create_dataset(
                self.dataset, size=self.pool_size, seed=seed
            )
        return self._pools[seed]

    def generate(self, rng: random.Random, difficulty: int) -> Prompt:
        ds = self._pool(rng.randrange(4))
        entry = ds[rng.randrange(self.pool_size)]
        prompt = make_prompt(self.name, entry["question"], str(entry["answer"]), difficulty)
        self._entries[prompt.prompt_id] = (ds, entry)
        return prompt

    def verify(self, completion: str, prompt: Prompt) -> bool:
        ds, entry = self._entries.get(prompt.prompt_id, (None, None))
        if ds is None:
            return completion.strip() == prompt.answer
        return float(ds.score_answer(answer=completion.strip(), entry=entry)) >= 1.0

    def flawed_answer(self, prompt: Prompt) -> str | None:
        return None
