"""`rlstream topics`: every topic with its partitions, message counts and consumer-group lag.

Message counts come from the fetch highwater (always right on Tansu), not from ListOffsets.
Lag is highwater minus the group's committed offset, per partition, summed per topic.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field

from aiokafka import TopicPartition

from rlstream.connectors.endpoints import Endpoints
from rlstream.connectors.kafka import admin, consumer


@dataclass
class TopicInfo:
    topic: str
    partitions: int
    messages: int
    highwater: dict[int, int]
    lag: dict[str, int] = field(default_factory=dict)  # group -> total lag on this topic


async def highwaters(endpoints: Endpoints, tps: list[TopicPartition]) -> dict[TopicPartition, int]:
    """The true end offset of each partition, read from a fetch response."""
    c = consumer(endpoints, fetch_max_wait_ms=50, max_partition_fetch_bytes=1)
    await c.start()
    try:
        c.assign(tps)
        hint = await c.end_offsets(tps)
        for tp in tps:
            c.seek(tp, hint[tp])
        for _ in range(100):
            await c.getmany(timeout_ms=50)
            found = {tp: c.highwater(tp) for tp in tps}
            if all(v is not None for v in found.values()):
                return found
        raise TimeoutError("the broker sent no fetch response within 5 s")
    finally:
        await c.stop()


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
    return [infos[n] for n in names]
