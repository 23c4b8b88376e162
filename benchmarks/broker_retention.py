"""Does the embedded broker (Tansu 0.6, memory storage) bound its memory by topic retention or
DeleteRecords? Issue 14 asks for bounded broker memory on long runs; this is the evidence.

Three topics get the same 50 MB (1 KiB records): one with `retention.ms` 5 s (1 s segments),
one with `retention.bytes` 5 MiB (1 MiB segments), one with neither. After a wait the broker's
resident memory and each topic's first offset tell whether anything was dropped; then
DeleteRecords is asked to drop the third topic's records. Prints a table and writes JSON.

    .venv/bin/python benchmarks/broker_retention.py [--out benchmarks/results/broker-retention.json]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import tempfile
import time
from pathlib import Path

import psutil
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition
from aiokafka.admin import AIOKafkaAdminClient, NewTopic
from aiokafka.admin.records_to_delete import RecordsToDelete

from rlstream.ops.stack.embedded import EmbeddedStack

RECORD = b"x" * 1024
TOPICS = {
    "retention-ms": {"retention.ms": "5000", "segment.ms": "1000"},
    "retention-bytes": {"retention.bytes": str(5 * 2**20), "segment.bytes": str(2**20)},
    "no-retention": {},
}


def broker_rss_mib() -> float:
    (p,) = [p for p in psutil.process_iter(["cmdline"]) if "broker" in (p.info["cmdline"] or [])
            and "tansu" in (p.info["cmdline"] or [""])[0]]  # fmt: skip
    return p.memory_info().rss / 2**20


async def produce(bootstrap: str, topic: str, n: int) -> None:
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap, linger_ms=5)
    await producer.start()
    try:
        for _ in range(n):
            await producer.send(topic, RECORD)
        await producer.flush()
    finally:
        await producer.stop()


async def first_last_count(bootstrap: str, topic: str) -> tuple[int, int, int]:
    """The first and end offsets ListOffsets reports, and how many records a read returns."""
    tp = TopicPartition(topic, 0)
    consumer = AIOKafkaConsumer(bootstrap_servers=bootstrap, auto_offset_reset="earliest")
    await consumer.start()
    try:
        consumer.assign([tp])
        first, end = (
            (await consumer.beginning_offsets([tp]))[tp],
            (await consumer.end_offsets([tp]))[tp],
        )
        count, idle = 0, 0
        while idle < 3:
            batch = await consumer.getmany(tp, timeout_ms=1000, max_records=10_000)
            got = sum(len(v) for v in batch.values())
            count, idle = count + got, 0 if got else idle + 1
        return first, end, count
    finally:
        await consumer.stop()


async def measure(bootstrap: str, mb: int, wait_s: float) -> dict:
    n = mb * 1024
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
    await admin.start()
    out: dict = {"records_per_topic": n, "rss_start_mib": broker_rss_mib(), "topics": {}}
    try:
        await admin.create_topics([NewTopic(t, 1, 1, topic_configs=c) for t, c in TOPICS.items()])
        for topic in TOPICS:
            await produce(bootstrap, topic, n)
            out["topics"][topic] = {"rss_after_fill_mib": broker_rss_mib()}
        time.sleep(wait_s)
        for topic in TOPICS:
            first, end, count = await first_last_count(bootstrap, topic)
            out["topics"][topic] |= {"first_offset": first, "end_offset": end, "read": count}
        out["rss_after_wait_mib"] = broker_rss_mib()
        try:
            await admin.delete_records(
                {TopicPartition("no-retention", 0): RecordsToDelete(n - 100)}, timeout_ms=10_000
            )
            out["delete_records"] = "accepted"
        except Exception as e:  # noqa: BLE001 - the answer is the evidence
            out["delete_records"] = f"{type(e).__name__}: {e}"
        first, end, count = await first_last_count(bootstrap, "no-retention")
        out["after_delete_records"] = {"first_offset": first, "read": count,
                                       "rss_mib": broker_rss_mib()}  # fmt: skip
    finally:
        await admin.close()
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--mb", type=int, default=50, help="MB written to each topic")
    ap.add_argument("--wait-s", type=float, default=30.0, help="wait after the writes")
    ap.add_argument("--out", default=None, help="JSON results file")
    a = ap.parse_args()
    with tempfile.TemporaryDirectory() as d, EmbeddedStack(Path(d)) as stack:
        r = asyncio.run(measure(stack.endpoints.kafka_bootstrap, a.mb, a.wait_s))
    print(f"Tansu memory storage, {a.mb} MB of 1 KiB records per topic, {a.wait_s:.0f} s wait")
    print("| topic | config | RSS after its fill (MiB) | first offset | end offset | read |")
    print("|---|---|---|---|---|---|")
    for t, v in r["topics"].items():
        cfg = ", ".join(f"{k}={x}" for k, x in TOPICS[t].items()) or "-"
        print(f"| {t} | {cfg} | {v['rss_after_fill_mib']:.0f} | {v['first_offset']} | "
              f"{v['end_offset']} | {v['read']} |")  # fmt: skip
    print(
        f"RSS: start {r['rss_start_mib']:.0f} MiB, after the wait {r['rss_after_wait_mib']:.0f} MiB"
    )
    d = r["after_delete_records"]
    print(f"DeleteRecords: {r['delete_records']}; then first offset {d['first_offset']}, "
          f"{d['read']} records read, RSS {d['rss_mib']:.0f} MiB")  # fmt: skip
    if a.out:
        Path(a.out).write_text(json.dumps(r, indent=1))


if __name__ == "__main__":
    main()
