"""OpenEnv's protocol both ways, against openenv-core's own client and server.

- `rlstream env serve calculator` is driven by openenv-core's `GenericEnvClient` (no rlstream
  code on the client side).
- `rlstream run` trains against a server written with openenv-core alone (no rlstream import on
  the server side), over the network: the archive shows loss mask 0 on every token the server
  wrote and 1 on every token the policy sampled.
"""

from __future__ import annotations

import asyncio
import json
import random
import socket
import subprocess
import sys
import time

import pytest

from rlstream.connectors.endpoints import Endpoints
from rlstream.connectors.objectstore import ObjectStore
from tests.integration.conftest import RLSTREAM, cli

pytestmark = pytest.mark.integration

SERVER = '''
"""An OpenEnv environment written with openenv-core alone: the policy says something, the
server asks once more, and the episode pays 1 when the second answer repeats the first."""
import sys

import uvicorn
from openenv.core.env_server.http_server import create_fastapi_app
from openenv.core.env_server.interfaces import Environment
from openenv.core.env_server.types import Action, Observation, State


class Say(Action):
    message: str


class Heard(Observation):
    text: str = ""


class Repeat(Environment):
    SUPPORTS_CONCURRENT_SESSIONS = True

    def __init__(self):
        super().__init__()
        self.first, self._state = None, State(step_count=0)

    def reset(self, seed=None, episode_id=None, **kwargs):
        self.first, self._state = None, State(episode_id=episode_id, step_count=0)
        return Heard(text="", done=False, reward=0.0)

    def step(self, action, timeout_s=None, **kwargs):
        self._state.step_count += 1
        if self.first is None:
            self.first = action.message
            return Heard(text="once more:\\n", done=False, reward=0.0)
        return Heard(text="", done=True, reward=float(action.message == self.first))

    @property
    def state(self):
        return self._state


app = create_fastapi_app(Repeat, Say, Heard, max_concurrent_envs=64)
uvicorn.run(app, host="127.0.0.1", port=int(sys.argv[1]), log_level="error")
'''


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start(args: list[str], log) -> subprocess.Popen:
    """A server whose output goes to a file: a pipe nobody reads fills up and stalls it (the
    server logs each closed session)."""
    return subprocess.Popen(args, stdout=log.open("w"), stderr=subprocess.STDOUT)


def wait_for_port(port: int, process: subprocess.Popen, log, timeout_s: float = 60) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        assert process.poll() is None, log.read_text()[-3000:]
        with socket.socket() as s:
            if s.connect_ex(("127.0.0.1", port)) == 0:
                return
        time.sleep(0.2)
    raise TimeoutError(f"nothing listens on {port}")


@pytest.fixture
def served_calculator(tmp_path):
    port, log = free_port(), tmp_path / "serve.log"
    server = start([*RLSTREAM, "env", "serve", "calculator", "--port", str(port)], log)
    try:
        wait_for_port(port, server, log)
        yield f"http://127.0.0.1:{port}"
    finally:
        server.terminate()
        server.wait(timeout=30)


def test_an_openenv_client_plays_an_episode_with_rlstream_env_serve(served_calculator):
    from openenv.core.generic_client import GenericEnvClient

    prompt = {"prompt_id": "p", "text": "12*4=", "task": "calc", "answer": "48"}

    async def play():
        async with GenericEnvClient(base_url=served_calculator) as env:
            first = await env.reset(prompt=prompt)
            called = await env.step({"message": "?12*4"})
            answered = await env.step({"message": "48"})
        async with GenericEnvClient(base_url=served_calculator) as env:
            await env.reset(prompt=prompt)
            wrong = await env.step({"message": "47"})
            with pytest.raises(RuntimeError, match="Server error"):  # no prompt: an error answer
                await env.reset()
        return first, called, answered, wrong

    first, called, answered, wrong = asyncio.run(play())
    assert first.observation == {"text": ""} and not first.done
    assert called.observation == {"text": "48\n"} and not called.done and called.reward == 0.0
    assert answered.done and answered.reward == 1.0
    assert wrong.done and wrong.reward == 0.0


def test_env_servers_plays_a_named_environment_on_its_server_with_each_rows_options(tmp_path):
    """env.servers sends the episodes of prompts that name `world` to `rlstream env serve
    world`, with no change to the rows; a row's own env_options reach the served world."""
    from rlstream.config import EnvConfig
    from rlstream.trainers.environments.base import open_environment
    from rlstream.trainers.environments.openenv import OpenEnvSession
    from rlstream.trainers.envs import Prompt, get_task

    port, log = free_port(), tmp_path / "world.log"
    server = start([*RLSTREAM, "env", "serve", "world", "--port", str(port)], log)
    try:
        wait_for_port(port, server, log)
        settings = EnvConfig(servers=json.dumps({"world": f"http://127.0.0.1:{port}"}))
        walks = (get_task("walk").generate(random.Random(seed), 1) for seed in range(100))
        # a walk up, away from the bottom cell: a step "+" lands one up, a slipped one one down
        walk = next(w for w in walks if 0 < int(w.text.split()[2]) < int(w.answer) - 1)
        slippery = Prompt(**(walk.to_row() | {"metadata": json.dumps(
            {"env_options": {"slip": 1.0}})}))  # fmt: skip

        async def first_step(prompt):
            env = open_environment("world", settings, prompt)
            assert isinstance(env, OpenEnvSession)  # played on the server, not in process
            await env.reset(prompt)
            step = await env.step("+")
            await env.close()
            return step

        start_cell = int(walk.text.split()[2])
        plain, slipped = asyncio.run(first_step(walk)), asyncio.run(first_step(slippery))
    finally:
        server.terminate()
        server.wait(timeout=30)
    assert not plain.done and plain.observation.strip() == str(start_cell + 1)
    assert not slipped.done and slipped.observation.strip() == str(start_cell - 1)


@pytest.fixture(scope="module")
def openenv_run(stack_home, tmp_path_factory):
    out = tmp_path_factory.mktemp("openenv")
    (out / "server.py").write_text(SERVER)
    port, log = free_port(), out / "server.log"
    server = start([sys.executable, str(out / "server.py"), str(port)], log)
    try:
        wait_for_port(port, server, log)
        address = f"http://127.0.0.1:{port}"
        rows = [{"prompt_id": f"say-{i}", "text": f"say {i}:", "task": "exact",
                 "answer": str(i), "environment": address,
                 "split": "heldout" if i % 5 == 0 else "train"} for i in range(20)]  # fmt: skip
        prompts = out / "repeat.jsonl"
        prompts.write_text("".join(json.dumps(r) + "\n" for r in rows))
        summary = out / "summary.json"
        cli(
            "run", "--prompts", str(prompts), "--run-id", "openenv-it", "--rl-steps", "3",
            "--sampler", "uniform", "--out", str(out), "--summary", str(summary),
            "--set", "pretrain.max_steps=20", "--set", "pretrain.batch=32",
            "--set", "eval.prompts=4", "--set", "prompts_per_step=4", "--set", "group_size=4",
            "--set", "target_in_flight=16", "--set", "env.max_turns=2",
            "--set", "rl.max_new_tokens=6", timeout=900,
        )  # fmt: skip
    finally:
        server.terminate()
        server.wait(timeout=30)
    return json.loads(summary.read_text())


def expected_mask(tok, tokens: list[int], spans: list[int]) -> list[int]:
    """0 for each token whose text lies in an environment span of the transcript, else 1 (a
    token with no text, a sampled <pad>, is the policy's)."""
    starts, at = [], 0
    for t in tokens:
        starts.append(at)
        at += len(tok.decode([t]))
    env = [(a, b) for a, b in zip(spans[::2], spans[1::2], strict=True)]
    return [0 if any(a <= s < b for a, b in env) and len(tok.decode([t])) else 1
            for s, t in zip(starts, tokens, strict=True)]  # fmt: skip


def test_rlstream_run_trains_against_a_plain_openenv_server(openenv_run):
    from rlstream.trainers.lm import Tokenizer

    assert openenv_run["completed"] and openenv_run["env_failed_groups"] == 0
    tok = Tokenizer.char()
    archive = ObjectStore(Endpoints.from_env()).read_parquet_prefix("openenv-it/experience/")
    rows = archive.to_pylist()
    assert rows
    answered = 0
    for r in rows:
        text = tok.decode(r["completion_tokens"])
        spans = r["env_spans"] or []
        assert r["loss_mask"] == expected_mask(tok, r["completion_tokens"], spans)
        assert all(text[a:b] == "once more:\n" for a, b in zip(spans[::2], spans[1::2],
                                                               strict=True))  # fmt: skip
        answered += bool(spans)
        if r["stop_reason"] == "done":  # the server's reward: the second answer repeats the first
            first, _, second = text.partition("once more:\n")
            assert r["reward"] == float(first.split("\n")[0] == second.split("\n")[0])
    assert answered == len(rows)  # every episode's first turn got the server's question
