"""Apache Kafka from the project's own install (KRaft, three nodes on loopback): topics
replicated three times with two in sync, batched idempotent producers whose end offsets are
right, a node killed without losing a write, and a missing Java refused in one line."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from rlstream.connectors.kafka import consumer, ensure_topics, producer, topic_partitions
from rlstream.ops.stack.embedded import EmbeddedStack
from rlstream.schemas import get

EXPERIENCE = "experience"

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


@pytest.fixture(scope="module")
def secure_run(tmp_path_factory):
    """A stack whose clients sign in with SCRAM over TLS (`stack up --broker kafka --sasl
    --tls`), and a short run on it from its endpoints, as a user's real Kafka would be used."""
    tmp = tmp_path_factory.mktemp("secure")
    stack = EmbeddedStack(tmp / "sasl", broker="kafka", sasl=True, tls=True)
    stack.start(timeout_s=180)
    try:
        base = {k: v for k, v in os.environ.items() if not k.startswith("RLSTREAM_")}
        base["RLSTREAM_HOME"] = str(tmp / "home")
        run = [sys.executable, "-m", "rlstream.cli", "run", "--rl-steps", "2", "--out",
               str(tmp / "runs"), "--run-id", "scram", "--summary", str(tmp / "s.json"),
               "--set", "pretrain.max_steps=30", "--set", "pretrain.batch=32",
               "--set", "pretrain.warmup_steps=10", "--set", "corpus_docs=1000",
               "--set", "pool_size=200", "--set", "eval.prompts=16",
               "--set", "prompts_per_step=4", "--set", "group_size=4",
               "--set", "loop.rollout_workers=1"]  # fmt: skip
        done = subprocess.run(run, env=base | stack.endpoints.as_env(), capture_output=True,
                              text=True, timeout=600)  # fmt: skip
        yield stack.endpoints, base, tmp, done
    finally:
        stack.stop()


def test_scram_over_tls_trains_and_a_wrong_password_or_ca_is_refused(secure_run):
    """Clients sign in with SCRAM-SHA-256 over TLS. The loop trains with the stack's
    credentials and CA (every process, faust's included); a wrong password, none, or a client
    without the stack's CA is refused, and the command says so in one line."""
    from dataclasses import replace

    eps, base, tmp, done = secure_run
    assert eps.kafka_security_protocol == "SASL_SSL" and eps.kafka_password
    assert "BEGIN CERTIFICATE" in Path(eps.kafka_ssl_cafile or "/nonexistent").read_text()
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    assert json.loads((tmp / "s.json").read_text())["rl_steps"] == 2
    plain = replace(eps, kafka_security_protocol="PLAINTEXT", kafka_sasl_mechanism=None)
    no_ca = replace(eps, kafka_ssl_cafile=None)  # the system's CAs: the stack's is not one
    for bad in (replace(eps, kafka_password="wrong"), plain, no_ca):
        with pytest.raises(Exception, match="bootstrap|authenticat"):
            asyncio.run(asyncio.wait_for(_produce_and_count(bad, "rl.prompts.v1", 1), 60))
    topics = [sys.executable, "-m", "rlstream.cli", "topics"]
    for bad, says in ((replace(eps, kafka_password="wrong"), "RLSTREAM_KAFKA_PASSWORD"),
                      (no_ca, "RLSTREAM_KAFKA_SSL_CAFILE")):  # fmt: skip
        refused = subprocess.run(topics, env=base | bad.as_env(), capture_output=True, text=True,
                                 timeout=120)  # fmt: skip
        assert refused.returncode == 2 and "Traceback" not in refused.stderr
        assert "sign in" in refused.stderr and says in refused.stderr


async def _drop_consumed(endpoints, topic: str, group: str, run_id: str) -> tuple[int, int]:
    """Delete the records of the topic that `group` has consumed in the partition where it
    consumed most (what retention does to the oldest records of a long run); return (records,
    rows of `run_id`) deleted."""
    from aiokafka import TopicPartition
    from aiokafka.admin import RecordsToDelete

    from rlstream.connectors.kafka import admin
    from rlstream.connectors.reading import ReadRange, read_topic
    from rlstream.ops.commands.topics import committed_offsets
    from rlstream.schemas import decode

    tps = [TopicPartition(topic, p) for p in range(get(EXPERIENCE).partitions)]
    committed = await committed_offsets(endpoints, group, tps)
    tp, before = max(committed.items(), key=lambda kv: kv[1] or 0)
    rows = 0
    async for record in read_topic(endpoints, topic, ReadRange(partitions=(tp.partition,))):
        if record.offset < before:
            rows += sum(r["run_id"] == run_id for r in decode(record.value, record.headers)
                        .to_pylist())  # fmt: skip
    client = admin(endpoints)
    await client.start()
    try:
        await client.delete_records({tp: RecordsToDelete(before_offset=before)})
    finally:
        await client.close()
    return before, rows


def test_the_audit_reads_what_the_broker_dropped_from_the_archive(secure_run):
    """`rlstream audit RUN`: after the broker dropped a partition of the experience topic (as
    retention does on a long run), the audit reads those rows from the run's archive and still
    accounts for every request: nothing lost, nothing trained twice."""
    from rlstream.config import Config

    eps, base, tmp, done = secure_run
    assert done.returncode == 0, done.stderr[-2000:]
    trainer = Config.read(tmp / "runs" / "scram" / "config.json").group("trainer")
    dropped, rows = asyncio.run(_drop_consumed(eps, get(EXPERIENCE).topic, trainer, "scram"))
    assert rows > 0
    summary = tmp / "audit.json"
    audit = [sys.executable, "-m", "rlstream.cli", "audit", "scram", "--out", str(tmp / "runs"),
             "--summary", str(summary)]  # fmt: skip
    result = subprocess.run(audit, env=base | eps.as_env(), capture_output=True, text=True,
                            timeout=400)  # fmt: skip
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-2000:]
    figures = json.loads(summary.read_text())
    assert figures["experience_dropped_by_broker"] >= dropped
    assert figures["experience_from_archive"] == rows
    assert figures["experience_lost"] == 0 and figures["trained_twice"] == 0
    assert figures["archive_matches_published"] and figures["audit_passed"]


def test_tls_without_sign_in_serves_a_client_with_the_stack_ca_only(tmp_path):
    """`stack up --broker kafka --tls`: the brokers speak TLS only, with a certificate signed by
    the stack's own CA (made with the JDK's keytool, kept across restarts): a client with that
    CA produces and reads back; one that trusts only the system's CAs, or speaks plaintext,
    is refused."""
    from dataclasses import replace

    stack = EmbeddedStack(tmp_path / "tls", broker="kafka", tls=True)
    stack.start(timeout_s=180)
    try:
        eps = stack.endpoints
        assert eps.kafka_security_protocol == "SSL" and eps.kafka_sasl_mechanism is None
        sent, ends = asyncio.run(asyncio.wait_for(_produce_and_count(eps, "rl.prompts.v1", 5), 60))
        assert (sent, ends) == (5, 5)
        plain = replace(eps, kafka_security_protocol="PLAINTEXT")
        for bad in (replace(eps, kafka_ssl_cafile=None), plain):
            with pytest.raises(Exception, match="bootstrap|certificate|SSL"):
                asyncio.run(asyncio.wait_for(_produce_and_count(bad, "rl.prompts.v1", 1), 60))
    finally:
        stack.stop()


def test_the_assemblers_changelog_is_compacted_in_small_segments(secure_run):
    """A table's changelog on Kafka: compacted (faust), in segments small enough to roll within
    a run and with tombstones kept 10 minutes, so compaction keeps it near the live keys; the
    high-volume topics get size retention in segments an eighth of it."""
    from aiokafka.admin.config_resource import ConfigResource, ConfigResourceType

    from rlstream.connectors.kafka import admin
    from rlstream.streams.app import CHANGELOG_SEGMENT_BYTES, CHANGELOG_TOMBSTONES_KEPT_MS

    eps, _, _, done = secure_run
    assert done.returncode == 0, done.stderr[-2000:]
    changelog = "rlstream-scram-processors-pending_groups-changelog"

    async def configs(topic: str) -> dict[str, str]:
        client = admin(eps)
        await client.start()
        try:
            (response,) = await client.describe_configs(
                [ConfigResource(ConfigResourceType.TOPIC, topic)]
            )
            return {e[0]: e[1] for e in response.resources[0][4]}
        finally:
            await client.close()

    table = asyncio.run(configs(changelog))
    assert table["cleanup.policy"] == "compact"
    assert table["segment.bytes"] == str(CHANGELOG_SEGMENT_BYTES)
    assert table["delete.retention.ms"] == str(CHANGELOG_TOMBSTONES_KEPT_MS)
    experience = asyncio.run(configs(get(EXPERIENCE).topic))
    assert experience["retention.bytes"] == str(eps.retention_mb << 20)
    assert experience["segment.bytes"] == str((eps.retention_mb << 20) // 8)
