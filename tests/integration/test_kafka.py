"""Apache Kafka from the project's own install (KRaft, three nodes on loopback): topics
replicated three times with two in sync, batched idempotent producers whose end offsets are
right, a node killed without losing a write, and a missing Java refused in one line."""

from __future__ import annotations

import asyncio
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
