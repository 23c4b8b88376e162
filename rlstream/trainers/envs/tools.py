"""Task families whose episodes run in an environment (`rlstream.trainers.environments`).

`guess`: a simulated user holds a secret number and answers each guess with a hint
(`environments.user`); the policy must ask its way there. Worked documents search by halves
with the user's exact hints; flawed ones count up from 1 (the user's patience runs out first on
the larger ranges).

`calc`: multi-digit multiplication, `123*45=`, in the calculator environment. The tiny preset
cannot multiply three digits by two in its head; with the tool it only has to call it and copy
the result. Its pre-training documents are whole episodes: a worked one calls the tool and
copies the result (`?123*45`, `5535`, `5535`); a flawed one answers at once with a systematic
mistake (the second operand's units digit dropped), the habit RL has to unlearn.

`pymul`: the same products with the Python tool in the sandbox (`environments.python`): a
worked document runs `!print(123*45)` and copies what it printed (a policy turn of 14 tokens:
raise rl.max_new_tokens to 16 and model.block_size to 48).
"""

from __future__ import annotations

import random
from dataclasses import dataclass

from rlstream.trainers.envs.base import Prompt, make_prompt, register_task

DIGITS = {1: (2, 1), 2: (2, 2), 3: (3, 2)}  # difficulty -> digits of the two operands


def _operands(prompt: Prompt) -> tuple[int, int]:
    a, _, b = prompt.text.rstrip("=").partition("*")
    return int(a), int(b)


@dataclass
class CalculatorMultiplication:
    name: str = "calc"
    environment: str = "calculator"
    difficulties: tuple[int, ...] = (1, 2, 3)

    def generate(self, rng: random.Random, difficulty: int) -> Prompt:
        da, db = DIGITS[difficulty]
        a = rng.randrange(10 ** (da - 1), 10**da)
        b = rng.randrange(10 ** (db - 1), 10**db)
        prompt = make_prompt(self.name, f"{a}*{b}=", str(a * b), difficulty)
        return Prompt(**(prompt.to_row() | {"environment": self.environment}))

    def verify(self, completion: str, prompt: Prompt) -> bool:
        """The final answer line (the environment checks the policy's last turn with it)."""
        return completion.strip() == prompt.answer

    def flawed_answer(self, prompt: Prompt) -> str | None:
        """The product with the second operand's units digit dropped (None where that changes
        nothing, or leaves nothing: a one-digit second operand)."""
        a, b = _operands(prompt)
        return None if b < 10 or b % 10 == 0 else str(a * (b - b % 10))

    def transcript(self, prompt: Prompt, flawed: bool) -> str:
        """A whole episode after the prompt, for pre-training: the tool called and its result
        copied, or (flawed) a direct answer with the family's mistake."""
        flawed_answer = self.flawed_answer(prompt) if flawed else None
        if flawed_answer is not None:
            return flawed_answer
        a, b = _operands(prompt)
        return f"?{a}*{b}\n{a * b}\n{prompt.answer}"


@dataclass
class PythonMultiplication(CalculatorMultiplication):
    name: str = "pymul"
    environment: str = "python"

    def transcript(self, prompt: Prompt, flawed: bool) -> str:
        flawed_answer = self.flawed_answer(prompt) if flawed else None
        if flawed_answer is not None:
            return flawed_answer
        a, b = _operands(prompt)
        return f"!print({a}*{b})\n{a * b}\n{prompt.answer}"


HIGHER, LOWER = "higher", "lower"  # the simulated user's hints (environments.user)
RANGES = {1: 9, 2: 30, 3: 99}  # difficulty -> the secret is in 1..N


def hint(secret: int, guess: int, distance: bool = False) -> str:
    """What a truthful user says to a wrong guess."""
    word = HIGHER if secret > guess else LOWER
    return f"{word} by {abs(secret - guess)}" if distance else word


@dataclass
class GuessTheNumber:
    name: str = "guess"
    environment: str = "user"
    difficulties: tuple[int, ...] = (1, 2, 3)

    def generate(self, rng: random.Random, difficulty: int) -> Prompt:
        top = RANGES[difficulty]
        secret = rng.randint(1, top)
        # a tag tells apart prompts of one range (each holds its own secret); the tiny preset's
        # 32-token context fits difficulty 1's dialogues (raise model.block_size for 2-3)
        prompt = make_prompt(self.name, f"#{rng.randrange(1000):03d} 1-{top}?", str(secret),
                             difficulty)  # fmt: skip
        return Prompt(**(prompt.to_row() | {"environment": self.environment}))

    def verify(self, completion: str, prompt: Prompt) -> bool:
        """A guess line that names the secret."""
        return completion.strip() == prompt.answer

    def flawed_answer(self, prompt: Prompt) -> str | None:
        return "1" if prompt.answer != "1" else None

    def transcript(self, prompt: Prompt, flawed: bool) -> str:
        """A whole dialogue: guesses by halves with the user's hints (flawed: counting up from
        1), ending with the right guess."""
        secret, top = int(prompt.answer), RANGES[prompt.difficulty or 1]
        low, high, lines, guess = 1, top, [], 1
        while True:
            if not flawed:
                guess = (low + high) // 2
            if guess == secret:
                return "\n".join([*lines, str(guess)])
            lines += [str(guess), hint(secret, guess)]
            if flawed:
                guess += 1
            elif secret > guess:
                low = guess + 1
            else:
                high = guess - 1


register_task(CalculatorMultiplication())
register_task(PythonMultiplication())
register_task(GuessTheNumber())
