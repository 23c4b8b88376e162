"""The environment interface, its registry and how an environment fails (no torch here).

    class Echo:
        def __init__(self, settings: EnvConfig): ...
        async def reset(self, prompt: Prompt) -> str: return ""        # text before turn 1
        async def step(self, action: str) -> Step: return Step("", 1.0, done=True)
        async def close(self) -> None: ...

    ENVIRONMENTS.register("echo")(Echo)

One instance serves one episode (an environment keeps its state between steps; nothing is
shared between episodes). Every call is bounded by `EnvConfig.step_timeout_s`; a call that
raises, runs over, returns something that is not a `Step` or a reward that is not finite fails
the episode with an `EnvironmentFailed` of one kind, and nothing of that episode is trained.
"""

from __future__ import annotations

import importlib.util
import json
import math
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Protocol

from rlstream.config import EnvConfig
from rlstream.registry import Registry, import_spec

if TYPE_CHECKING:
    from rlstream.trainers.envs import Prompt


@dataclass
class Step:
    """What the environment answers to one policy turn."""

    observation: str = ""
    """text the policy sees next (appended to its context as environment tokens, loss mask 0)"""
    reward: float = 0.0
    """this turn's reward; the episode's return is the sum over its turns"""
    done: bool = False
    info: dict = field(default_factory=dict)
    """free-form; `tool_call: True` counts a tool call"""


class Environment(Protocol):
    async def reset(self, prompt: Prompt) -> str: ...

    async def step(self, action: str) -> Step: ...

    async def close(self) -> None: ...


ENVIRONMENTS = Registry("environment")
"""Environment classes by name: `cls(settings) -> Environment`, one instance per episode."""
ENVIRONMENTS.declare("calculator", "rlstream.trainers.environments.calculator:Calculator")
ENVIRONMENTS.declare("user", "rlstream.trainers.environments.user:SimulatedUser")
ENVIRONMENTS.declare("python", "rlstream.trainers.environments.python:PythonTool")
ENVIRONMENTS.declare("world", "rlstream.trainers.environments.world:World")
ENVIRONMENTS.declare("llm-user", "rlstream.trainers.environments.llm_user:LLMUser")
OPENENV_CLIENT = "rlstream.trainers.environments.openenv:remote"
"""address -> the environment class playing episodes on that OpenEnv server (imported by name,
as a declared registry entry is: the interface imports none of its implementations)"""


def environment_class(name: str):
    """The environment class `name` names: a registered name, `package.module:Class` or
    `path/to/file.py:Class` (a user's own, imported on first use), or an OpenEnv server's
    address (`http://host:port`). ValueError names what is wrong."""
    if name.startswith(("http://", "https://", "ws://", "wss://")):  # an OpenEnv server
        if importlib.util.find_spec("openenv") is None:  # (importing it takes seconds)
            raise ValueError(f"environment {name!r}: an OpenEnv server needs openenv-core "
                             "(pip install 'rlstream[openenv]')")  # fmt: skip
        return import_spec(OPENENV_CLIENT)(name)
    if name in ENVIRONMENTS or ":" not in name:
        return ENVIRONMENTS.lookup(name)
    if name not in _IMPORTED:
        _IMPORTED[name] = import_spec(name)
    return _IMPORTED[name]


_IMPORTED: dict[str, type] = {}


def open_environment(name: str, settings: EnvConfig, prompt=None) -> Environment:
    """An environment for one episode, made with the run's settings; a prompt whose row has
    an `env_options` column (a JSON object) overrides env.options for its own episodes, so a
    dataset can hold one task under several environment settings for the samplers and the
    curriculum to choose among. An environment env.servers names plays on that server."""
    own = prompt_env_options(prompt) if prompt is not None else {}
    if own:
        merged = json.loads(settings.options or "{}") | own
        settings = replace(settings, options=json.dumps(merged))
    return environment_class(settings.server_of(name))(settings)


def prompt_env_options(prompt) -> dict:
    """A prompt's own environment options (its row's `env_options` column), {} without."""
    try:
        own = json.loads(getattr(prompt, "metadata", "") or "{}").get("env_options") or {}
    except (ValueError, AttributeError):
        return {}
    if isinstance(own, str):
        try:
            own = json.loads(own)
        except ValueError:
            return {}
    return own if isinstance(own, dict) else {}


class EnvironmentFailed(Exception):
    """An episode's environment failed; `kind` says how (the dead letter's error kind)."""

    KINDS = ("env_timeout", "env_crashed", "env_protocol", "env_bad_reward", "env_closed")

    def __init__(self, kind: str, reason: str):
        assert kind in self.KINDS, kind
        super().__init__(f"{kind}: {reason}")
        self.kind, self.reason = kind, reason


def checked_step(result) -> Step:
    """The step an environment returned, or EnvironmentFailed saying what is wrong with it."""
    if not isinstance(result, Step):
        raise EnvironmentFailed(
            "env_protocol", f"step returned {type(result).__name__}, not a Step"
        )
    if not isinstance(result.observation, str):
        raise EnvironmentFailed("env_protocol", "the observation is not text")
    try:
        reward = float(result.reward)
    except (TypeError, ValueError):
        raise EnvironmentFailed(
            "env_bad_reward", f"reward {result.reward!r} is not a number"
        ) from None
    if not math.isfinite(reward):
        raise EnvironmentFailed("env_bad_reward", f"reward {reward} is not finite")
    result.reward = reward
    return result
