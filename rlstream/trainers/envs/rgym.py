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
        """The dataset's own scorer; for a prompt this process did not generate (published, or
        exported with `rlstream datasets export`) it scores against the reference answer."""
        ds, entry = self._entries.get(prompt.prompt_id, (None, None))
        if ds is not None:
            return float(ds.score_answer(answer=completion.strip(), entry=entry)) >= 1.0
        import reasoning_gym

        score = reasoning_gym.get_score_answer_fn(self.dataset)
        try:
            return float(score(completion.strip(), {"answer": prompt.answer, "metadata": {}})) >= 1
        except (KeyError, TypeError, ValueError):  # a scorer that needs the entry's metadata
            return completion.strip() == prompt.answer.strip()


def export_rows(name: str, size: int, seed: int) -> list[dict]:
    """`size` prompts of reasoning-gym dataset `name` as prompt rows (task and verifier
    `rg:<name>`), newlines in the question flattened to spaces (the char model's newline is its
    stop token), the entry's metadata kept as JSON."""
    import json

    import reasoning_gym

    rows = []
    for entry in reasoning_gym.create_dataset(name, size=size, seed=seed):
        text = " ".join(str(entry["question"]).split())
        prompt = make_prompt(f"rg:{name}", text, str(entry["answer"]), 0)
        rows.append(prompt.to_row() | {"verifier": f"rg:{name}", "metadata": json.dumps(
            entry.get("metadata", {}), default=str, sort_keys=True)})  # fmt: skip
    return rows

    def flawed_answer(self, prompt: Prompt) -> str | None:
        return None


def rgym_family(name: str) -> ReasoningGymTask:
    """The family of `rg:<dataset>`."""
    return ReasoningGymTask(name.removeprefix("rg:"))
