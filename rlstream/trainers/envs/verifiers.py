"""Verify-only task families for user data: a prompt's `task` (or `verifier`) names its check.

`exact` (the stripped completion equals the answer), `numeric` (the last number in the
completion is within 1e-6 of the numeric answer) and `math` (the completion's final answer, from
`\\boxed{}`, `#### x` or `<answer>x</answer>`, is equivalent to the reference under math-verify:
`\\frac{1}{2}` == `0.5`) check prompts rlstream does not generate, e.g. a user's JSONL of
questions and answers. They have no generator: `TaskMix` refuses them.
"""

from __future__ import annotations

import logging
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


_ANSWER_TAG = re.compile(r"<answer>(.*?)</answer>", re.S)


def extract_answer(completion: str) -> str:
    r"""The final answer a chain-of-thought completion states: the last `\boxed{...}`, else
    the text after the last `####`, else the last `<answer>...</answer>`, else all of it.

    >>> extract_answer(r"so x = 2, \boxed{\frac{1}{2}}.")
    '\\frac{1}{2}'
    >>> extract_answer("3 + 4 = 7\n#### 7"), extract_answer("<answer> 12 </answer>")
    ('7', '12')
    """
    boxed = _last_boxed(completion)
    if boxed is not None:
        return boxed
    if "####" in completion:
        return completion.rsplit("####", 1)[1].strip()
    tags = _ANSWER_TAG.findall(completion)
    return tags[-1].strip() if tags else completion.strip()


def _last_boxed(text: str) -> str | None:
    start = text.rfind("\\boxed{")
    if start < 0:
        return None
    depth, i = 0, start + len("\\boxed")
    for j in range(i, len(text)):
        depth += {"{": 1, "}": -1}.get(text[j], 0)
        if depth == 0:
            return text[i + 1 : j].strip()
    return None  # unbalanced: no answer


class MathEquivalence(VerifyOnly):
    """math-verify on the extracted final answer (its signal-based timeouts are off: they are
    not thread-safe; score_rollouts bounds each call itself)."""

    def warm_up(self) -> None:
        """Import math-verify (and sympy) now, not inside the first timed call."""
        _math_verify()

    def answer_problem(self, answer: str) -> str | None:
        parse, _ = _math_verify()
        if not answer.strip():
            return "has no answer to compare with"
        return None if parse(answer, parsing_timeout=None) else f"answer {answer!r} does not parse"

    def verify(self, completion: str, prompt: Prompt) -> bool:
        parse, verify = _math_verify()
        gold = parse(prompt.answer, parsing_timeout=None)
        pred = parse(_as_math(extract_answer(completion)), parsing_timeout=None)
        return bool(gold) and bool(pred) and verify(gold, pred, timeout_seconds=None)


def _math_verify():
    """math-verify's parse and verify, without its warning on every call that timeouts are
    off (we turn them off on purpose)."""
    import math_verify

    logging.getLogger("math_verify").setLevel(logging.ERROR)
    return math_verify.parse, math_verify.verify


def _as_math(answer: str) -> str:
    """math-verify reads LaTeX inside delimiters; a bare extracted answer gets them."""
    return answer if "$" in answer else f"${answer}$"


register_task(ExactMatch("exact", "the stripped completion equals the answer"))
register_task(Numeric("numeric", "the last number in the completion equals the answer (1e-6)"))
register_task(MathEquivalence("math", "the final answer is equivalent to the reference"))
