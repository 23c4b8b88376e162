"""The Python tool: the policy may run code in the sandbox before it answers.

A policy line `!<code>` is a tool call: the code runs in the sandbox (`rlstream.sandbox`, with
the run's `sandbox.*` limits) and the environment answers with what it printed, else its last
error line, else how the sandbox ended it (`timed out after 2 s`), on one line of its own (at
most `{"max_chars": 64}` characters). Any other line is the final answer: the episode ends with
reward 1 if its task's verifier accepts it. `{"tool": false}` answers every call `no tool`.
"""

from __future__ import annotations

import asyncio

from rlstream.config import EnvConfig
from rlstream.trainers.environments.base import Step
from rlstream.trainers.envs import Prompt, verify

CALL = "!"


def observation(execution, limits, max_chars: int) -> str:
    """What the tool answers: the output, else the last error line, else why it stopped."""
    printed = " ".join(execution.stdout.split())
    if execution.status == "ok":
        text = printed or "(no output)"
    else:
        error = execution.stderr.strip().splitlines()[-1:]
        text = (error[0] if error and execution.status == "failed" else "") or execution.why(limits)
    return text[:max_chars]


class PythonTool:
    def __init__(self, settings: EnvConfig):
        self.tool = bool(settings.option("tool", True))
        self.max_chars = int(settings.option("max_chars", 64))
        self.prompt: Prompt | None = None

    async def reset(self, prompt: Prompt) -> str:
        self.prompt = prompt
        return ""

    async def step(self, action: str) -> Step:
        line = action.strip()
        if not line.startswith(CALL):
            return Step("", float(verify(line, self.prompt)), True)
        if not self.tool:
            return Step("no tool\n", 0.0, False, {"tool_call": True})
        from rlstream.sandbox import shared

        sandbox = shared()
        execution = await asyncio.to_thread(sandbox.run, line[1:])
        answer = observation(execution, sandbox.cfg, self.max_chars)
        return Step(answer + "\n", 0.0, False, {"tool_call": True, "status": execution.status})

    async def close(self) -> None:
        self.prompt = None
