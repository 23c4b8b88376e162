"""OpenEnv's protocol, both ways (`openenv-core` from PyPI: `pip install rlstream[openenv]`).

Training against an OpenEnv server: a prompt whose `environment` is the server's address
(`http://host:8000`, `ws://...`) plays each episode in a session of its own over OpenEnv's
WebSocket protocol (openenv-core's `GenericEnvClient`). `reset` sends the prompt row as a
`prompt` argument (a server whose `reset` takes no such argument ignores it); a policy turn is
sent as the action `{<action_field>: text}` and the observation's `<observation_field>` (else
its first text field) is what the policy reads next. `env.options` sets both fields (defaults
`message` and `text`, openenv-core's echo and chat shapes).

How it fails maps onto the episode's failure kinds: a connection that cannot be made or is
closed mid-episode is `env_closed`, an error answer or an answer that is not the protocol's is
`env_protocol`, a reward that is not a finite number `env_bad_reward` (the engine's check);
timeouts are the engine's (`env.step_timeout_s`).

Serving: `rlstream env serve NAME` serves any rlstream environment as an OpenEnv FastAPI app
(openenv-core's `create_fastapi_app`, one environment instance per WebSocket session), so an
environment, the design notes' world-model service, runs on another machine.
"""

from __future__ import annotations

import json

from rlstream.config import EnvConfig
from rlstream.trainers.environments.base import EnvironmentFailed, Step

SCHEMES = ("http://", "https://", "ws://", "wss://")
TEXT_FIELDS = ("text", "message", "content", "prompt", "echoed_message")


def is_address(name: str) -> bool:
    return name.startswith(SCHEMES)


def remote(address: str):
    """The environment class for an OpenEnv server at `address`."""

    class Remote(OpenEnvSession):
        url = address

    return Remote


class OpenEnvSession:
    """One episode in one session of an OpenEnv server."""

    url = ""

    def __init__(self, settings: EnvConfig):
        # imported here, not in the timed reset: openenv-core takes ~3.5 s to import (gradio)
        from openenv.core.generic_client import GenericEnvClient

        self.action_field = settings.option("action_field", "message")
        self.observation_field = settings.option("observation_field", "text")
        self.client = GenericEnvClient(base_url=self.url, connect_timeout_s=settings.step_timeout_s,
                                       message_timeout_s=settings.step_timeout_s)  # fmt: skip

    async def reset(self, prompt) -> str:
        result = await self._call(self.client.reset(prompt=prompt.to_row()))
        return self._text(result.observation)

    async def step(self, action: str) -> Step:
        result = await self._call(self.client.step({self.action_field: action}))
        observation = result.observation if isinstance(result.observation, dict) else {}
        reward = 0.0 if result.reward is None else result.reward
        return Step(self._text(observation), reward, bool(result.done), observation)

    async def close(self) -> None:
        await self.client.close()

    async def _call(self, call):
        try:
            return await call
        except ConnectionError as exc:  # refused, reset, or closed mid-episode
            raise EnvironmentFailed("env_closed", f"{self.url}: {exc}") from None
        except json.JSONDecodeError as exc:
            raise EnvironmentFailed("env_protocol", f"{self.url}: not JSON ({exc})") from None
        except RuntimeError as exc:  # the server's error answer ("Server error: ... (code)")
            raise EnvironmentFailed("env_protocol", f"{self.url}: {exc}") from None
        except Exception as exc:
            if type(exc).__module__.startswith("websockets"):  # ConnectionClosed and kin
                raise EnvironmentFailed("env_closed", f"{self.url}: {exc!r:.200}") from None
            raise

    def _text(self, observation) -> str:
        if not isinstance(observation, dict):
            raise EnvironmentFailed("env_protocol", f"{self.url}: an observation that is not "
                                    "an object")  # fmt: skip
        if isinstance(observation.get(self.observation_field), str):
            return observation[self.observation_field]
        text = next((observation[k] for k in TEXT_FIELDS if isinstance(observation.get(k), str)),
                    None)  # fmt: skip
        if text is None:
            raise EnvironmentFailed("env_protocol", f"{self.url}: no text field in the "
                                    f"observation {sorted(observation)}")  # fmt: skip
        return text


def openenv_app(name: str, settings: EnvConfig, max_sessions: int = 64):
    """A FastAPI app serving rlstream environment `name` over OpenEnv's protocol."""
    from openenv.core.env_server.http_server import create_fastapi_app
    from openenv.core.env_server.interfaces import Environment
    from openenv.core.env_server.types import Action, Observation, State

    from rlstream.trainers.datasets import prompt_of_row
    from rlstream.trainers.environments.base import checked_step, open_environment

    class TextAction(Action):
        message: str

    class TextObservation(Observation):
        text: str = ""

    class Served(Environment):
        SUPPORTS_CONCURRENT_SESSIONS = True

        def __init__(self):
            super().__init__()
            self.inner = None
            self._state = State(step_count=0)

        async def reset_async(self, seed=None, episode_id=None, prompt: dict | None = None,
                              **kwargs):  # fmt: skip
            if not prompt:
                raise ValueError("reset needs the episode's prompt: reset(prompt={...})")
            self._state = State(episode_id=episode_id, step_count=0)
            if self.inner is not None:
                await self.inner.close()
            task = prompt_of_row(prompt)  # made per episode: a row's env_options apply here too
            self.inner = open_environment(name, settings, task)
            text = await self.inner.reset(task)
            return TextObservation(text=text, done=False, reward=0.0)

        async def step_async(self, action, timeout_s=None, **kwargs):
            if self.inner is None:
                raise ValueError("step before reset: reset(prompt={...}) starts an episode")
            step = checked_step(await self.inner.step(action.message))
            self._state.step_count += 1
            return TextObservation(text=step.observation, done=step.done, reward=step.reward,
                                   metadata=step.info)  # fmt: skip

        def reset(self, seed=None, episode_id=None, **kwargs):
            raise NotImplementedError("served over WebSocket sessions (reset_async)")

        def step(self, action, timeout_s=None, **kwargs):
            raise NotImplementedError("served over WebSocket sessions (step_async)")

        @property
        def state(self):
            return self._state

    return quiet_disconnects(create_fastapi_app(Served, TextAction, TextObservation,
                                                max_sessions))  # fmt: skip


def quiet_disconnects(app):
    """The ASGI app, less the traceback uvicorn logs for every episode's end: openenv-core's
    server closes a socket its client has already closed, and that raises."""

    async def wrapped(scope, receive, send):
        try:
            await app(scope, receive, send)
        except Exception as exc:
            gone = type(exc).__name__ in ("WebSocketDisconnect", "ClientDisconnected")
            if not (scope["type"] == "websocket" and gone):
                raise

    return wrapped
