"""The calculator: a tool the policy may call before it answers.

A policy line `?<a><op><b>` (op one of + - *) is a tool call: the environment answers with the
result on a line of its own, and the episode goes on. Any other line is the final answer: the
episode ends with reward 1 if its task's verifier accepts it, else 0. With the option
`{"tool": false}` every call is answered `no tool` (the same task and budget without the tool).
"""

from __future__ import annotations

import re

from rlstream.config import EnvConfig
from rlstream.trainers.environments.base import Step
from rlstream.trainers.envs import Prompt, verify

CALL = "?"
EXPRESSION = re.compile(r"^(\d{1,9})([-+*])(\d{1,9})$")


def calculate(expression: str) -> str:
    """The tool: '123*45' -> '5535'; anything else -> 'error'."""
    m = EXPRESSION.match(expression.strip())
    if m is None:
        return "error"
    a, op, b = int(m[1]), m[2], int(m[3])
    return str(a * b if op == "*" else a + b if op == "+" else a - b)


class Calculator:
    def __init__(self, settings: EnvConfig):
        self.tool = bool(settings.option("tool", True))
        self.prompt: Prompt | None = None

    async def reset(self, prompt: Prompt) -> str:
        self.prompt = prompt
        return ""

    async def step(self, action: str) -> Step:
        line = action.strip()
        if line.startswith(CALL):
            result = calculate(line[1:]) if self.tool else "no tool"
            return Step(result + "\n", 0.0, False, {"tool_call": True})
        return Step("", float(verify(line, self.prompt)), True)

    async def close(self) -> None:
        self.prompt = None
