"""Reading a topic's offset or time range without trusting ListOffsets.

Tansu's `end_offsets` is wrong when a record batch holds more than one record (and always on s3
storage), so the end of a range is the fetch highwater, which is always right: the first
completed fetch after positioning reports it for every assigned partition, and that snapshot is
where a bounded read stops. `follow` keeps reading past it.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator
from dataclasses import dataclass, field

from aiokafka import AIOKafkaConsumer, ConsumerRecord, TopicPartition
from aiokafka.errors import KafkaError

from rlstream.connectors.endpoints import Endpoints
from rlstream.connectors.kafka import consumer, stop_consumer, topic_partitions

log = logging.getLogger(__name__)


class TopicNotFound(LookupError):
    pass


@dataclass
class ReadProgress:
    """Live figures of a range read, for progress bars."""

    total: int | None = None  # messages in the range once the highwater snapshot is known
    read: int = 0
    value_bytes: int = 0
    ends: dict[int, int] = field(default_factory=dict)


@dataclass(frozen=True)
class ReadRange:
    """Where to start and stop. Times are Kafka record timestamps in epoch milliseconds."""

    from_beginning: bool = True
    from_offset: int | None = None
    since_ms: int | None = None
    until_ms: int | None = None
    follow: bool = False
    partitions: tuple[int, ...] | None = None


async def _start_positions(
    c: AIOKafkaConsumer, tps: list[TopicPartition], rng: ReadRange
) -> dict[TopicPartition, int | None]:
    """Seek every partition; return offsets before which records are skipped (None: none)."""
    skip_below: dict[TopicPartition, int | None] = dict.fromkeys(tps)
    if rng.from_offset is not None:
        for tp in tps:
            c.seek(tp, rng.from_offset)
    elif rng.since_ms is not None:
        found = await c.offsets_for_times(dict.fromkeys(tps, rng.since_ms))
        hint = await c.end_offsets(tps)
        for tp in tps:
            c.seek(tp, found[tp].offset if found.get(tp) else hint[tp])
    elif rng.from_beginning:
        await c.seek_to_beginning(*tps)
    else:  # the end: end_offsets is only a hint here; the first fetch's highwater decides
        hint = await c.end_offsets(tps)
        for tp in tps:
            c.seek(tp, hint[tp])
            skip_below[tp] = -1  # marker: replaced by the highwater after the first fetch
    return skip_below


async def read_topic(
    endpoints: Endpoints,
    topic: str,
    rng: ReadRange = ReadRange(),
    progress: ReadProgress | None = None,
    *,
    poll_ms: int = 100,
    highwater_timeout_s: float = 10.0,
) -> AsyncIterator[ConsumerRecord]:
    """Yield the raw records of `topic` in `rng`, partition by partition order within a fetch."""
    progress = progress or ReadProgress()
    c = consumer(endpoints, group_id=None, fetch_max_wait_ms=poll_ms)
    await c.start()
    try:
        tps = await topic_partitions(c, topic)
        if rng.partitions is not None:
            tps = [tp for tp in tps if tp.partition in rng.partitions]
        if not tps:
            raise TopicNotFound(f"topic {topic} does not exist; run `rlstream stack up` first")
        c.assign(tps)
        skip_below = await _start_positions(c, tps, rng)
        starts = {tp: await c.position(tp) for tp in tps}
        ends: dict[TopicPartition, int] | None = None
        deadline = asyncio.get_running_loop().time() + highwater_timeout_s
        while True:
            fetched = await c.getmany(timeout_ms=poll_ms)
            if ends is None:
                hw = {tp: c.highwater(tp) for tp in tps}
                if all(v is not None for v in hw.values()):
                    ends = hw
                    for tp in tps:
                        if skip_below[tp] == -1:
                            skip_below[tp] = hw[tp]
                    progress.ends = {tp.partition: hw[tp] for tp in tps}
                    progress.total = sum(max(0, hw[tp] - starts[tp]) for tp in tps)
                elif asyncio.get_running_loop().time() > deadline:
                    raise TimeoutError(f"no fetch response from the broker for {topic}")
            for tp, records in fetched.items():
                for record in records:
                    if skip_below[tp] is not None and record.offset < skip_below[tp]:
                        continue
                    if rng.since_ms is not None and record.timestamp < rng.since_ms:
                        continue
                    if rng.until_ms is not None and record.timestamp > rng.until_ms:
                        continue
                    progress.read += 1
                    progress.value_bytes += len(record.value or b"")
                    yield record
            if not rng.follow and ends is not None:
                positions = [await c.position(tp) for tp in tps]
                if all(p >= ends[tp] for p, tp in zip(positions, tps, strict=True)):
                    return
    finally:
        await c.stop()


def carried_by(topic: str) -> tuple[str, ...] | None:
    """The event a live-loop topic carries (a reader takes no other kind: a well-formed event
    on the wrong topic is refused like a malformed one), or None for a topic of no one event
    (a derived topic, the dead letters)."""
    from rlstream.schemas.registry import resolve_topic

    try:
        return (resolve_topic(topic).name,)
    except KeyError:
        return None


async def read_run_rows(endpoints: Endpoints, topic: str, run_id: str) -> list[dict]:
    """The decoded rows of `run_id` on `topic`, read from the beginning to the highwater.
    Undecodable messages are skipped (their consumers dead-letter them)."""
    return await read_rows_where(endpoints, topic, lambda row: row["run_id"] == run_id)


async def read_rows_where(endpoints: Endpoints, topic: str, keep) -> list[dict]:
    """The decoded rows on `topic` for which `keep(row)`, from the beginning to the highwater.
    Undecodable messages are skipped (their consumers dead-letter them)."""
    from rlstream.schemas import DecodeError, decode

    rows, expect = [], carried_by(topic)
    async for record in read_topic(endpoints, topic, ReadRange()):
        try:
            batch = decode(record.value, record.headers, expect=expect).to_pylist()
        except DecodeError:
            continue
        rows += [r for r in batch if keep(r)]
    return rows


FOLLOW_RETRY_S = 1.0  # a follower whose broker failed makes its consumer again after this


async def follow_run(
    endpoints: Endpoints, topics: list[str], run_id: str, *, poll_ms: int = 200
) -> AsyncIterator[dict[str, list[dict]]]:
    """Follow topics from the beginning without a group (every follower sees everything).

    Yields once per poll, also when nothing arrived (so callers can check their own stop
    condition): the decoded rows of `run_id` by event name. Undecodable messages are skipped;
    the processors that own those topics dead-letter them.

    A broker failure does not end the follow: the consumer is made again and every partition
    continues at the offset after the last record yielded. A record at an offset already
    yielded (the consumer reset to the beginning after the broker came back) is skipped, so
    each record is yielded once.
    """
    from rlstream.schemas import DecodeError, decode

    next_offset: dict[TopicPartition, int] = {}
    while True:
        c = consumer(endpoints, fetch_max_wait_ms=100)
        try:
            await c.start()
            tps = [tp for topic in topics for tp in await topic_partitions(c, topic)]
            c.assign(tps)
            for tp in tps:
                if tp in next_offset:
                    c.seek(tp, next_offset[tp])
                else:
                    await c.seek_to_beginning(tp)
            while True:
                found: dict[str, list[dict]] = {}
                for tp, records in (await c.getmany(timeout_ms=poll_ms)).items():
                    for record in records:
                        if record.offset < next_offset.get(tp, 0):
                            continue
                        next_offset[tp] = record.offset + 1
                        try:
                            decoded = decode(record.value, record.headers,
                                             expect=carried_by(record.topic))  # fmt: skip
                        except DecodeError:
                            continue
                        rows = [r for r in decoded.to_pylist() if r["run_id"] == run_id]
                        found.setdefault(decoded.event.name, []).extend(rows)
                yield found
        except (KafkaError, OSError) as exc:
            log.warning("following %s: %s: %s; again in %.0f s",
                        ", ".join(topics), type(exc).__name__, exc, FOLLOW_RETRY_S)  # fmt: skip
        finally:
            await stop_consumer(c)
        yield {}
        await asyncio.sleep(FOLLOW_RETRY_S)
