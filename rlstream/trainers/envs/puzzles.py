"""Countdown (any expression reaching the target is correct) and GSM-style word problems."""

from __future__ import annotations

import ast
import operator
import random
import re
from collections import Counter
from dataclasses import dataclass

from rlstream.trainers.envs.base import Prompt, make_prompt, register_task

_OPS = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul}


def safe_eval(expr: str) -> tuple[int, list[int]] | None:
    """Value and literals of an integer +,-,* expression; None if it is anything else.

    >>> safe_eval("3*5+7")
    (22, [3, 5, 7])
    >>> safe_eval("__import__('os')") is None
    True
    """
    if len(expr) > 64 or not re.fullmatch(r"[0-9+\-*() ]+", expr):
        return None
    try:
        tree = ast.parse(expr, mode="eval").body
    except SyntaxError:
        return None
    literals: list[int] = []

    def ev(node: ast.AST) -> int:
        if isinstance(node, ast.Constant) and type(node.value) is int:
            literals.append(node.value)
            return node.value
        if isinstance(node, ast.BinOp) and type(node.op) in _OPS:
            return _OPS[type(node.op)](ev(node.left), ev(node.right))
        raise ValueError("unsupported")

    try:
        return ev(tree), literals
    except ValueError:
        return None


def countdown_correct(completion: str, reference: str) -> bool:
    """True if the completion evaluates to the reference's value using each number at most once.

    >>> countdown_correct("7+5*3", "3*5+7"), countdown_correct("3*5+7+7", "3*5+7")
    (True, False)
    """
    got, ref = safe_eval(completion.strip()), safe_eval(reference)
    if got is None or ref is None:
        return False
    return got[0] == ref[0] and not (Counter(got[1]) - Counter(ref[1]))


@dataclass
class Countdown:
    """Reach the target with `difficulty + 1` one-digit numbers, each used at most once."""

    name: str = "countdown"
    difficulties: tuple[int, ...] = (1, 2, 3)

    def generate(self, rng: random.Random, difficulty: int) -> Prompt:
        nums = [rng.randint(1, 9) for _ in range(difficulty + 1)]
        expr = str(nums[0])
        for n in nums[1:]:
            expr += rng.choice("+-*") + str(n)
        target = safe_eval(expr)[0]
        shown = sorted(nums)
        text = f"{' '.join(map(str, shown))}>{target}:"
        return make_prompt(self.name, text, expr, difficulty)

    def verify(self, completion: str, prompt: Prompt) -> bool:
        return countdown_correct(completion, prompt.answer)

    def flawed_answer(self, prompt: Prompt) -> str | None:
        return None

    def solve(self, prompt: Prompt, flawed: bool = False) -> tuple[list[str], str] | None:
        """The expression evaluated one operation at a time, in order of precedence, to the
        target: 3*5=15;15+7=22, then the expression (no systematic flaw: None if flawed)."""
        if flawed:
            return None
        steps: list[str] = []

        def ev(node: ast.AST) -> int:
            if isinstance(node, ast.Constant):
                return node.value
            left, right = ev(node.left), ev(node.right)
            value = _OPS[type(node.op)](left, right)
            steps.append(f"{left}{_SYMBOLS[type(node.op)]}{right}={value}")
            return value

        ev(ast.parse(prompt.answer, mode="eval").body)
        return steps, prompt.answer


_SYMBOLS = {ast.Add: "+", ast.Sub: "-", ast.Mult: "*"}
_NAMES = ["ann", "bob", "cid", "dee", "eve", "fay", "gus", "hal"]
_ITEMS = ["pens", "eggs", "cups", "hats", "keys", "apples"]
_TEMPLATES = {
    "+": "{n} has {a} {i} and gets {b} more. how many {i}?",
    "-": "{n} has {a} {i} and gives away {b}. how many {i}?",
    "*": "{n} buys {a} bags of {b} {i}. how many {i}?",
}

_MARKERS = {"+": " more.", "-": " gives away ", "*": " bags of "}  # which template a text is


@dataclass
class WordProblem:
    """Template GSM-style one-step problems; difficulty = digits of the numbers; plain answers."""

    name: str = "word"
    difficulties: tuple[int, ...] = (1, 2)

    def generate(self, rng: random.Random, difficulty: int) -> Prompt:
        op = rng.choice("+-*")
        hi = 10**difficulty - 1
        a, b = rng.randint(1, hi), rng.randint(1, hi if op != "*" else 9)
        if op == "-":
            a, b = max(a, b), min(a, b)
        value = {"+": a + b, "-": a - b, "*": a * b}[op]
        text = _TEMPLATES[op].format(n=rng.choice(_NAMES), a=a, b=b, i=rng.choice(_ITEMS)) + " "
        return make_prompt(self.name, text, str(value), difficulty)

    def verify(self, completion: str, prompt: Prompt) -> bool:
        return completion.strip() == prompt.answer

    def flawed_answer(self, prompt: Prompt) -> str | None:
        # Off by one on subtraction problems (a classic fencepost slip).
        return str(int(prompt.answer) + 1) if "gives away" in prompt.text else None

    def solve(self, prompt: Prompt, flawed: bool = False) -> tuple[list[str], str] | None:
        """The problem's equation: 4*6=24. Flawed: a subtraction off by one."""
        answer = self.flawed_answer(prompt) if flawed else prompt.answer
        if answer is None:
            return None
        a, b = (int(n) for n in re.findall(r"\d+", prompt.text)[:2])
        op = next(op for op, marker in _MARKERS.items() if marker in prompt.text)
        return [f"{a}{op}{b}={answer}"], answer


register_task(Countdown())
register_task(WordProblem())
