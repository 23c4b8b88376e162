"""Environments that fail, through one live loop: a user's environment (imported by path) that
times out, raises, closes its socket, pays a NaN reward or answers what is not a Step; remote
ones, a server that answers with malformed JSON, one that closes the socket mid-episode, and an
`rlstream env serve` killed mid-run and started again. Each affected episode is dead-lettered
with its kind, none of them is trained, and the run completes, training on the fine episodes
and on those the restarted server played."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import sys
import time

import pytest

from rlstream.connectors.endpoints import Endpoints
from rlstream.connectors.objectstore import ObjectStore
from rlstream.ops.launcher.childrun import Live
from rlstream.ops.launcher.figures import _run_rows
from rlstream.ops.reliability.chaos_faults import pid_of
from rlstream.streams.experience_checks import ledger_prefix
from tests.integration.conftest import RLSTREAM
from tests.integration.test_environments import FAILS, FLAKY
from tests.integration.test_openenv import free_port, start, wait_for_port

pytestmark = pytest.mark.integration
RUN = "remote-failures-it"

BROKEN = '''
"""OpenEnv's WebSocket path, misbehaving on purpose: `garbage` answers every message with
text that is not JSON; `hangup` answers reset properly and closes the socket at the first step."""
import asyncio
import json
import sys

from websockets.asyncio.server import serve

MODE, PORT = sys.argv[1], int(sys.argv[2])


async def session(ws):
    async for raw in ws:
        kind = json.loads(raw).get("type")
        if MODE == "garbage":
            await ws.send("{this is not json")
        elif kind == "reset":
            await ws.send(json.dumps({"type": "observation", "data": {
                "observation": {"text": ""}, "reward": 0.0, "done": False}}))
        elif kind == "step":
            await ws.close()
            return


async def main():
    async with serve(session, "127.0.0.1", PORT):
        await asyncio.Future()


asyncio.run(main())
'''


@pytest.fixture(scope="module")
def remote_run(stack_home, tmp_path_factory):
    out = tmp_path_factory.mktemp("remote")
    (out / "broken.py").write_text(BROKEN)
    ports = {name: free_port() for name in ("garbage", "hangup", "calculator")}
    servers = {
        name: start([sys.executable, str(out / "broken.py"), name, str(ports[name])],
                    out / f"{name}.log")
        for name in ("garbage", "hangup")
    }  # fmt: skip
    serve = [*RLSTREAM, "env", "serve", "calculator", "--port", str(ports["calculator"])]
    servers["calculator"] = start(serve, out / "calculator.log")
    for name, server in servers.items():
        wait_for_port(ports[name], server, out / f"{name}.log")
    address = {name: f"http://127.0.0.1:{port}" for name, port in ports.items()}
    rows = [{"prompt_id": f"calc-{a}-{b}", "text": f"{a}*{b}=", "task": "calc",
             "answer": str(a * b), "environment": address["calculator"],
             "split": "train" if (a + b) % 6 else "heldout"}
            for a in range(10, 16) for b in range(2, 8)]  # fmt: skip
    rows += [{"prompt_id": f"{name}-{i}", "text": f"say {i}:", "task": "exact", "answer": "x",
              "environment": address[name], "split": "train"}
             for name in ("garbage", "hangup") for i in range(4)]  # fmt: skip
    (out / "flaky.py").write_text(FLAKY)
    flaky = f"{out}/flaky.py:Flaky"
    rows += [{"prompt_id": f"{fail or 'fine'}-{i}", "text": f"say {i}:", "task": "exact",
              "answer": "x", "environment": flaky, "fail": fail, "split": "train"}
             for fail in ("", "", *FAILS) for i in range(4)]  # fmt: skip
    prompts = out / "remote.jsonl"
    prompts.write_text("".join(json.dumps(r) + "\n" for r in rows))
    summary = out / "summary.json"
    args = [*RLSTREAM, "run", "--prompts", str(prompts), "--run-id", RUN, "--rl-steps", "10",
            "--sampler", "uniform", "--out", str(out), "--summary", str(summary),
            "--set", "pretrain.max_steps=30", "--set", "pretrain.batch=32",
            "--set", "eval.prompts=4", "--set", "eval.interval=3", "--set", "prompts_per_step=4",
            "--set", "group_size=4", "--set", "target_in_flight=16", "--set", "env.max_turns=3",
            "--set", "env.step_timeout_s=2", "--set", "env.max_failed_groups=0"]  # fmt: skip
    log = out / "run.log"
    run = start(args, log)
    restarted_at = None
    live = Live(out / RUN / "live.json")
    try:
        _wait(lambda: live.phase() == "rl" or run.poll() is not None, 500, "the RL phase")
        # the trainer is paused while the calculator server is down: the scheduler issues what
        # it may ahead of the trainer, the episodes the server would play fail, and the rest
        # of the run's requests come after the restart, however fast the loop goes
        trainer = pid_of(run.pid, "trainer")
        os.kill(trainer, signal.SIGSTOP)
        try:
            servers["calculator"].kill()  # mid-run: its sessions drop, new ones are refused
            servers["calculator"].wait()
            _wait(_calc_failures, 300, "a calculator episode failed")
            servers["calculator"] = start(serve, out / "calculator-2.log")
            wait_for_port(ports["calculator"], servers["calculator"], out / "calculator-2.log")
            restarted_at = time.time()
        finally:
            os.kill(trainer, signal.SIGCONT)
        run.wait(timeout=700)
    finally:
        run.kill()
        for server in servers.values():
            server.kill()
    assert run.returncode == 0, log.read_text()[-3000:]
    return json.loads(summary.read_text()), restarted_at


def _wait(predicate, timeout_s: float, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        assert time.monotonic() < deadline, f"no {what} within {timeout_s:.0f} s"
        time.sleep(0.5)


def _calc_failures() -> list[dict]:
    """The calculator episodes dead-lettered as env_closed (its server down) so far."""
    endpoints = Endpoints.from_env()
    prompt_of = {r["request_id"]: r["prompt_id"]
                 for r in asyncio.run(_run_rows(endpoints, "rollout_requests", RUN))}  # fmt: skip
    return [letter for letter in asyncio.run(_run_rows(endpoints, "dead_letters", RUN))
            if letter["error_kind"] == "env_closed"
            and prompt_of.get(letter["reason"].split()[1], "").startswith("calc")]  # fmt: skip


def _episode_failures(endpoints) -> dict[str, set[str]]:
    """Prompt id -> the kinds its episodes were dead-lettered with."""
    prompt_of = {r["request_id"]: r["prompt_id"]
                 for r in asyncio.run(_run_rows(endpoints, "rollout_requests", RUN))}  # fmt: skip
    by_prompt: dict[str, set[str]] = {}
    for letter in asyncio.run(_run_rows(endpoints, "dead_letters", RUN)):
        if letter["source_topic"] == "rl.rollouts.v1" and letter["error_kind"].startswith("env_"):
            prompt_id = prompt_of[letter["reason"].split()[1]]  # "request <id> sample <k> ..."
            by_prompt.setdefault(prompt_id, set()).add(letter["error_kind"])
    return by_prompt


def test_malformed_json_and_a_closed_socket_are_dead_lettered_by_kind(remote_run):
    figures, _ = remote_run
    assert figures["completed"] and figures["env_failed_groups"] > 0
    kinds: dict[str, set[str]] = {}
    for prompt_id, failed in _episode_failures(Endpoints.from_env()).items():
        kinds.setdefault(prompt_id.split("-")[0], set()).update(failed)
    assert kinds.get("garbage") == {"env_protocol"}, kinds
    assert kinds.get("hangup") == {"env_closed"}, kinds


def test_a_killed_environment_server_fails_its_episodes_and_the_run_trains_on(remote_run):
    figures, restarted_at = remote_run
    endpoints = Endpoints.from_env()
    requests = asyncio.run(_run_rows(endpoints, "rollout_requests", RUN))
    prompt_of = {r["request_id"]: r["prompt_id"] for r in requests}
    ledger = ObjectStore(endpoints).read_parquet_prefix(ledger_prefix(RUN)).to_pylist()
    trained = {prompt_of[e["request_id"]] for e in ledger if e["outcome"] == "trained"}
    failed = {prompt_of[e["request_id"]] for e in ledger if e["outcome"] == "env_failed"}
    assert trained and all(p.startswith(("calc", "fine")) for p in trained)  # never a broken one's
    assert {p.split("-")[0] for p in failed} >= {"garbage", "hangup"}
    assert _calc_failures(), "no calculator episode failed while its server was down"
    experience = asyncio.run(_run_rows(endpoints, "experience", RUN))
    after = [r for r in experience if r["prompt_id"].startswith("calc")
             and r["produced_at"].timestamp() > restarted_at]  # fmt: skip
    assert after, "nothing was trained from the restarted server"
    assert figures["rl_steps"] == 10


def test_a_failing_environment_is_dead_lettered_by_kind_and_never_trained(remote_run):
    """The user's environment's failures, each with its own kind; a fine prompt's episodes are
    never dead-lettered, a failing prompt's never trained."""
    figures, _ = remote_run
    assert figures["completed"] and figures["env_failed_groups"] > 0
    endpoints = Endpoints.from_env()
    prompt_of = {r["request_id"]: r["prompt_id"]
                 for r in asyncio.run(_run_rows(endpoints, "rollout_requests", RUN))}  # fmt: skip
    by_prompt = {prompt_id: kinds for prompt_id, kinds in _episode_failures(endpoints).items()
                 if prompt_id.split("-")[0] in (*FAILS, "fine")}  # fmt: skip
    assert by_prompt, "no episode of the user's environment was dead-lettered"
    for prompt_id, kinds in by_prompt.items():
        assert kinds == {FAILS[prompt_id.split("-")[0]]}, (prompt_id, kinds)  # never a fine one
    ledger = ObjectStore(endpoints).read_parquet_prefix(ledger_prefix(RUN)).to_pylist()
    failed = {prompt_of[e["request_id"]] for e in ledger if e["outcome"] == "env_failed"}
    trained = {prompt_of[e["request_id"]] for e in ledger if e["outcome"] == "trained"}
    assert {p.split("-")[0] for p in failed} & set(FAILS)
    assert any(p.startswith("fine") for p in trained)
