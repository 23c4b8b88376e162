"""faust-streaming apps configured for the Tansu broker, and the glue every agent shares.

INFRA.md: faust runs on Tansu with topics pre-created, a short session timeout, one record per
producer batch (correct offsets for table recovery) and at-least-once processing (the broker has
no transactions). Message values stay raw bytes: the Arrow codec, not faust, owns the format.
"""

from __future__ import annotations

import logging
import os
import tempfile
from collections.abc import Mapping
from pathlib import Path

import faust
import mode
import pyarrow as pa
from aiokafka.errors import KafkaError

from rlstream import metrics
from rlstream.connectors.deadletter import dead_letter_batch
from rlstream.connectors.endpoints import Endpoints
from rlstream.connectors.kafka import (
    METADATA_MAX_AGE_MS,
    broker_retrying,
    split_by_partition,
    warn_refused,
)
from rlstream.schemas import Decoded, DecodeError, EventType, decode, encode, get
from rlstream.streams import transport

log = logging.getLogger(__name__)


def data_root() -> Path:
    """Where faust apps keep local data: $RLSTREAM_FAUST_DIR (a run sets it to its own
    directory), else a folder in the temp directory."""
    root = os.environ.get("RLSTREAM_FAUST_DIR")
    path = Path(root) if root else Path(tempfile.gettempdir()) / "rlstream-faust"
    path.mkdir(parents=True, exist_ok=True)  # faust makes only the last level
    return path


class ProcessedEvent(faust.Event):
    """An event whose ack counts only once its agent processed it (`done`).

    faust's stream drops a message fetched before a rebalance, or while flow control is
    suspended during recovery, and acks it anyway: the next commit moves past a message no agent
    saw, and it is lost (`rlstream chaos` found a restarted processors process losing rollouts
    this way: neither scored nor joined, their offsets committed). Agents iterate
    `stream.noack()` and call `done(stream, event)` (or set `processed` before `take_events`
    acks a batch); the skip's ack is a no-op, so the message stays uncommitted and is fetched
    again from the committed offset."""

    processed = False

    def ack(self) -> bool:
        return super().ack() if self.processed else False


async def done(stream, event: ProcessedEvent) -> None:
    """Ack an event the agent has processed (its table writes and sends already settled)."""
    event.processed = True
    await stream.ack(event)


class Worker(faust.Worker):
    """faust's worker, keeping the process's command line: with setproctitle installed, faust
    retitles it `[Faust:Worker] -init- ...`, which hides which of the run's processes it is
    from `ps` and from the tools that find them by module (`rlstream chaos`)."""

    def _setproctitle(self, info: str, *, ident: str = "") -> None:
        return None


def make_app(app_id: str, endpoints: Endpoints, **overrides) -> faust.App:
    """A faust app whose consumer group is `app_id`."""
    session_s = endpoints.session_timeout_ms / 1000
    # Apache Kafka: batched producers, acks from every in-sync replica, replicated changelogs;
    # Tansu: one record per batch (its ListOffsets, which table recovery reads, needs it)
    batch, acks = (16_384, -1) if endpoints.is_kafka else (1, 1)
    settings = dict(
        broker=f"{transport.SCHEME}://{endpoints.kafka_bootstrap}",
        store="memory://",  # tables recover from their changelog topics
        processing_guarantee="at_least_once",
        producer_max_batch_size=batch,
        producer_acks=acks,
        broker_session_timeout=session_s,
        broker_heartbeat_interval=max(0.5, session_s / 6),
        consumer_metadata_max_age_ms=METADATA_MAX_AGE_MS,  # see there: a partitionless assignment
        producer_metadata_max_age_ms=METADATA_MAX_AGE_MS,
        broker_commit_every=1,  # commit as soon as an event is acked: small redelivery window
        consumer_auto_offset_reset="earliest",
        topic_disable_leader=True,
        topic_replication_factor=endpoints.replication_factor,
        topic_partitions=4,
        table_standby_replicas=0,
        Event=ProcessedEvent,
        # an agent that raises ends the process, and the supervisor restarts it: faust's
        # default restarts the agent alone, and the message it held stays unacked for good (the
        # next rebalance waits for it forever: the whole consumer group stalls)
        agent_supervisor=mode.CrashingSupervisor,
        web_enabled=False,
        # faust's default is ./<app id>-data: keep the user's working directory clean
        datadir=str(data_root() / "{conf.name}-data"),
    )
    if endpoints.kafka_sasl_mechanism:  # a broker that authenticates clients (a real Kafka)
        settings["broker_credentials"] = faust.SASLCredentials(
            username=endpoints.kafka_username, password=endpoints.kafka_password,
            mechanism=endpoints.kafka_sasl_mechanism,
            ssl_context=endpoints.kafka_auth().get("ssl_context"),
        )  # fmt: skip
    elif endpoints.kafka_security_protocol == "SSL":  # TLS without authentication
        settings["broker_credentials"] = faust.SSLCredentials(endpoints.kafka_auth()["ssl_context"])
    settings.update(overrides)
    app = faust.App(app_id, **settings)
    setattr(app, transport.ENDPOINTS_ATTR, endpoints)  # the transport fetches highwaters with it
    return app


CHANGELOG_SEGMENT_BYTES = 8 << 20
CHANGELOG_TOMBSTONES_KEPT_MS = 10 * 60 * 1000


def changelog_configs(app: faust.App) -> dict[str, str]:
    """A table's changelog topic settings on Apache Kafka (none elsewhere). faust makes it
    compacted; Kafka compacts only segments that have rolled (1 GiB by default: never, in a
    run) and keeps a deleted key's tombstone for a day. A table of half-joined groups gets a
    new key per request, written, then deleted once the group is complete: small segments and
    tombstones kept 10 minutes keep its changelog (what a restart reads) near the live keys."""
    endpoints = getattr(app, transport.ENDPOINTS_ATTR, None)
    if endpoints is None or not endpoints.is_kafka:
        return {}
    return {"segment.bytes": str(CHANGELOG_SEGMENT_BYTES),
            "delete.retention.ms": str(CHANGELOG_TOMBSTONES_KEPT_MS)}  # fmt: skip


def raw_topic(app: faust.App, *names: str) -> faust.TopicT:
    return app.topic(*names, key_serializer="raw", value_serializer="raw")


def header_list(headers) -> list[tuple[str, bytes]]:
    if headers is None:
        return []
    if isinstance(headers, Mapping):
        return list(headers.items())
    return list(headers)


class Glue:
    """Decoding with dead-lettering, and emitting event batches, inside one faust app."""

    def __init__(self, app: faust.App, consumer_name: str, run_id: str | None = None):
        self.app = app
        self.consumer_name = consumer_name
        self.run_id = run_id or "default"  # on the dead letters, so a run's reader finds them
        self.dead_letters = 0
        self._topics: dict[str, faust.TopicT] = {}

    def topic(self, name: str) -> faust.TopicT:
        if name not in self._topics:
            self._topics[name] = raw_topic(self.app, name)
        return self._topics[name]

    async def decode(self, event, expect: tuple[str, ...] | None = None) -> Decoded | None:
        """The decoded event (one of `expect`), or None after sending it to the dead-letter
        topic."""
        try:
            return decode(event.value, header_list(event.headers), expect=expect)
        except DecodeError as error:
            await self.reject(event, error)
            return None

    async def reject(self, event, error: DecodeError, part: int | None = None) -> None:
        """Dead-letter a message (or row `part` of it) with the error as the reason."""
        message = event.message
        record = _RecordView(message, event.key, event.value, header_list(event.headers))
        batch = dead_letter_batch(
            record, error, consumer_name=self.consumer_name, run_id=self.run_id, part=part
        )
        await self.emit(get("dead_letters"), batch)
        self.dead_letters += 1
        metrics.DEAD_LETTERS.labels(message.topic, error.kind).inc()
        log.warning(
            "dead-lettered %s[%d]@%d: %s", message.topic, message.partition, message.offset, error
        )

    async def settle(self) -> None:
        """Wait until this event's table writes are on the broker. faust sends changelog writes
        with `send_soon` (a producer buffer, not tied to the event's offset), so an offset could
        be committed before the state it produced was durable: a SIGKILL in between lost that
        state (a half-joined group forgotten, never completed). Call it before the next event."""
        producer = self.app.producer
        while producer.buffer.size:
            await producer.buffer.flush()
        await producer.flush()

    async def emit(self, event: EventType, batch: pa.RecordBatch, topic: str | None = None):
        """Send `batch` split by key partition and wait until the broker has it; a send the
        broker refuses is sent again with backoff for the S3 retry budget (a durable broker
        whose S3 server is down refuses them all), and only then fails the agent."""
        target = self.topic(topic or event.topic)
        for partition, part in split_by_partition(event, batch):
            value, headers = encode(event, part)
            key = str(part.column(event.key)[0].as_py()).encode()

            async def deliver(key=key, value=value, headers=headers, partition=partition):
                sent = await target.send(key=key, value=value, headers=headers, partition=partition)
                await sent

            try:
                await deliver()
            except KafkaError as error:
                warn_refused(target.get_topic_name(), error)
                await broker_retrying()(deliver)
            metrics.MESSAGES_PUBLISHED.labels(target.get_topic_name()).inc()
            metrics.EVENTS_PUBLISHED.labels(target.get_topic_name()).inc(part.num_rows)


class _RecordView:
    """The fields of a faust message that a dead letter records."""

    def __init__(self, message, key, value, headers):
        self.topic = message.topic
        self.partition = message.partition
        self.offset = message.offset
        self.key = key
        self.value = value
        self.headers = headers
