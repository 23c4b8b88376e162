"""`walk`: reach a goal on a line of ten cells in the world environment (`environments.world`),
one move a turn, against dynamics that grow harder with the prompt's difficulty.

A prompt `#123 at 3 to 7:` starts the walker at 3; each policy line `+` or `-` moves it one cell
and the world answers with where it landed. The world's dynamics are its difficulty settings:

    difficulty  distance to the goal  slip (a move goes the other way)
    1           1-3                   0
    2           1-3                   0.15
    3           4-6                   0.15

Worked pre-training documents walk towards the goal, through the world's own slips (each
document's dynamics seeded by its prompt); flawed ones always step `+` (the direction ignored),
which fails every walk to a lower cell: the habit RL has to unlearn.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

from rlstream.trainers.envs.base import Prompt, make_prompt, register_task

CELLS = 10
DISTANCES = {1: (1, 3), 2: (1, 3), 3: (4, 6)}
SLIP = {1: 0.0, 2: 0.15, 3: 0.15}


def ends(prompt: Prompt) -> tuple[int, int]:
    """(start, goal) of a walk prompt."""
    words = prompt.text.rstrip(":").split()
    return int(words[2]), int(words[4])


def move(position: int, action: str, slipped: bool) -> int:
    """Where a move lands: one cell in its direction (the other way on a slip), kept on the
    line; an action that is not a move stays put."""
    step = {"+": 1, "-": -1}.get(action.strip(), 0) * (-1 if slipped else 1)
    return min(CELLS - 1, max(0, position + step))


@dataclass
class Walk:
    name: str = "walk"
    environment: str = "world"
    difficulties: tuple[int, ...] = (1, 2, 3)

    def generate(self, rng: random.Random, difficulty: int) -> Prompt:
        lo, hi = DISTANCES[difficulty]
        while True:
            start, distance = rng.randrange(CELLS), rng.randint(lo, hi) * rng.choice((1, -1))
            if 0 <= start + distance < CELLS:
                break
        text = f"#{rng.randrange(1000):03d} at {start} to {start + distance}:"
        prompt = make_prompt(self.name, text, str(start + distance), difficulty)
        return Prompt(**(prompt.to_row() | {"environment": self.environment}))

    def verify(self, completion: str, prompt: Prompt) -> bool:
        """A walk is scored by the world (reaching the goal); as text, its last line is the
        goal cell the world reported."""
        return completion.strip().splitlines()[-1:] == [prompt.answer]

    def flawed_answer(self, prompt: Prompt) -> str | None:
        start, goal = ends(prompt)
        return "+" if goal < start else None

    def transcript(self, prompt: Prompt, flawed: bool) -> str:
        """A whole walk: moves towards the goal and the world's answers (its slips seeded by
        the prompt), or (flawed) `+` until the world's turn limit of nine moves."""
        position, goal = ends(prompt)
        rng, slip, lines = random.Random(prompt.prompt_id), SLIP[prompt.difficulty or 1], []
        for _ in range(9):
            action = "+" if flawed or goal > position else "-"
            position = move(position, action, rng.random() < slip)
            lines.append(action)
            if position == goal:
                break
            lines.append(str(position))
        return "\n".join(lines)


register_task(Walk())
