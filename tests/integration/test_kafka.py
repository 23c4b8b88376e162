"""Apache Kafka from the project's own install (KRaft, three nodes on loopback): topics
replicated three times with two in sync, batched idempotent producers whose end offsets are
right, a node killed without losing a write, and a missing Java refused in one line."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys

import pytest

from rlstream.connectors.kafka import consumer, ensure_topics, producer, topic_partitions
from rlstream.ops.stack.embedded import EmbeddedStack

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    stack = EmbeddedStack(tmp_path_factory.mktemp("kafka3"), broker="kafka", nodes=3)
    stack.start(timeout_s=180)
    yield stack
    stack.stop()


async def _replication(endpoints, topic: str) -> tuple[list[int], str]:
    from aiokafka.admin import AIOKafkaAdminClient
    from aiokafka.admin.config_resource import ConfigResource, ConfigResourceType

    client = AIOKafkaAdminClient(bootstrap_servers=endpoints.kafka_bootstrap)
    await client.start()
    try:
        (described,) = await client.describe_topics([topic])
        replicas = [len(p["replicas"]) for p in described["partitions"]]
        resource = ConfigResource(ConfigResourceType.TOPIC, topic, {"min.insync.replicas": None})
        (response,) = await client.describe_configs([resource])
        entries = {e[0]: e[1] for e in response.resources[0][4]}
        return replicas, entries["min.insync.replicas"]
    finally:
        await client.close()


async def _produce_and_count(endpoints, topic: str, n: int) -> tuple[int, int]:
    p = producer(endpoints)
    await p.start()
    try:
        futures = [await p.send(topic, f"m{i}".encode(), key=str(i).encode()) for i in range(n)]
        await p.flush()
        batches = {(m.partition, m.offset) for m in await asyncio.gather(*futures)}
    finally:
        await p.stop()
    c = consumer(endpoints)
    await c.start()
    try:
        ends = await c.end_offsets(await topic_partitions(c, topic))
    finally:
        await c.stop()
    return len(batches), sum(ends.values())


def test_topics_are_replicated_three_times_with_two_in_sync(cluster):
    endpoints = cluster.endpoints
    assert endpoints.broker == "kafka" and endpoints.replication_factor == 3
    assert len(endpoints.kafka_bootstrap.split(",")) == 3
    replicas, min_isr = asyncio.run(_replication(endpoints, "rl.rollouts.v1"))
    assert replicas == [3, 3, 3, 3] and min_isr == "2"


def test_batched_idempotent_producers_leave_end_offsets_right(cluster):
    endpoints = cluster.endpoints
    sent, ended = asyncio.run(_produce_and_count(endpoints, "rl.rewards.v1", 500))
    assert sent == 500 and ended == 500  # many records per batch, ListOffsets still right


def test_a_killed_node_loses_no_acknowledged_write(cluster):
    """acks=all with min ISR 2: with one of three nodes SIGKILLed, writes go on, and every
    acknowledged one is read back."""
    endpoints = cluster.endpoints
    before = asyncio.run(_produce_and_count(endpoints, "rl.experience.v2", 100))[1]
    cluster.kill_server("kafka-3")
    try:
        after = asyncio.run(asyncio.wait_for(
            _produce_and_count(endpoints, "rl.experience.v2", 100), timeout=120))  # fmt: skip
        assert after[1] == before + 100
    finally:
        cluster.start_server("kafka-3", timeout_s=120)
    asyncio.run(ensure_topics(endpoints))  # the node is back: the cluster serves metadata


def test_a_missing_java_is_one_line_naming_the_package(tmp_path):
    env = {"HOME": os.environ["HOME"], "PATH": os.path.dirname(sys.executable),
           "RLSTREAM_HOME": str(tmp_path / "home"),
           "RLSTREAM_CACHE": str(tmp_path / "cache")}  # fmt: skip
    args = [sys.executable, "-m", "rlstream.cli", "stack", "up", "--broker", "kafka"]
    result = subprocess.run(args, capture_output=True, text=True, env=env, timeout=60)
    assert result.returncode == 2 and "Traceback" not in result.stderr
    assert "apt-get install openjdk-17-jre-headless" in result.stderr


def test_a_restarted_stack_keeps_its_log(tmp_path):
    """A stopped embedded Kafka starts again on new ports with what it had written (a stopped
    run on it can be resumed; Tansu's memory log cannot)."""
    first = EmbeddedStack(tmp_path / "stack", broker="kafka")
    first.start(timeout_s=180)
    try:
        written = asyncio.run(_produce_and_count(first.endpoints, "rl.prompts.v1", 50))[1]
    finally:
        first.stop()
    again = EmbeddedStack(tmp_path / "stack", broker="kafka")
    again.start(timeout_s=180)
    try:
        ended = asyncio.run(_produce_and_count(again.endpoints, "rl.prompts.v1", 1))[1]
        assert written == 50 and ended == written + 1
    finally:
        again.stop()


def test_bench_broker_compares_tansu_and_kafka_in_one_run(tmp_path):
    summary = tmp_path / "brokers.json"
    args = [sys.executable, "-m", "rlstream.cli", "bench", "broker", "--brokers", "tansu,kafka",
            "--messages", "200", "--repeats", "1", "--summary", str(summary)]  # fmt: skip
    env = {k: v for k, v in os.environ.items() if not k.startswith("RLSTREAM_")}
    result = subprocess.run(args, capture_output=True, text=True, env=env, timeout=600)
    assert result.returncode == 0, result.stderr[-2000:]
    assert "brokers compared" in result.stdout
    figures = json.loads(summary.read_text())
    for broker in ("tansu", "kafka"):
        assert figures[broker]["raw_rows_per_s"] > 0 and figures[broker]["broker_rss_mb"] > 10


def test_scram_the_right_password_trains_and_a_wrong_one_is_one_line(tmp_path):
    """`stack up --broker kafka --sasl`: clients sign in with SCRAM-SHA-256. The loop trains
    with the stack's credentials (every process, faust's included); a wrong password, or none,
    is refused, and the command says so in one line."""
    from dataclasses import replace

    stack = EmbeddedStack(tmp_path / "sasl", broker="kafka", sasl=True)
    stack.start(timeout_s=180)
    try:
        eps = stack.endpoints
        assert eps.kafka_security_protocol == "SASL_PLAINTEXT" and eps.kafka_password
        base = {k: v for k, v in os.environ.items() if not k.startswith("RLSTREAM_")}
        base["RLSTREAM_HOME"] = str(tmp_path / "home")
        run = [sys.executable, "-m", "rlstream.cli", "run", "--rl-steps", "2", "--out",
               str(tmp_path / "runs"), "--run-id", "scram", "--summary", str(tmp_path / "s.json"),
               "--set", "pretrain.max_steps=30", "--set", "pretrain.batch=32",
               "--set", "pretrain.warmup_steps=10", "--set", "corpus_docs=1000",
               "--set", "pool_size=200", "--set", "eval.prompts=16",
               "--set", "prompts_per_step=4", "--set", "group_size=4",
               "--set", "loop.rollout_workers=1"]  # fmt: skip
        done = subprocess.run(run, env=base | eps.as_env(), capture_output=True, text=True,
                              timeout=600)  # fmt: skip
        assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
        assert json.loads((tmp_path / "s.json").read_text())["rl_steps"] == 2
        plain = replace(eps, kafka_security_protocol="PLAINTEXT", kafka_sasl_mechanism=None)
        for bad in (replace(eps, kafka_password="wrong"), plain):
            with pytest.raises(Exception, match="bootstrap|authenticat"):
                asyncio.run(asyncio.wait_for(_produce_and_count(bad, "rl.prompts.v1", 1), 60))
        topics = [sys.executable, "-m", "rlstream.cli", "topics"]
        wrong = base | replace(eps, kafka_password="wrong").as_env()
        refused = subprocess.run(topics, env=wrong, capture_output=True, text=True, timeout=120)
        assert refused.returncode == 2 and "Traceback" not in refused.stderr
        assert "sign in" in refused.stderr and "RLSTREAM_KAFKA_PASSWORD" in refused.stderr
    finally:
        stack.stop()
