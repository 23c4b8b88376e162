"""The audit after a chaos run, by event id: every request answered, every group trained exactly
once (the trainer's ledger, plus what its last checkpoint holds), the archive equal to what was
published, and a request's path through the topics when one is missing.

Where the broker has dropped the oldest experience (Kafka's retention on a long run), the audit
reads those rows from the run's archive instead: the archive must still hold everything the
topic holds, once, and the rows only the archive has are counted (`experience_from_archive`)."""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time
from collections import Counter, defaultdict
from pathlib import Path

from rlstream.config import Config
from rlstream.connectors.endpoints import Endpoints
from rlstream.schemas import get

log = logging.getLogger(__name__)
UNTRAINED = ("stale", "filtered", "env_failed", "untrained_at_end")


DRAIN_STALL_S = 45.0
"""A drain that produced no group for this long restarts its processes: once, a drain's rollout
workers idled through the whole drain timeout (180 s) on a durable stack just after the run's
Ctrl-C, cause not found; a second drain of the same run served the requests in 42 s."""


def drain(endpoints: Endpoints, cfg: Config, run_dir: Path, env: dict, timeout_s: float) -> float:
    """Run the processors and rollout workers again until every request issued has its group
    on rl.experience.v2 (what was in flight when the trainer stopped); seconds it took."""
    from rlstream.ops.launcher.supervisor import Supervisor, child_env

    started = progressed = time.monotonic()
    sup = Supervisor(run_dir / "config.json", env | child_env(endpoints, cfg, run_dir),
                     run_dir / "logs" / "drain", cfg.loop.worker_range[0])  # fmt: skip
    sup.children = [c for c in sup.children if c.name not in ("trainer", "scheduler")]
    sup.start()
    done = -1
    dropped = asyncio.run(_archived_if_dropped(endpoints, cfg.run_id))  # what retention took
    try:
        while time.monotonic() - started < timeout_s:
            issued, groups = asyncio.run(_requests_and_groups(endpoints, cfg.run_id))
            groups = dropped | groups
            if issued <= groups.keys():
                break
            if len(groups) > done:
                done, progressed = len(groups), time.monotonic()
            elif time.monotonic() - progressed > DRAIN_STALL_S:
                log.warning("drain: no group for %.0f s; restarting its processes", DRAIN_STALL_S)
                sup.stop()
                sup.start()
                progressed = time.monotonic()
            sup.poll()
            time.sleep(2)
    finally:
        sup.stop()
    return round(time.monotonic() - started, 1)


async def _requests_and_groups(endpoints: Endpoints, run_id: str):
    from rlstream.connectors.reading import read_run_rows

    requests = await read_run_rows(endpoints, get("rollout_requests").topic, run_id)
    experience = await read_run_rows(endpoints, get("experience").topic, run_id)
    groups: dict[str, set[str]] = defaultdict(set)
    for r in experience:
        groups[r["request_id"]].add(r["event_id"])
    return {r["request_id"] for r in requests}, groups


async def _archived_if_dropped(endpoints: Endpoints, run_id: str) -> dict[str, set[str]]:
    """Request -> event ids of the run's archived experience, where the broker has dropped
    records of the experience topic (none otherwise: the topic holds it all)."""
    from rlstream.connectors.kafka import log_start_offsets
    from rlstream.connectors.objectstore import ObjectStore

    if not any((await log_start_offsets(endpoints, get("experience").topic)).values()):
        return {}
    archive = ObjectStore(endpoints).read_parquet_prefix(f"{run_id}/experience/")
    groups: dict[str, set[str]] = defaultdict(set)
    for r in archive.select(["event_id", "request_id"]).to_pylist() if archive.num_rows else []:
        groups[r["request_id"]].add(r["event_id"])
    return groups


async def audit_run(endpoints: Endpoints, cfg: Config) -> dict:
    """Account for every rollout request of the run by event id (see the module's doc)."""
    from aiokafka import TopicPartition

    from rlstream.connectors.kafka import log_start_offsets
    from rlstream.connectors.objectstore import ObjectStore
    from rlstream.connectors.reading import ReadRange, read_run_rows, read_topic
    from rlstream.ops.commands.topics import committed_offsets
    from rlstream.schemas import DecodeError, decode
    from rlstream.streams.experience_checks import ledger_prefix

    run_id, g = cfg.run_id, cfg.rl.group_size
    issued = await read_run_rows(endpoints, get("rollout_requests").topic, run_id)
    requests = {r["request_id"] for r in issued}
    groups: dict[str, set[str]] = defaultdict(set)
    first_offset: dict[str, tuple[int, int]] = {}  # request -> (partition, offset) of its group
    published: list[str] = []
    topic = get("experience").topic
    async for record in read_topic(endpoints, topic, ReadRange()):
        try:
            rows = decode(record.value, record.headers, expect=("experience",)).to_pylist()
        except DecodeError:
            continue  # dead-lettered by the consumers; not experience of this run
        for r in rows:
            if r["run_id"] != run_id:
                continue
            published.append(r["event_id"])
            groups[r["request_id"]].add(r["event_id"])
            first_offset.setdefault(r["request_id"], (record.partition, record.offset))
    store = ObjectStore(endpoints)
    archive = store.read_parquet_prefix(f"{run_id}/experience/")
    archived = archive.column("event_id").to_pylist() if archive.num_rows else []
    dropped = {p: o for p, o in (await log_start_offsets(endpoints, topic)).items() if o}
    in_topic = set(published)
    from_archive = 0  # rows the broker dropped (retention), read from the archive instead
    if dropped:
        for r in archive.select(["event_id", "request_id"]).to_pylist():
            if r["event_id"] not in in_topic:
                from_archive += 1
                published.append(r["event_id"])
                groups[r["request_id"]].add(r["event_id"])
    parts = {p for p, _ in first_offset.values()}
    committed = await committed_offsets(
        endpoints, cfg.group("trainer"), [TopicPartition(topic, p) for p in sorted(parts)]
    )
    committed_at = {tp.partition: off for tp, off in committed.items()}
    ledger = store.read_parquet_prefix(ledger_prefix(run_id))
    entries = ledger.to_pylist() if ledger.num_rows else []
    outcomes: dict[str, set[str]] = defaultdict(set)
    trained = Counter()
    for e in entries:
        outcomes[e["request_id"]].add(e["outcome"])
        if e["outcome"] == "trained":
            trained.update(e["event_ids"])
    held = held_in_checkpoint(store, run_id)
    accounted = Counter()
    lost: list[str] = []
    for rid in sorted(requests):
        if "trained" in outcomes.get(rid, ()):
            accounted["trained"] += 1
        elif outcomes.get(rid):
            accounted[sorted(outcomes[rid] & set(UNTRAINED))[0]] += 1
        elif rid in held:
            accounted["held_in_checkpoint"] += 1
        elif rid in first_offset and first_offset[rid][1] >= committed_at.get(
            first_offset[rid][0], 0
        ):
            accounted["unconsumed_at_end"] += 1
        else:
            lost.append(rid)
    traces = await trace_requests(endpoints, cfg, lost[:20]) if lost else {}
    return {
        "requests": len(requests),
        "requests_reissued": len(issued) - len(requests),
        "groups_by_outcome": dict(sorted(accounted.items())),
        "experience_lost": len(lost),
        "lost_requests": traces,
        "incomplete_groups": sum(1 for rid in requests if rid in groups and len(groups[rid]) != g),
        "trained_twice": sum(n - 1 for n in trained.values() if n > 1),
        "experience_published": len(set(published)),
        "experience_redelivered": len(published) - len(set(published)),
        "experience_dropped_by_broker": sum(dropped.values()),  # records, before each start
        "experience_from_archive": from_archive,
        "archive_matches_published": set(archived) == set(published)
        and len(archived) == len(set(archived)),
    }


def held_in_checkpoint(store, run_id: str) -> set[str]:
    """The requests whose rows the trainer's newest checkpoint holds, taken but not trained yet:
    their offsets were committed with it, and a resumed run trains them (a run stopped with
    Ctrl-C writes no final checkpoint, whose ledger would say `untrained_at_end`)."""
    from rlstream.connectors.objectstore import PrefixStore, checkpoint_prefix
    from rlstream.trainers.checkpoint import latest_checkpoint

    ck = latest_checkpoint(PrefixStore(store, checkpoint_prefix(run_id)))
    if ck is None:
        return set()
    stream = ck["stream"]
    groups = [*stream["ready"], *stream["pending"].values()]
    return {rows[0]["request_id"] for rows in groups if rows}


async def trace_requests(endpoints: Endpoints, cfg: Config, ids: list[str]) -> dict:
    """Where each request's messages are: topic -> [partition, offset, produced time] of the
    first message holding it (what a lost request reached before it was lost)."""
    from rlstream.connectors.reading import ReadRange, TopicNotFound, read_topic
    from rlstream.schemas import DecodeError, decode

    wanted, found = set(ids), {rid: {} for rid in ids}
    run_id, changelog = cfg.run_id, f"{cfg.group('processors')}-pending_groups-changelog"
    with contextlib.suppress(TopicNotFound):  # none while the processors never started
        async for record in read_topic(endpoints, changelog, ReadRange()):
            key = (record.key or b"").decode(errors="replace")
            if key in wanted:  # the assembler's table writes for it (what a restart recovers)
                value = json.loads(record.value) if record.value else None
                state = (
                    "tombstone"
                    if value is None
                    else {k: len(v) if isinstance(v, list) else v for k, v in value.items()}
                )
                found[key].setdefault("changelog", []).append(
                    [record.partition, record.offset, state]
                )
    for name in ("rollout_requests", "rollouts", "rewards", "experience"):
        async for record in read_topic(endpoints, get(name).topic, ReadRange()):
            try:
                rows = decode(record.value, record.headers, expect=(name,)).to_pylist()
            except DecodeError:
                continue
            for r in rows:
                if r["run_id"] == run_id and r["request_id"] in wanted:
                    at = [record.partition, record.offset, str(r["produced_at"])]
                    found[r["request_id"]].setdefault(name, at)
    await _add_committed(endpoints, cfg, found)
    at = {(get(name).topic, *trace[name][:2]): rid for rid, trace in found.items()
          for name in ("rollout_requests", "rollouts", "rewards") if name in trace}  # fmt: skip
    async for record in read_topic(endpoints, get("dead_letters").topic, ReadRange()):
        try:
            rows = decode(record.value, record.headers, expect=("dead_letters",)).to_pylist()
        except DecodeError:
            continue
        for r in rows:  # a consumer refused the message: its reason
            where = (r["source_topic"], r["source_partition"], r["source_offset"])
            if where in at:
                found[at[where]].setdefault("dead_letters", []).append(
                    [r["consumer"], r["error_kind"], r["reason"]]
                )
    return found


async def _add_committed(endpoints: Endpoints, cfg: Config, found: dict) -> None:
    """Beside each message of a lost request, where its consumer group had committed in that
    partition at the end (an offset past the message: the group moved on without it)."""
    from aiokafka import TopicPartition

    from rlstream.ops.commands.topics import committed_offsets

    readers = {"rollout_requests": "rollout-workers", "rollouts": "processors",
               "rewards": "processors", "experience": "trainer"}  # fmt: skip
    for name, group in readers.items():
        topic = get(name).topic
        tps = sorted({TopicPartition(topic, at[0]) for trace in found.values()
                      if (at := trace.get(name))})  # fmt: skip
        if not tps:
            continue
        committed = await committed_offsets(endpoints, cfg.group(group), tps)
        for trace in found.values():
            if at := trace.get(name):
                at.append({"committed": committed.get(TopicPartition(topic, at[0]))})
