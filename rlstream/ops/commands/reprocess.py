"""`rlstream reprocess`: re-run a stream processor over a recorded topic into a new topic.

It reads the source topic up to its end at start (highwater snapshot) under its own consumer
group, calls the same pure function the live agent calls, writes to the target topic (created
with the source event's partition count if missing), and commits its own offsets. The live
loop's groups and topics are never touched. Example: re-score old rollouts with new reward
rules into `rl.rewards.v1.rescored` and compare.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

from aiokafka.admin import NewTopic

from rlstream.connectors.deadletter import DeadLetters
from rlstream.connectors.endpoints import Endpoints
from rlstream.connectors.kafka import EventProducer, admin, consumer, highwaters, topic_partitions
from rlstream.schemas import DecodeError, EventType, decode, get, rows_to_batch
from rlstream.trainers.experience import score_rollouts


@dataclass(frozen=True)
class Reprocessor:
    source: EventType
    sink: EventType
    fn: Callable[..., list[dict]]


REPROCESSORS = {
    "score_rollouts": Reprocessor(get("rollouts"), get("rewards"), score_rollouts),
}


@dataclass
class ReprocessReport:
    processor: str
    source: str
    target: str
    group: str
    messages: int = 0
    rows_in: int = 0
    rows_out: int = 0
    dead_letters: int = 0
    wall_s: float = 0.0


async def ensure_target(endpoints: Endpoints, topic: str, partitions: int) -> None:
    client = admin(endpoints)
    await client.start()
    try:
        if topic not in await client.list_topics():
            factor = endpoints.replication_factor
            await client.create_topics([NewTopic(topic, partitions, replication_factor=factor)])
    finally:
        await client.close()


async def reprocess(
    endpoints: Endpoints,
    name: str,
    target: str,
    *,
    source: str | None = None,
    run_id: str | None = None,
    verifier: str = "reprocess",
    reward_fn=None,
) -> ReprocessReport:
    proc = REPROCESSORS[name]
    source = source or proc.source.topic
    group = f"rlstream-reprocess-{name}-{target}"
    report = ReprocessReport(name, source, target, group)
    started = time.perf_counter()
    await ensure_target(endpoints, target, proc.sink.partitions)
    c = consumer(endpoints, group_id=group)
    await c.start()
    try:
        tps = await topic_partitions(c, source)
        ends = await highwaters(endpoints, tps)
        c.assign(tps)
        for tp in tps:  # resume from this group's own commits, else from the beginning
            committed = await c.committed(tp)
            c.seek(tp, committed or 0)
        async with EventProducer(endpoints) as producer:
            dead = DeadLetters(producer, consumer_name=group)
            while [tp for tp in tps if await c.position(tp) < ends[tp]]:
                for tp, records in (await c.getmany(timeout_ms=200)).items():
                    for record in records:
                        if record.offset >= ends[tp]:
                            continue
                        await _one(record, proc, producer, dead, report, target, run_id,
                                   verifier, reward_fn)  # fmt: skip
                    if records:
                        await c.commit({tp: min(records[-1].offset + 1, ends[tp])})
            report.dead_letters = dead.count
    finally:
        await c.stop()
    report.wall_s = time.perf_counter() - started
    return report


async def _one(record, proc, producer, dead, report, target, run_id, verifier, reward_fn):
    report.messages += 1
    try:
        rows = decode(record.value, record.headers).to_pylist()
    except DecodeError as error:
        await dead.send(record, error)
        return
    rows = [r for r in rows if run_id is None or r["run_id"] == run_id]
    report.rows_in += len(rows)
    out = proc.fn(rows, reward_fn, verifier) if rows else []
    if out:
        await producer.send(proc.sink, rows_to_batch(proc.sink, out), topic=target)
        report.rows_out += len(out)
