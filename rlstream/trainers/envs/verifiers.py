"""Verify-only task families for user data: a prompt's `task` names how it is checked.

`exact` (the stripped completion equals the answer) and `numeric` (the last number in the
completion is within 1e-6 of the numeric answer) check prompts rlstream does not generate, e.g. a
user's JSONL of questions and answers. They have no generator: `TaskMix` refuses them.
"""

from __future__ import annotations

import math
import random
import re
from dataclasses import dataclass

from rlstream.trainers.envs.base import Prompt, register_task

_NUMBER = re.compile(r"-?\d+(?:\.\d+)?")


@dataclass
class VerifyOnly:
    name: str
    doc: str
    difficulties: tuple[int, ...] = (0,)
    generates = False

    def generate(self, rng: random.Random, difficulty: int) -> Prompt:
        raise TypeError(f"task {self.name!r} only verifies user prompts; it generates none")

    def flawed_answer(self, prompt: Prompt) -> str | None:
        return None

    def answer_problem(self, answer: str) -> str | None:
        """Why the verifier cannot use this reference answer, or None."""
        return None if answer.strip() else "has no answer to compare with"


class ExactMatch(VerifyOnly):
    def verify(self, completion: str, prompt: Prompt) -> bool:
        return completion.strip() == prompt.answer.strip()


class Numeric(VerifyOnly):
    def answer_problem(self, answer: str) -> str | None:
        try:
            float(answer)
        except ValueError:
            return f"answer {answer!r} is not a number"
        return None

    def verify(self, completion: str, prompt: Prompt) -> bool:
        found = _NUMBER.findall(completion)
        return bool(found) and math.isclose(
            float(found[-1]), float(prompt.answer), rel_tol=1e-6, abs_tol=1e-6
        )


register_task(ExactMatch("exact", "the stripped completion equals the answer"))
register_task(Numeric("numeric", "the last number in the completion equals the answer (1e-6)"))
