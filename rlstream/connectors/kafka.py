"""Kafka clients over aiokafka, configured for the broker the endpoints name.

- On Apache Kafka (`Endpoints.broker == "kafka"`) producers batch, are idempotent and wait for
  every in-sync replica. On Tansu (or a broker not named) they write one record per Kafka
  record batch (`max_batch_size=1`: Tansu's ListOffsets is wrong for multi-record batches),
  without idempotence (Tansu has none). Either way delivery is at-least-once end to end and
  sinks de-duplicate by `event_id`.
- Topics are created with the endpoints' replication factor (min ISR one less) and, on the
  high-volume topics, time and size retention (`RETENTION`), which Apache Kafka enforces.
- A send the broker refuses (a durable broker whose S3 server is down answers UnknownError) is
  sent again with backoff for the S3 retry budget (`objectstore.retry_budget_s`) before it
  fails: an outage stalls the producer instead of crashing it.
- Consumers never auto-commit: offsets are committed by hand after the side effect.
- Topics are created up front with their final partition count (no CreatePartitions).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Iterable, Sequence

import pyarrow as pa
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition
from aiokafka.admin import AIOKafkaAdminClient, NewTopic
from aiokafka.errors import KafkaError
from aiokafka.partitioner import murmur2
from tenacity import AsyncRetrying, retry_if_exception_type, stop_after_delay, wait_exponential

from rlstream import metrics
from rlstream.connectors.endpoints import Endpoints
from rlstream.connectors.objectstore import retry_budget_s
from rlstream.schemas import DEFAULT_MAX_MESSAGE_BYTES, EventType, all_events, encode

log = logging.getLogger(__name__)

METADATA_MAX_AGE_MS = 5_000
"""How often clients refresh metadata (aiokafka's default: 5 min). A group's leader rebalances
when a subscribed topic's partitions change in it, and a durable broker whose S3 server is down
answers metadata without partitions: the assignment made then leaves a topic's partitions to no
member until the next refresh notices them back (the rollout workers idled 5 min in a chaos
run)."""


def broker_retrying() -> AsyncRetrying:
    """Backoff for sending a message the broker refused again: for the S3 retry budget, as a
    durable broker's outage is its S3 server's."""
    return AsyncRetrying(
        retry=retry_if_exception_type(KafkaError),
        stop=stop_after_delay(retry_budget_s()),
        wait=wait_exponential(multiplier=0.1, max=2),
        reraise=True,
    )


def warn_refused(topic: str, error: BaseException) -> None:
    log.warning("broker refused a send to %s (%r); retrying for up to %.0f s",
                topic, error, retry_budget_s())  # fmt: skip


class TopicConfigError(RuntimeError):
    """An existing topic has a partition count other than the design's."""


def producer_settings(endpoints: Endpoints) -> dict:
    """aiokafka producer settings for the endpoints' broker. Apache Kafka: batched (up to
    1 MiB, 2 ms linger), idempotent, acks from every in-sync replica. Tansu or a broker not
    named: one record per batch (Tansu's ListOffsets needs it), acks from the leader."""
    if endpoints.is_kafka:
        batching = dict(max_batch_size=1 << 20, linger_ms=2, acks="all", enable_idempotence=True)
    else:
        batching = dict(max_batch_size=1, linger_ms=0, acks=1, enable_idempotence=False)
    return dict(
        bootstrap_servers=endpoints.kafka_bootstrap,
        metadata_max_age_ms=METADATA_MAX_AGE_MS,
        max_request_size=DEFAULT_MAX_MESSAGE_BYTES + 64_000,
        **batching,
        **endpoints.kafka_auth(),
    )


def producer(endpoints: Endpoints, **overrides) -> AIOKafkaProducer:
    """An unstarted producer with `producer_settings`, `overrides` on top."""
    return AIOKafkaProducer(**(producer_settings(endpoints) | overrides))


def consumer(
    endpoints: Endpoints, *topics: str, group_id: str | None = None, **overrides
) -> AIOKafkaConsumer:
    """An unstarted consumer that never auto-commits; commit after the side effect."""
    session_ms = endpoints.session_timeout_ms
    settings = dict(
        bootstrap_servers=endpoints.kafka_bootstrap,
        group_id=group_id,
        enable_auto_commit=False,
        auto_offset_reset="earliest",
        session_timeout_ms=session_ms,
        heartbeat_interval_ms=max(100, session_ms // 6),
        rebalance_timeout_ms=max(session_ms, 10_000),
        fetch_max_wait_ms=100,
        max_partition_fetch_bytes=2 * DEFAULT_MAX_MESSAGE_BYTES,
        metadata_max_age_ms=METADATA_MAX_AGE_MS,
        **endpoints.kafka_auth(),
    )
    settings.update(overrides)
    return AIOKafkaConsumer(*topics, **settings)


def admin(endpoints: Endpoints) -> AIOKafkaAdminClient:
    auth = endpoints.kafka_auth()
    return AIOKafkaAdminClient(bootstrap_servers=endpoints.kafka_bootstrap, **auth)


RETENTION = {
    "rollout_requests": "requests",
    "prompt_scores": "requests",
    "rollouts": "rollouts",
    "rewards": "rollouts",
    "experience": "rollouts",
    "dead_letters": "rollouts",
}
"""The high-volume topics (a run's stream, archived to the object store as it goes) get time and
size retention, so a long run's broker stays bounded; prompts, corpus, policy versions and eval
results are the run's record and keep everything."""
RETENTION_MS = 7 * 24 * 3600 * 1000
SEGMENTS_KEPT = 8
"""Kafka drops whole segments and never the one being written: a partition's segments are an
eighth of its size retention, so it holds between 7/8 and 9/8 of it."""


def new_topic(event: EventType, endpoints: Endpoints) -> NewTopic:
    """The topic of `event` as rlstream creates it: its partitions, the endpoints' replication
    (min ISR one less than the factor), retention on the high-volume ones (7 days, or the
    endpoints' `retention_mb` a partition)."""
    factor = endpoints.replication_factor
    configs = {"min.insync.replicas": str(max(1, factor - 1))}
    if event.name in RETENTION:
        size = endpoints.retention_mb << 20
        configs |= {"retention.ms": str(RETENTION_MS), "retention.bytes": str(size),
                    "segment.bytes": str(max(1 << 20, size // SEGMENTS_KEPT))}  # fmt: skip
    return NewTopic(event.topic, event.partitions, replication_factor=factor, topic_configs=configs)


async def wait_for_brokers(bootstrap: str, count: int, timeout_s: float, **auth) -> None:
    """Until `count` brokers answer metadata and a controller is elected (a KRaft cluster that
    just started; `auth`: `Endpoints.kafka_auth()`); a TimeoutError names what was seen last."""
    deadline, seen = asyncio.get_running_loop().time() + timeout_s, "nothing"
    while asyncio.get_running_loop().time() < deadline:
        client = AIOKafkaAdminClient(bootstrap_servers=bootstrap, request_timeout_ms=5_000, **auth)
        try:
            await client.start()
            cluster = await client.describe_cluster()
            seen = f"{len(cluster['brokers'])} brokers, controller {cluster['controller_id']}"
            if len(cluster["brokers"]) >= count and cluster["controller_id"] >= 0:
                return
        except KafkaError as exc:
            seen = repr(exc)
        finally:
            await client.close()
        await asyncio.sleep(0.5)
    raise TimeoutError(f"Kafka at {bootstrap}: {count} brokers not ready in {timeout_s:.0f}s "
                       f"({seen})")  # fmt: skip


async def ensure_topics(
    endpoints: Endpoints, events: Iterable[EventType] | None = None
) -> list[str]:
    """Create every event topic that does not exist yet; return the names created.

    Raises TopicConfigError when an existing topic has the wrong partition count: the design's
    co-partitioning by prompt_id depends on it and this broker cannot add partitions later.
    """
    events = list(all_events() if events is None else events)
    client = admin(endpoints)
    await client.start()
    try:
        existing = set(await client.list_topics())
        missing = [e for e in events if e.topic not in existing]
        if missing:
            await client.create_topics([new_topic(e, endpoints) for e in missing])
        present = [e for e in events if e.topic in existing]
        if present:
            described = await client.describe_topics([e.topic for e in present])
            counts = {d["topic"]: len(d["partitions"]) for d in described}
            for e in present:
                if counts.get(e.topic) != e.partitions:
                    raise TopicConfigError(
                        f"topic {e.topic} has {counts.get(e.topic)} partitions, the design "
                        f"needs {e.partitions}; delete and recreate it"
                    )
        return [e.topic for e in missing]
    finally:
        await client.close()


def partition_for(key: str | bytes, partitions: int) -> int:
    """The partition Kafka's default partitioner picks for `key` (murmur2, as the JVM client)."""
    raw = key.encode() if isinstance(key, str) else key
    return (murmur2(raw) & 0x7FFFFFFF) % partitions


def split_by_partition(
    event: EventType, batch: pa.RecordBatch, partitions: int | None = None
) -> list[tuple[int, pa.RecordBatch]]:
    """Split a batch so each part's rows all belong on one partition by the event's key."""
    n = partitions or event.partitions
    keys = batch.column(event.key).to_pylist()
    parts = [partition_for(str(k), n) for k in keys]
    out = []
    for p in sorted(set(parts)):
        idx = pa.array([i for i, q in enumerate(parts) if q == p], pa.int64())
        out.append((p, batch.take(idx)))
    return out


class EventProducer:
    """Encodes event batches and sends them keyed so a prompt's events share a partition."""

    def __init__(self, endpoints: Endpoints, **overrides):
        self._producer = producer(endpoints, **overrides)
        self.messages = 0
        self.value_bytes = 0

    async def start(self) -> None:
        await self._producer.start()

    async def stop(self) -> None:
        await self._producer.stop()

    async def __aenter__(self) -> EventProducer:
        await self.start()
        return self

    async def __aexit__(self, *exc) -> None:
        await self.stop()

    @property
    def raw(self) -> AIOKafkaProducer:
        return self._producer

    async def send(
        self,
        event: EventType,
        batch: pa.RecordBatch,
        *,
        wait: bool = True,
        topic: str | None = None,
    ) -> list:
        """Send `batch` split by key partition to the event's topic (or `topic`); returns the
        delivery metadata (or the futures when wait=False)."""
        topic = topic or event.topic
        futures, messages = [], []
        for partition, part in split_by_partition(event, batch):
            value, headers = encode(event, part)
            key = str(part.column(event.key)[0].as_py()).encode()
            self.messages += 1
            self.value_bytes += len(value)
            metrics.MESSAGES_PUBLISHED.labels(topic).inc()
            metrics.BYTES_PUBLISHED.labels(topic).inc(len(value))
            metrics.EVENTS_PUBLISHED.labels(topic).inc(part.num_rows)
            messages.append((value, key, partition, headers))
            try:
                futures.append(
                    await self._producer.send(
                        topic, value, key=key, partition=partition, headers=headers
                    )
                )
            except KafkaError as error:  # no metadata from the broker: sent again below
                if not wait:
                    raise
                futures.append(error)
        if not wait:
            return futures
        delivered = []
        for future, message in zip(futures, messages, strict=True):
            try:
                if isinstance(future, KafkaError):
                    raise future
                delivered.append(await future)
            except KafkaError as error:
                delivered.append(await self._send_again(topic, *message, error))
        return delivered

    async def _send_again(self, topic: str, value, key, partition, headers, error) -> object:
        """Send one refused message again, with backoff, until the retry budget is spent."""
        warn_refused(topic, error)
        return await broker_retrying()(self._deliver, topic, value, key, partition, headers)

    async def _deliver(self, topic: str, value, key, partition, headers) -> object:
        sent = await self._producer.send(
            topic, value, key=key, partition=partition, headers=headers
        )
        return await sent

    async def send_encoded(
        self, topic: str, value: bytes, headers: Sequence, key: bytes | None, partition: int
    ):
        return await self._producer.send(
            topic, value, key=key, partition=partition, headers=list(headers)
        )


async def highwaters(endpoints: Endpoints, tps: list[TopicPartition]) -> dict[TopicPartition, int]:
    """The true end offset of each partition: ListOffsets (`end_offsets`) on Apache Kafka;
    elsewhere read from a fetch response (Tansu's ListOffsets is low on s3 storage and for
    batches of several records: INFRA.md)."""
    c = consumer(endpoints, fetch_max_wait_ms=50, max_partition_fetch_bytes=1)
    try:
        await c.start()
        c.assign(tps)
        hint = await c.end_offsets(tps)
        if endpoints.is_kafka:
            return hint
        for tp in tps:
            c.seek(tp, hint[tp])
        for _ in range(100):
            await c.getmany(timeout_ms=50)
            found = {tp: c.highwater(tp) for tp in tps}
            if all(v is not None for v in found.values()):
                return found
        raise TimeoutError("the broker sent no fetch response within 5 s")
    finally:
        await stop_consumer(c)


async def stop_consumer(c: AIOKafkaConsumer) -> None:
    """Stop a consumer that is being dropped, whatever state its broker is in. aiokafka's
    `stop()` can raise the CancelledError of its own fetch task, cancelled in a retry backoff
    while the broker was down: that is not this task being cancelled, and it escaped every
    `except Exception` (the run's live view died of it after a broker kill, frozen for good).
    A real cancellation of this task still propagates."""
    try:
        await c.stop()
    except asyncio.CancelledError:
        task = asyncio.current_task()
        if task is not None and task.cancelling():
            raise
        log.info("a consumer's stop raised its fetch task's cancellation; it is stopped")
    except Exception as exc:  # noqa: BLE001  (a broker that is down: the client is dropped)
        log.info("stopping a consumer: %s", exc)


async def topic_partitions(consumer_: AIOKafkaConsumer, topic: str) -> list[TopicPartition]:
    """The topic's partitions, fetching metadata on first use; [] if the topic does not exist."""
    parts = consumer_.partitions_for_topic(topic)
    if parts is None:
        # the consumer's own metadata covers only what it subscribed to (Tansu answers every
        # topic, Apache Kafka none): ask for all of it, as `consumer.topics()` does
        cluster = await consumer_._client.fetch_all_metadata()
        parts = cluster.partitions_for_topic(topic)
    return [TopicPartition(topic, p) for p in sorted(parts or ())]


async def log_start_offsets(endpoints: Endpoints, topic: str) -> dict[int, int]:
    """Partition -> the first offset the broker still holds: above 0 where retention (or
    DeleteRecords) dropped the records before it."""
    c = consumer(endpoints)
    await c.start()
    try:
        starts = await c.beginning_offsets(await topic_partitions(c, topic))
        return {tp.partition: offset for tp, offset in starts.items()}
    finally:
        await c.stop()


async def group_lag(endpoints: Endpoints, group: str, topic: str) -> int:
    """Messages of `topic` that consumer group `group` has not committed past, summed over the
    partitions (from the log's start where it committed nothing): the backlog KEDA's Kafka
    scaler reads for the same topic and group."""
    c = consumer(endpoints, group_id=group)
    await c.start()
    try:
        tps = await topic_partitions(c, topic)
        if not tps:
            return 0
        starts = await c.beginning_offsets(tps)
        committed = {tp: await c.committed(tp) for tp in tps}
    finally:
        await c.stop()
    ends = await highwaters(endpoints, tps)
    return sum(max(0, ends[tp] - (committed[tp] or starts[tp])) for tp in tps)
