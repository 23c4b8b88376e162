"""The embedded stack's lifecycle: no orphans, no second broker, memory reported."""

from __future__ import annotations

import json
import os
import signal
import time

import pytest

from rlstream.ops.stack import procs
from rlstream.ops.stack.supervisor import read_state
from tests.integration.conftest import cli

pytestmark = pytest.mark.integration  # each test starts its own stack


def _all_ports(state) -> set[int]:
    ports = set()
    for s in state["servers"]:
        ports |= procs.listening_ports(s["pid"])
    return ports


def test_up_twice_then_down_leaves_nothing_behind(tmp_path):
    env = {"RLSTREAM_HOME": str(tmp_path)}
    first = cli("stack", "up", env=env)
    assert "stack started" in first.stdout
    state = read_state(tmp_path)
    broker = next(s for s in state["servers"] if s["name"] == "tansu")
    ports = _all_ports(state)
    assert broker["port"] in ports and len(ports) >= 2

    second = cli("stack", "up", env=env)
    assert "already running" in second.stdout
    again = read_state(tmp_path)
    assert again["supervisor_pid"] == state["supervisor_pid"]
    assert [s["pid"] for s in again["servers"]] == [s["pid"] for s in state["servers"]]

    status = json.loads(cli("stack", "status", "--json", env=env).stdout)
    assert {s["server"] for s in status["servers"]} == {"tansu", "seaweedfs"}
    assert all(s["alive"] and s["rss_mb"] > 0 for s in status["servers"])
    assert status["total_rss_mb"] == round(sum(s["rss_mb"] for s in status["servers"]), 1)

    cli("stack", "down", env=env)
    pids = [state["supervisor_pid"]] + [s["pid"] for s in state["servers"]]
    assert not any(procs.pid_alive(p) for p in pids)
    assert not any(procs.port_open(p) for p in ports)
    assert not (tmp_path / "endpoints.json").exists()


def test_servers_die_with_a_crashed_supervisor(tmp_path):
    env = {"RLSTREAM_HOME": str(tmp_path)}
    cli("stack", "up", env=env)
    state = read_state(tmp_path)
    os.kill(state["supervisor_pid"], signal.SIGKILL)
    pids = [s["pid"] for s in state["servers"]]
    assert procs.wait_until(lambda: not any(procs.pid_alive(p) for p in pids), 10)
    restarted = cli("stack", "up", env=env)  # stale state is cleared, a fresh stack starts
    assert "stack started" in restarted.stdout
    cli("stack", "down", env=env)


def test_status_without_a_stack_says_so(tmp_path):
    result = cli("stack", "status", env={"RLSTREAM_HOME": str(tmp_path)}, check=False)
    assert result.returncode == 1 and "no stack is running" in result.stdout


def test_durable_mode_keeps_the_broker_log_in_s3(tmp_path):
    env = {"RLSTREAM_HOME": str(tmp_path)}
    cli("stack", "up", "--durable", env=env)
    try:
        state = read_state(tmp_path)
        assert state["durable"] is True
        lines = tmp_path / "p.jsonl"
        lines.write_text('{"prompt_id": "d1", "text": "1+1=", "task": "add"}\n')
        cli("publish", str(lines), env=env)
        time.sleep(0.5)
        from rlstream.connectors.endpoints import Endpoints
        from rlstream.connectors.objectstore import ObjectStore

        keys = ObjectStore(Endpoints.from_state_file(tmp_path), "tansu").list()
        assert keys, "Tansu wrote nothing to its S3 bucket"
    finally:
        cli("stack", "down", env=env)


def test_a_follower_reads_every_record_once_across_a_broker_kill(tmp_path):
    """The run's live view, the trainer and the scheduler follow topics with `follow_run`;
    a broker killed and restarted (durable) must not end the follow, skip or repeat a record.
    The live view's rate sampler lives through it too (a stopped consumer's leaked
    CancelledError killed it once, and the view froze for the rest of a chaos run)."""
    import asyncio
    import time

    from rlstream.connectors.kafka import EventProducer
    from rlstream.connectors.reading import follow_run
    from rlstream.ops.launcher.watch import RunWatcher
    from rlstream.ops.stack.embedded import EmbeddedStack
    from rlstream.schemas import get, rows_to_batch

    evals, run_id, n = get("eval_results"), "follow-kill", 40
    with EmbeddedStack(tmp_path / "stack", durable=True) as stack:
        watcher = RunWatcher(stack.endpoints, run_id).start()
        restarted = {}

        async def main() -> list[int]:
            seen: list[int] = []

            async def follow():
                async for found in follow_run(stack.endpoints, [evals.topic], run_id):
                    seen.extend(r["step"] for r in found.get("eval_results", []))
                    if len(seen) >= n:
                        return

            follower = asyncio.create_task(follow())
            async with EventProducer(stack.endpoints) as producer:
                for step in range(n):
                    if step == n // 2:
                        await asyncio.sleep(1.0)  # the follower has read the first half
                        stack.kill_server("tansu")
                        await asyncio.sleep(5.0)  # the view samples highwaters every 2 s
                        # on this thread: a server dies with the thread that started it
                        # (PR_SET_PDEATHSIG), and a to_thread worker ends with asyncio.run
                        stack.start_server("tansu")
                        restarted["at"] = time.time()
                    row = {"step": step, "task": "all", "metric": "greedy", "value": 0.5, "n": 1}
                    await producer.send(evals, rows_to_batch(evals, [row], run_id=run_id))
            await asyncio.wait_for(follower, 60)
            return seen

        seen = asyncio.run(main())
        time.sleep(3.0)
        alive = watcher._thread.is_alive()
        watcher.stop()
    assert seen == list(range(n)) and restarted
    assert alive  # the view's thread lived through the kill (it died of the leak 1 run in 2)
    assert [r["step"] for r in watcher.view.evals] == list(range(n))  # and followed past it
    after = [t for t, _ in watcher.view.throughput if t > restarted["at"]]
    assert after, "the view sampled no throughput after the broker came back"
