"""The dead-letter helper every consumer uses: a bad message is recorded, never lost or fatal.

A message that fails to decode is published to `rl.dead_letters.v1` with its source topic,
partition, offset, the reason and the raw bytes; the consumer then moves on. The dead letter's
event_id derives from (consumer, topic, partition, offset): a redelivered bad message after a
crash produces the same id, so idempotent readers count it once, while two consumers of the
same topic (the scheduler and the processors both read rewards) each record their rejection.
"""

from __future__ import annotations

import json
import logging
from collections.abc import AsyncIterator

import pyarrow as pa
from aiokafka import AIOKafkaConsumer, ConsumerRecord

from rlstream import metrics
from rlstream.connectors.kafka import EventProducer
from rlstream.schemas import Decoded, DecodeError, decode, get, make_event_id, rows_to_batch

log = logging.getLogger(__name__)

DEAD_LETTERS = get("dead_letters")


def dead_letter_batch(
    record: ConsumerRecord,
    error: DecodeError,
    *,
    consumer_name: str,
    run_id: str = "default",
    part: int | None = None,
) -> pa.RecordBatch:
    """The dead_letters event for one rejected record, or for row `part` of it when the
    consumer refuses single rows of a good message (pure: no I/O)."""
    headers = {k: v.decode(errors="replace") for k, v in (record.headers or ())}
    where = (record.topic, record.partition, record.offset) + (() if part is None else (part,))
    row = {
        "event_id": make_event_id("dead_letter", consumer_name, *where),
        "source_topic": record.topic,
        "source_partition": record.partition,
        "source_offset": record.offset,
        "reason": str(error),
        "error_kind": getattr(error, "kind", type(error).__name__),
        "consumer": consumer_name,
        "raw_key": record.key,
        "raw_value": record.value if record.value is not None else b"",
        "raw_headers": json.dumps(headers, sort_keys=True),
    }
    return rows_to_batch(DEAD_LETTERS, [row], run_id=run_id)


class DeadLetters:
    """Publishes rejected records to the dead-letter topic and counts them."""

    def __init__(self, producer: EventProducer, consumer_name: str, run_id: str = "default"):
        self.producer = producer
        self.consumer_name = consumer_name
        self.run_id = run_id
        self.count = 0

    async def send(
        self, record: ConsumerRecord, error: DecodeError, part: int | None = None
    ) -> None:
        batch = dead_letter_batch(
            record, error, consumer_name=self.consumer_name, run_id=self.run_id, part=part
        )
        await self.producer.send(DEAD_LETTERS, batch)
        self.count += 1
        metrics.DEAD_LETTERS.labels(record.topic, getattr(error, "kind", "decode_error")).inc()
        log.warning(
            "dead-lettered %s[%d]@%d: %s", record.topic, record.partition, record.offset, error
        )


async def decoded_records(
    consumer: AIOKafkaConsumer, dead_letters: DeadLetters, *, timeout_ms: int = 200
) -> AsyncIterator[tuple[ConsumerRecord, Decoded]]:
    """Yield (record, decoded event) from a started consumer; dead-letter what fails to decode.

    The caller commits offsets after its own side effect; a dead-lettered record counts as
    handled once the dead letter is acknowledged by the broker.
    """
    while True:
        fetched = await consumer.getmany(timeout_ms=timeout_ms)
        for records in fetched.values():
            for record in records:
                try:
                    event = decode(record.value, record.headers)
                except DecodeError as error:
                    await dead_letters.send(record, error)
                    continue
                yield record, event
