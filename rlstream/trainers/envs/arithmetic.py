"""Arithmetic families: addition, subtraction, multiplication, chained a+b-c.

Format (INFRA.md: worth more than model size at this scale): operands zero-padded to the family's
width, answer zero-padded and digit-reversed so the model writes the least significant digit
first, the order in which carries are computed: `037+085=` -> `2210` (0122 reversed).

Each family has a *systematic* flaw for pre-training corpora, on some prompt classes only:
addition drops every carry, subtraction forgets every borrow, multiplication drops the carries
between digit products, the chain forgets the units carry of a+b (off by ten).
"""

from __future__ import annotations

import random
from dataclasses import dataclass

from rlstream.trainers.envs.base import Prompt, make_prompt, register_task


def encode_number(value: int, width: int) -> str:
    """Zero-padded, digit-reversed: encode_number(122, 4) == '2210'.

    >>> encode_number(122, 4)
    '2210'
    """
    if value < 0:
        raise ValueError(f"cannot encode negative {value}")
    return str(value).zfill(width)[::-1]


def decode_number(text: str) -> int | None:
    """Inverse of encode_number; None if the text is not all digits.

    >>> decode_number('2210')
    122
    """
    text = text.strip()
    return int(text[::-1]) if text.isdigit() else None


def _digits(x: int, n: int) -> list[int]:
    """Least significant first, n digits."""
    return [(x // 10**i) % 10 for i in range(n)]


def _operand(rng: random.Random, digits: int) -> int:
    lo = 0 if digits == 1 else 10 ** (digits - 1)
    return rng.randint(lo, 10**digits - 1)


def _parse(text: str) -> list[int]:
    """Operands of a prompt like '037+085=' or '03+05-02='."""
    body = text.rstrip("=")
    for op in "+-*":
        body = body.replace(op, " ")
    return [int(t) for t in body.split()]


@dataclass
class _Arithmetic:
    """Shared exact-match verifier: the completion must equal the encoded answer."""

    width: int = 3

    @property
    def difficulties(self) -> tuple[int, ...]:
        return tuple(range(1, self.width + 1))

    def verify(self, completion: str, prompt: Prompt) -> bool:
        return completion.strip() == prompt.answer


@dataclass
class Addition(_Arithmetic):
    name: str = "add"

    def generate(self, rng: random.Random, difficulty: int) -> Prompt:
        a, b = _operand(rng, difficulty), _operand(rng, difficulty)
        w = self.width
        return make_prompt(
            self.name, f"{a:0{w}d}+{b:0{w}d}=", encode_number(a + b, w + 1), difficulty
        )

    def flawed_answer(self, prompt: Prompt) -> str | None:
        a, b = _parse(prompt.text)
        da, db = _digits(a, self.width), _digits(b, self.width)
        if all(x + y < 10 for x, y in zip(da, db, strict=True)):
            return None
        return "".join(str((x + y) % 10) for x, y in zip(da, db, strict=True)) + "0"

    def solve(self, prompt: Prompt, flawed: bool = False) -> tuple[list[str], str] | None:
        """Digit sums from the units up, each with the carry in: 7+5=12;3+8+1=12;0+0+1=1.
        Flawed: every carry dropped (None when the sum has none)."""
        a, b = _parse(prompt.text)
        steps, digits, carry, carried = [], [], 0, False
        for x, y in zip(_digits(a, self.width), _digits(b, self.width), strict=True):
            total = x + y + carry
            steps.append(f"{x}+{y}{f'+{carry}' if carry else ''}={total}")
            digits.append(str(total % 10))
            carried |= total >= 10
            carry = 0 if flawed else total // 10
        if flawed and not carried:
            return None
        return steps, "".join(digits) + str(carry)


@dataclass
class Subtraction(_Arithmetic):
    name: str = "sub"

    def generate(self, rng: random.Random, difficulty: int) -> Prompt:
        a, b = sorted((_operand(rng, difficulty), _operand(rng, difficulty)), reverse=True)
        w = self.width
        return make_prompt(self.name, f"{a:0{w}d}-{b:0{w}d}=", encode_number(a - b, w), difficulty)

    def flawed_answer(self, prompt: Prompt) -> str | None:
        a, b = _parse(prompt.text)
        da, db = _digits(a, self.width), _digits(b, self.width)
        if all(x >= y for x, y in zip(da, db, strict=True)):
            return None
        return "".join(str((x - y) % 10) for x, y in zip(da, db, strict=True))

    def solve(self, prompt: Prompt, flawed: bool = False) -> tuple[list[str], str] | None:
        """Digit differences from the units up; a borrow shows as the ten it adds and the one
        it takes from the next digit: 15-7=8;8-3-1=4;0-0=0. Flawed: the ten is added, the one
        never taken (None when no digit borrows)."""
        a, b = _parse(prompt.text)
        steps, digits, borrow, borrowed = [], [], 0, False
        for x, y in zip(_digits(a, self.width), _digits(b, self.width), strict=True):
            ten = 10 if x - y - borrow < 0 else 0
            diff = x + ten - y - borrow
            steps.append(f"{'1' if ten else ''}{x}-{y}{f'-{borrow}' if borrow else ''}={diff}")
            digits.append(str(diff))
            borrowed |= ten > 0
            borrow = 0 if flawed else ten // 10
        if flawed and not borrowed:
            return None
        return steps, "".join(digits)


@dataclass
class Multiplication(_Arithmetic):
    """A `difficulty`-digit number times a one-digit number."""

    name: str = "mul"

    def generate(self, rng: random.Random, difficulty: int) -> Prompt:
        a, b = _operand(rng, difficulty), rng.randint(2, 9)
        w = self.width
        return make_prompt(self.name, f"{a:0{w}d}*{b}=", encode_number(a * b, w + 1), difficulty)

    def flawed_answer(self, prompt: Prompt) -> str | None:
        a, b = _parse(prompt.text)
        prods = [x * b for x in _digits(a, self.width)]
        if all(p < 10 for p in prods):
            return None
        return "".join(str(p % 10) for p in prods) + "0"

    def solve(self, prompt: Prompt, flawed: bool = False) -> tuple[list[str], str] | None:
        """Partial products from the units up, each with the carry in: 7*4=28;3*4+2=14;0*4+1=1.
        Flawed: the carries between them dropped (None when no product carries)."""
        a, b = _parse(prompt.text)
        steps, digits, carry, carried = [], [], 0, False
        for x in _digits(a, self.width):
            product = x * b + carry
            steps.append(f"{x}*{b}{f'+{carry}' if carry else ''}={product}")
            digits.append(str(product % 10))
            carried |= product >= 10
            carry = 0 if flawed else product // 10
        if flawed and not carried:
            return None
        return steps, "".join(digits) + str(carry)


@dataclass
class Chain(_Arithmetic):
    """a + b - c with c <= a + b."""

    name: str = "chain"

    def generate(self, rng: random.Random, difficulty: int) -> Prompt:
        a, b = _operand(rng, difficulty), _operand(rng, difficulty)
        c = min(_operand(rng, difficulty), a + b)
        w = self.width
        text = f"{a:0{w}d}+{b:0{w}d}-{c:0{w}d}="
        return make_prompt(self.name, text, encode_number(a + b - c, w + 1), difficulty)

    def flawed_answer(self, prompt: Prompt) -> str | None:
        a, b, c = _parse(prompt.text)
        wrong = a + b - c - 10
        if (a % 10) + (b % 10) < 10 or wrong < 0:
            return None
        return encode_number(wrong, self.width + 1)

    def solve(self, prompt: Prompt, flawed: bool = False) -> tuple[list[str], str] | None:
        """The intermediate result, then the final one: 37+85=122;122-20=102. Flawed: the sum
        forgets its units carry (off by ten; None when the units do not carry)."""
        a, b, c = _parse(prompt.text)
        total = a + b - (10 if flawed else 0)
        if flawed and ((a % 10) + (b % 10) < 10 or total - c < 0):
            return None
        steps = [f"{a}+{b}={total}", f"{total}-{c}={total - c}"]
        return steps, encode_number(total - c, self.width + 1)


for _family in (Addition(), Subtraction(), Multiplication(), Chain()):
    register_task(_family)
