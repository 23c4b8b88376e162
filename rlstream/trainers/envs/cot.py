"""Chain-of-thought formats of the built-in families: a worked solution, then the final answer
in a fixed tag, which is all the verifier reads.

    037+085=  ->  7+5=12;3+8+1=12;0+0+1=1<answer>2210</answer>

Each family's `solve(prompt, flawed)` writes the steps (digit-wise sums with their carries,
borrows, partial products, a chain's intermediate results, a countdown's evaluation, a word
problem's equation) and the final answer. A flawed solution makes the family's systematic
mistake *inside the steps* (a dropped carry, a forgotten borrow), and its final answer follows
from them, so a model pre-trained on such documents reasons wrongly in a way RL can fix, as in
the direct format (INFRA.md). The verifier of a `cot:<task>` prompt takes the last
`<answer>...</answer>` of the completion and checks it with the family's own verifier; a
completion without the tag is wrong. A prompt row's `answer` is the final answer alone.
"""

from __future__ import annotations

import random
import re
from dataclasses import dataclass, replace

from rlstream.trainers.envs.base import Prompt

PREFIX = "cot:"
OPEN, CLOSE = "<answer>", "</answer>"
FORMATS = ("direct", "cot")
STEP_SEP = ";"
_TAG = re.compile(re.escape(OPEN) + r"(.*?)" + re.escape(CLOSE), re.S)


def final_answer(completion: str) -> str | None:
    """The content of the completion's last answer tag, or None without one.

    >>> final_answer("7+5=12;0+0+1=1<answer>2210</answer>"), final_answer("2210")
    ('2210', None)
    """
    found = _TAG.findall(completion)
    return found[-1].strip() if found else None


def write_solution(steps: list[str], answer: str) -> str:
    return STEP_SEP.join(steps) + OPEN + answer + CLOSE


@dataclass
class ChainOfThought:
    """The `cot:<task>` family: `base`'s prompts with worked-solution completions."""

    base: object  # a TaskFamily with `solve`

    @property
    def name(self) -> str:
        return PREFIX + self.base.name

    @property
    def difficulties(self) -> tuple[int, ...]:
        return self.base.difficulties

    @property
    def generates(self) -> bool:
        return getattr(self.base, "generates", True)

    def generate(self, rng: random.Random, difficulty: int) -> Prompt:
        return as_cot(self.base.generate(rng, difficulty))

    def verify(self, completion: str, prompt: Prompt) -> bool:
        answer = final_answer(completion)
        return answer is not None and self.base.verify(answer, prompt)

    def flawed_answer(self, prompt: Prompt) -> str | None:
        return None  # a cot document's flaw is in its steps: `document`

    def answer_problem(self, answer: str) -> str | None:
        check = getattr(self.base, "answer_problem", None)
        return check(answer) if check else None

    def solution(self, prompt: Prompt, flawed: bool = False) -> str | None:
        """The worked completion (None: this prompt's class has no flawed solution)."""
        solved = self.base.solve(prompt, flawed)
        return None if solved is None else write_solution(*solved)


def cot_family(name: str) -> ChainOfThought:
    """The chain-of-thought family of task `name` (`cot:add` -> add's). Any family verifies in
    this format (`cot:rg:gcd`: a reasoning-gym answer in the tag); the built-in ones also
    write worked solutions (`solve`) for prompts and pre-training documents."""
    from rlstream.trainers.envs.base import get_task

    return ChainOfThought(get_task(name.removeprefix(PREFIX)))


def as_cot(prompt: Prompt) -> Prompt:
    """The prompt verified in the chain-of-thought format (its answer stays the final one)."""
    return replace(prompt, verifier=PREFIX + prompt.task)


def in_format(prompt: Prompt, fmt: str) -> Prompt:
    return as_cot(prompt) if fmt == "cot" else prompt


def document(prompt: Prompt, rng: random.Random, flaw_rate: float) -> str:
    """A pre-training document in the chain-of-thought format: the prompt and its worked
    solution, written with its family's systematic mistake at rate flaw_rate."""
    family = cot_family(prompt.task)
    if flaw_rate > 0:
        flawed = family.solution(prompt, flawed=True)
        if flawed is not None and rng.random() < flaw_rate:
            return prompt.text + flawed + "\n"
    return prompt.text + family.solution(prompt) + "\n"
