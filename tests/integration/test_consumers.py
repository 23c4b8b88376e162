"""Consumer groups, resume after commit, and the dead-letter path, on the real broker."""

from __future__ import annotations

import asyncio
import time

import pytest

from rlstream.connectors.deadletter import DeadLetters, decoded_records
from rlstream.connectors.kafka import EventProducer, consumer
from rlstream.connectors.reading import ReadRange, read_topic
from rlstream.schemas import decode, get, rows_to_batch
from tests.integration.conftest import run

pytestmark = pytest.mark.integration
REWARDS = get("rewards")


def _reward_rows(run_id: str, n: int) -> list[dict]:
    return [
        {
            "request_id": f"{run_id}-r{i}",
            "prompt_id": f"{run_id}-p{i}",
            "sample_idx": 0,
            "group_size": 1,
            "task": "add",
            "reward": 1.0,
            "correct": True,
            "verifier": "exact",
        }
        for i in range(n)
    ]


async def _publish_one_per_message(endpoints, run_id: str, n: int) -> set[str]:
    """Publish n reward rows, one per message; return their event ids."""
    ids = set()
    async with EventProducer(endpoints) as producer:
        for row in _reward_rows(run_id, n):
            batch = rows_to_batch(REWARDS, [row], run_id=run_id)
            ids.add(batch.column("event_id")[0].as_py())
            await producer.send(REWARDS, batch)
    return ids


async def _consume(c, run_id: str, want: int, timeout_s: float = 30) -> list[tuple]:
    """Consume until `want` rows of run_id (a prefix); return (event_id, tp, offset) per row."""
    seen = []
    deadline = time.monotonic() + timeout_s
    while len(seen) < want and time.monotonic() < deadline:
        for tp, records in (await c.getmany(timeout_ms=200)).items():
            for r in records:
                for row in decode(r.value, r.headers).to_pylist():
                    if row["run_id"].startswith(run_id):
                        seen.append((row["event_id"], tp, r.offset))
    return seen


def test_two_consumers_in_one_group_split_the_partitions(endpoints):
    run_id = f"split-{time.time_ns()}"
    group = f"g-split-{time.time_ns()}"

    async def scenario():
        a = consumer(endpoints, REWARDS.topic, group_id=group)
        b = consumer(endpoints, REWARDS.topic, group_id=group)
        await asyncio.gather(a.start(), b.start())
        try:
            # Both must be members before data arrives: poll until the assignment settles.
            deadline = time.monotonic() + 30
            while time.monotonic() < deadline:
                await asyncio.gather(a.getmany(timeout_ms=100), b.getmany(timeout_ms=100))
                if a.assignment() and b.assignment() and len(a.assignment() | b.assignment()) == 4:
                    break
            ids = await _publish_one_per_message(endpoints, run_id, 40)
            got_a, got_b = await asyncio.gather(
                _consume(a, run_id, 1, 10), _consume(b, run_id, 1, 10)
            )
            rest = await asyncio.gather(_consume(a, run_id, 40, 3), _consume(b, run_id, 40, 3))
            return a.assignment(), b.assignment(), got_a + rest[0], got_b + rest[1], ids
        finally:
            await asyncio.gather(a.stop(), b.stop())

    parts_a, parts_b, got_a, got_b, ids = run(scenario())
    assert parts_a and parts_b and not (parts_a & parts_b)
    assert len(parts_a | parts_b) == REWARDS.partitions
    assert {tp for _, tp, _ in got_a} <= parts_a and {tp for _, tp, _ in got_b} <= parts_b
    everything = [e for e, _, _ in got_a + got_b]
    assert sorted(everything) == sorted(ids)  # every row once, across the two members


def test_restart_after_commit_resumes_with_no_loss_and_no_duplicate(endpoints):
    run_id = f"resume-{time.time_ns()}"
    group = f"g-resume-{time.time_ns()}"

    async def scenario():
        # Position the group at the current end first, so only this test's rows count.
        first = consumer(endpoints, REWARDS.topic, group_id=group, auto_offset_reset="latest")
        await first.start()
        await _consume(first, "none", 1, 2)  # joins and fixes positions at the end
        for tp in first.assignment():
            await first.commit({tp: await first.position(tp)})
        ids = await _publish_one_per_message(endpoints, run_id, 30)
        processed: list[str] = []
        while len(processed) < 17:  # process one record at a time, commit after each
            for tp, records in (await first.getmany(timeout_ms=200, max_records=1)).items():
                for r in records:
                    processed += [x["event_id"] for x in decode(r.value, r.headers).to_pylist()]
                    await first.commit({tp: r.offset + 1})
        await first.stop()  # a crash here: fetched-but-unprocessed records were not committed

        ids |= await _publish_one_per_message(endpoints, f"{run_id}-more", 10)
        second = consumer(endpoints, REWARDS.topic, group_id=group)
        await second.start()
        resumed = await _consume(second, run_id, 40 - len(processed), 30)
        resumed += await _consume(second, run_id, 1, 2)  # nothing more may arrive
        await second.stop()
        return ids, processed, [e for e, _, _ in resumed]

    all_ids, processed, resumed = run(scenario())
    assert len(processed) == 17
    assert not set(processed) & set(resumed), "a committed row was delivered again"
    assert len(resumed) == len(set(resumed)) == 23
    assert set(processed) | set(resumed) == all_ids  # nothing lost


def test_garbage_in_the_middle_is_dead_lettered_and_the_rest_processed(endpoints):
    run_id = f"dlq-{time.time_ns()}"
    group = f"g-dlq-{time.time_ns()}"

    async def scenario():
        async with EventProducer(endpoints) as producer:
            rows = _reward_rows(run_id, 3)
            # All on one partition, so "the middle" is well defined.
            rows = [{**r, "prompt_id": f"{run_id}-same"} for r in rows]
            await producer.send(REWARDS, rows_to_batch(REWARDS, [rows[0]], run_id=run_id))
            meta = await (
                await producer.raw.send(
                    REWARDS.topic,
                    b"\x00garbage bytes",
                    key=b"x",
                    partition=(await _partition_of(producer, rows[0])),
                    headers=[("event", b"rewards"), ("schema_version", b"1")],
                )
            )
            for row in rows[1:]:
                await producer.send(REWARDS, rows_to_batch(REWARDS, [row], run_id=run_id))
            c = consumer(endpoints, REWARDS.topic, group_id=group)
            await c.start()
            dead = DeadLetters(producer, consumer_name="test-dlq", run_id=run_id)
            processed = []
            try:
                async with asyncio.timeout(30):
                    async for _record, event in decoded_records(c, dead):
                        processed += [r for r in event.to_pylist() if r["run_id"] == run_id]
                        if len(processed) == 3:
                            break
            finally:
                await c.stop()
        return meta, processed, dead.count

    meta, processed, dead_count = run(scenario())
    assert [r["request_id"] for r in processed] == [f"{run_id}-r{i}" for i in range(3)]
    assert dead_count >= 1

    async def find_dead_letter():
        async for record in read_topic(endpoints, get("dead_letters").topic, ReadRange()):
            for row in decode(record.value, record.headers).to_pylist():
                # the suite's other tests dead-letter other topics' offsets on this stack too
                source = (row["source_topic"], row["source_partition"], row["source_offset"])
                if source == (REWARDS.topic, meta.partition, meta.offset):
                    return row
        return None

    letter = run(find_dead_letter())
    assert letter is not None
    assert letter["source_topic"] == REWARDS.topic and letter["error_kind"] == "not_arrow"
    assert "not an Arrow IPC stream" in letter["reason"]
    assert letter["raw_value"] == b"\x00garbage bytes" and letter["consumer"] == "test-dlq"


async def _partition_of(producer, row) -> int:
    from rlstream.connectors.kafka import partition_for

    return partition_for(row["prompt_id"], REWARDS.partitions)
