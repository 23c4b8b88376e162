"""`rlstream topics`: every topic with its partitions, message counts, consumer-group lag and
the event it carries.

A topic outside the registry (`reprocess --to rl.rewards.v1.rescored`, or any producer's) is
first-class when its messages carry a registered event in their headers: `carried_event` finds
it, and `tail`, `replay` and `topics` treat the topic as that event's.

Message counts come from the fetch highwater (always right on Tansu), not from ListOffsets.
Lag is highwater minus the group's committed offset, per partition, summed per topic.
"""

from __future__ import annotations

import asyncio
import contextlib
from dataclasses import dataclass, field

from aiokafka import TopicPartition

from rlstream.connectors.endpoints import Endpoints
from rlstream.connectors.kafka import admin, consumer, highwaters
from rlstream.connectors.reading import ReadRange, TopicNotFound, read_topic
from rlstream.schemas import DecodeError, EventType, event_from_headers, resolve_topic


@dataclass
class TopicInfo:
    topic: str
    partitions: int
    messages: int
    highwater: dict[int, int]
    lag: dict[str, int] = field(default_factory=dict)  # group -> total lag on this topic
    event: str | None = None  # "rewards v1": the registered event its messages carry


async def carried_event(endpoints: Endpoints, topic: str, look: int = 64) -> EventType | None:
    """The event `topic` carries, bound to it: a registered topic's own, else the one named by
    the headers of its first `look` messages (the first registered one); None for a missing
    topic or one without (a faust changelog, say)."""
    registered = _registered(topic)
    if registered is not None:
        return registered
    try:
        records = read_topic(endpoints, topic, ReadRange(from_beginning=True))
        async with contextlib.aclosing(records):
            seen = 0
            async for record in records:
                try:
                    return event_from_headers(record.headers).on_topic(topic)
                except DecodeError:
                    seen += 1
                    if seen >= look:
                        return None
    except TopicNotFound:
        return None
    return None


async def committed_offsets(
    endpoints: Endpoints, group: str, tps: list[TopicPartition]
) -> dict[TopicPartition, int]:
    c = consumer(endpoints, group_id=group)
    await c.start()
    try:
        found = {tp: await c.committed(tp) for tp in tps}
        return {tp: off for tp, off in found.items() if off is not None}
    finally:
        await c.stop()


async def describe(endpoints: Endpoints, prefix: str = "") -> list[TopicInfo]:
    client = admin(endpoints)
    await client.start()
    try:
        names = sorted(t for t in await client.list_topics() if t.startswith(prefix))
        described = await client.describe_topics(names) if names else []
        groups = [g[0] for g in await client.list_consumer_groups()]
    finally:
        await client.close()
    tps = [TopicPartition(d["topic"], p["partition"]) for d in described for p in d["partitions"]]
    if not tps:
        return []
    hw = await highwaters(endpoints, tps)
    infos = {d["topic"]: TopicInfo(d["topic"], len(d["partitions"]), 0, {}) for d in described}
    for tp, end in hw.items():
        infos[tp.topic].highwater[tp.partition] = end
        infos[tp.topic].messages += end
    commits = await asyncio.gather(*(committed_offsets(endpoints, g, tps) for g in groups))
    for group, offsets in zip(groups, commits, strict=True):
        for tp, off in offsets.items():
            info = infos[tp.topic]
            info.lag[group] = info.lag.get(group, 0) + max(0, hw[tp] - off)
    for info in infos.values():
        event = _registered(info.topic)
        if event is None and info.messages:
            event = await carried_event(endpoints, info.topic)
        info.event = None if event is None else f"{event.name} v{event.version}"
    return [infos[n] for n in names]


def _registered(topic: str) -> EventType | None:
    try:
        return resolve_topic(topic)
    except KeyError:
        return None
