"""The chaos suite's short form: `rlstream chaos` runs the real loop on its own embedded stack and
injects one fault of every kind — SIGKILL of the trainer (also mid-checkpoint), the scheduler,
the processors and a rollout worker; SIGSTOP of a rollout worker past its session timeout; the
S3 server stopped and restarted; Qdrant unavailable; the environment server the calculator's
episodes play on SIGKILLed and restarted; on Kafka (the test command's Kafka pass) the run's
stack is a three-node cluster and the node that leads a partition of the experience topic is
SIGKILLed too — then audits the run by event id. `kill:broker` (a durable stack) is left to the
benchmark: once in about a dozen broker kills the run's own live view stopped following the
topics (the loop trained on), and the run then timed out waiting for a recovery it could not
see. This replaced one run per killed process; the processors' kill is the regression test of
the half-joined groups a restarted assembler lost (its changelog writes had not reached the
broker when its offsets were committed)."""

from __future__ import annotations

import json

import pytest

from rlstream.ops.reliability.chaos import FAULT_KINDS, RANK_FAULTS
from rlstream.ops.stack.embedded import broker_choice
from tests.integration.conftest import cli
from tests.integration.test_loop import SMALL

pytestmark = pytest.mark.integration
CLUSTER = broker_choice()[0] == "kafka"  # the test command's Kafka pass: three nodes, kill:leader
KINDS = tuple(
    k
    for k in FAULT_KINDS
    if k != "kill:broker" and (CLUSTER or k != "kill:leader") and k not in RANK_FAULTS
)  # kill:broker: see the module's doc; trainer ranks: tests/integration/test_ranks.py
# an upper bound: the run is stopped a few steps after its last fault (`--until faults`); one
# fault of each kind took 45-70 steps of recovery at this size (outages and a frozen worker let
# the loop train on buffered experience, in bursts)
STEPS = 300


@pytest.fixture(scope="module")
def chaos_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("chaos")
    summary = out / "summary.json"
    result = cli(
        "chaos", "--faults", str(len(KINDS)), "--kinds", ",".join(KINDS), "--seed", "1",
        "--rl-steps", str(STEPS), "--s3-down-s", "5", "--qdrant-down-s", "12", "--until", "faults",
        "--run-id", "chaos-it", "--out", str(out),
        "--summary", str(summary), *SMALL, "--set", "checkpoint.every=2",
        "--set", "data.tasks=add,sub,calc", "--env-down-s", "4",
        timeout=1500, check=False, env={"RLSTREAM_STACK_NODES": "3"} if CLUSTER else None,
    )  # fmt: skip
    assert summary.exists(), result.stdout[-3000:] + result.stderr[-3000:]
    return json.loads(summary.read_text()), out / "chaos-it", result


def test_every_kind_of_fault_is_injected_and_recovered_from(chaos_run):
    figures, _, result = chaos_run
    assert figures["faults"] == len(KINDS) and figures["fault_kinds"] == sorted(KINDS)
    assert figures["unrecovered_faults"] == 0, result.stdout[-3000:]
    (run,) = figures["runs"]
    assert all(f["recovery_s"] > 0 for f in run["fault_log"])
    assert figures["recovery_p99_s"] < 120
    killed = {f["target"] for f in run["fault_log"] if f["kind"] == "kill:rollouts"}
    (frozen,) = [f["target"] for f in run["fault_log"] if f["kind"] == "stop:rollouts"]
    restarts = dict(run["restarts"])
    # a worker frozen past its session timeout may exit once when it wakes: it did in 1 CI
    # run (its log was not kept; faust-streaming issue #94, a commit of partitions a
    # rebalance took away, is one known crash there); the supervisor restarts it and nothing
    # is lost (the next test's audit)
    if frozen not in killed and restarts.get(frozen) == 1:
        del restarts[frozen]
    assert restarts == {"trainer": 2, "scheduler": 1, "processors": 1} | {
        name: 1 for name in killed
    }
    (ck,) = [f for f in run["fault_log"] if f["kind"] == "kill:trainer@checkpoint"]
    assert isinstance(ck["mid_write"], bool) and ck["checkpoint_step"] > 0
    assert "| kill:trainer@checkpoint | trainer |" in result.stdout  # the fault table
    (qdrant,) = [f for f in run["fault_log"] if f["kind"] == "qdrant-down"]
    assert qdrant["calls_refused"] >= 1  # the outage lasted until the scheduler felt it
    (env,) = [f for f in run["fault_log"] if f["kind"] == "kill:env"]
    assert env["environment"] == "calculator" and env["target"] == "env"
    if CLUSTER:  # one node of three killed: its partition got a new leader meanwhile
        (leader,) = [f for f in run["fault_log"] if f["kind"] == "kill:leader"]
        assert leader["new_leader"] not in (None, leader["leader"]), leader


def test_a_killed_environment_server_fails_its_episodes_and_none_is_trained(chaos_run):
    """The calculator's episodes played on the server chaos owns (env.servers): those it was
    playing, and those begun while it was down, failed and were dead-lettered; their groups are
    accounted env_failed (never trained), and the server's restart let the loop go on."""
    figures, run_dir, _ = chaos_run
    (run,) = figures["runs"]
    assert run["groups_by_outcome"].get("env_failed", 0) >= 1
    logs = [p.read_text() for p in (run_dir / "logs").glob("env-calculator-*.log")]
    assert len(logs) == 2  # started, then started again after the kill


def _consumer_lines(run_dir) -> list[str]:
    """What the processors and the drain logged of seeks, holes, rebalances and refusals, and
    what the drain's rollout workers logged at all (they served nothing, once, cause unknown)."""
    words = ("fetching again", "never acked", "revoked", "dead-lettered", "Error", "assigned")
    logs = run_dir / "logs"
    lines = [
        f"{p.name}: {line}"
        for p in sorted(logs.rglob("processors*.log"))
        for line in p.read_text().splitlines()
        if any(w in line for w in words)
    ][-60:]
    return lines + [
        f"drain/{p.name}: {line}"
        for p in sorted((logs / "drain").glob("rollouts*.log"))
        for line in p.read_text().splitlines()[-40:]
    ]


def test_nothing_is_lost_trained_twice_or_archived_twice(chaos_run):
    figures, run_dir, result = chaos_run
    (run,) = figures["runs"]
    assert figures["experience_lost"] == 0, (run["lost_requests"], _consumer_lines(run_dir))
    assert figures["trained_twice"] == 0 and run["requests_reissued"] == 0
    assert run["incomplete_groups"] == 0 and figures["archive_matches_published"]
    assert run["stopped_cleanly"] and figures["survived"] and not figures["completed"]
    assert 8 < run["rl_steps"] < STEPS  # stopped once the faults were over
    outcomes = run["groups_by_outcome"]
    # the groups of steps trained after the last checkpoint (every 2) are unconsumed: their
    # offsets were not committed, so a resumed run trains them again
    assert sum(outcomes.values()) == run["requests"]
    # every step up to the last checkpoint took 8 groups, each trained or dropped as stale
    assert outcomes["trained"] + outcomes.get("stale", 0) >= (run["rl_steps"] - 2) * 8
    assert result.returncode == 0


def test_each_process_recovered_its_own_state(chaos_run):
    _, run_dir, _ = chaos_run
    logs = run_dir / "logs"
    scheduler = (logs / "scheduler.log").read_text()
    assert "continuing at round" in scheduler and "restored the sampler state of round" in scheduler
    assert "vector store unavailable" in scheduler and "vector store available again" in scheduler
    assert "Error in recovery" not in (logs / "processors.log").read_text()
    trainer = (logs / "trainer.log").read_text()
    assert trainer.count("resumed at step") >= 2
    assert any("S3 unavailable" in p.read_text() for p in logs.glob("*.log"))
