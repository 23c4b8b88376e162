"""The stream processors: one faust agent per stream, each a thin loop around a pure function.

    score_rollouts       rl.rollouts.v1                  -> rl.rewards.v1     (the verifier)
    assemble_experience  rl.rollouts.v1 + rl.rewards.v1  -> rl.experience.v2  (+ Parquet archive)

Every agent decodes through `Glue.decode` (bad messages go to the dead-letter topic and the loop
goes on) and emits with `Glue.emit`, which waits for the broker before the event is acked, so an
offset is committed only after the side effect. `PROCESSORS` maps names to attach functions.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial

import faust

from rlstream import metrics
from rlstream.connectors.objectstore import ObjectStore, experience_object
from rlstream.schemas import DecodeError, get, rows_to_batch
from rlstream.streams.app import Glue, changelog_configs, done, raw_topic
from rlstream.trainers.experience import (
    RowLimits,
    RowRefused,
    Scorer,
    assemble_experience,
    complete_groups,
    keep_rows_of_run,
    row_problem,
)

ROLLOUTS, REWARDS, EXPERIENCE = get("rollouts"), get("rewards"), get("experience")


@dataclass
class ProcessorConfig:
    """Where a processor reads and writes; the defaults are the live loop's topics."""

    source: str | None = None
    """Input topic (default: the processor's usual input)."""
    sink: str | None = None
    """Output topic (default: the processor's usual output); `reprocess` points it elsewhere."""
    verifier: str = "verifier"
    """Name recorded on rewards; a changed verifier gives new reward event ids."""
    reward_fn: Callable | None = None
    """Reward function (completions, **kwargs) -> list[float]; default: the task verifiers."""
    verifier_timeout_s: float = 10.0
    """Longest one group's scoring may take; over it, or raising, the group gets reward 0."""
    store: ObjectStore | None = None
    """Where assemble_experience archives experience groups (None: no archive)."""
    run_id: str | None = None
    """Only this run's rows (a run's processors must not re-score or re-archive the rows of
    earlier runs on the same topics, e.g. with other reward rules); None: every run's."""
    limits: RowLimits = RowLimits()
    """What the run's rows can hold (`row_problem`); a run's processors know its model."""


async def refuse_bad_rows(
    glue: Glue, event, rows: list[dict], cfg: ProcessorConfig, report: bool = True
) -> list[dict]:
    """This run's rows of a decoded message that can be rows of it. Each other one of this run
    is dead-lettered (its index in the message as `part`) when `report` (score_rollouts reports
    the rollouts rows both agents read), other runs' rows are dropped."""

    async def refuse(i: int, row: dict, problem: str) -> None:
        if report:
            await glue.reject(event, RowRefused(f"row {i}: {problem}"), part=i)

    return await keep_rows_of_run(rows, cfg.run_id, partial(row_problem, limits=cfg.limits), refuse)


class VerifierFailed(DecodeError):
    """A verifier or reward function raised, returned garbage or ran over its timeout."""

    kind = "verifier_failed"


class EpisodeFailed(DecodeError):
    """An episode whose environment failed (its kind: env_timeout, env_crashed, ...): scored 0,
    and the trainer drops its group."""

    def __init__(self, row: dict):
        self.kind = row["env_error"].partition(":")[0]
        super().__init__(f"request {row['request_id']} sample {row['sample_idx']} "
                         f"({row.get('environment')}): {row['env_error']}")  # fmt: skip


def attach_score_rollouts(app: faust.App, glue: Glue, cfg: ProcessorConfig) -> None:
    """Score each rollout group (bounded by cfg.verifier_timeout_s): a failing verifier gives
    its group reward 0 and a dead letter with the reason; the loop goes on."""
    source = raw_topic(app, cfg.source or ROLLOUTS.topic)
    scorer = Scorer(cfg.reward_fn, cfg.verifier, cfg.verifier_timeout_s)

    @app.agent(source, name="score_rollouts")
    async def score(stream):
        stream = stream.noack()  # acked once scored (`done`), never when faust skips it
        async for event in stream.events():
            decoded = await glue.decode(event, expect=("rollouts",))
            if decoded is not None:
                metrics.PROCESSOR_EVENTS.labels("score_rollouts").inc()
                good = await refuse_bad_rows(glue, event, decoded.to_pylist(), cfg)
                rows, failures = await asyncio.to_thread(scorer.score, good)
                for part, _, reason in failures:
                    await glue.reject(event, VerifierFailed(reason), part=part)
                for part, row in enumerate(decoded.to_pylist()):
                    if row.get("env_error") and row in good:
                        await glue.reject(event, EpisodeFailed(row), part=part)
                if rows:
                    await glue.emit(REWARDS, rows_to_batch(REWARDS, rows), topic=cfg.sink)
            await done(stream, event)


DONE_RETENTION_S = 3600.0
"""How long the assembler remembers a completed request, to drop later copies of its group.
A copy comes from at-least-once redelivery after a crash, within the restart time."""
SWEEP_EVERY = 256
"""Completed groups between sweeps of expired done markers (keeps the table bounded)."""


def attach_assemble_experience(app: faust.App, glue: Glue, cfg: ProcessorConfig) -> None:
    """Join rollouts and rewards per request (both keyed by prompt_id, so co-partitioned).

    Half-joined groups wait in a faust table backed by a changelog topic, so a restarted
    assembler resumes them. A complete group is archived and published, and its request is
    marked done: a later copy of the group (a rollout worker killed before its commit rolls the
    request again, with new completions) is dropped, so the topic and the archive hold one
    version of each group. Both the archive and the publish repeat harmlessly if this process
    dies before its offset is committed (same object name, same event ids).
    """
    source = raw_topic(app, ROLLOUTS.topic, REWARDS.topic)
    # bytes types, not a raw Schema: a Table takes its changelog serializers from key_type and
    # value_type only (falling back to json), so with schema= it wrote raw bytes and then
    # json-decoded them on recovery ("Expecting value"), failing on every record forever
    pending = app.Table(
        "pending_groups",
        default=None,
        partitions=ROLLOUTS.partitions,
        key_type=bytes,
        value_type=bytes,
        extra_topic_configs=changelog_configs(app),
    )
    completed = 0

    @app.agent(source, name="assemble_experience")
    async def assemble(stream):
        nonlocal completed
        stream = stream.noack()  # acked once joined and settled (`done`), never when skipped
        async for event in stream.events():
            expect = (ROLLOUTS.name,) if event.message.topic == ROLLOUTS.topic else (REWARDS.name,)
            decoded = await glue.decode(event, expect=expect)
            if decoded is None:
                await done(stream, event)
                continue
            metrics.PROCESSOR_EVENTS.labels("assemble_experience").inc()
            partition = event.message.partition
            kind = decoded.event.name  # "rollouts" or "rewards"
            rows = decoded.to_pylist()
            good = await refuse_bad_rows(glue, event, rows, cfg, report=kind == "rewards")
            for request_id, rows in _by_request(good).items():
                key = request_id.encode()
                held = _load(pending.get(key))
                dropped = absorb(held, kind, rows)
                if dropped:
                    metrics.PROCESSOR_DUPLICATES.labels("assemble_experience").inc(dropped)
                if "done_at" in held:
                    continue
                group = _complete(held)
                if group is None:
                    pending[key] = _dump(held)
                    continue
                batch = rows_to_batch(EXPERIENCE, group)
                if cfg.store is not None:
                    first = group[0]
                    name = experience_object(first["run_id"], first["policy_version"], request_id)
                    await asyncio.to_thread(cfg.store.put_parquet, name, batch)
                await glue.emit(EXPERIENCE, batch, topic=cfg.sink)
                pending[key] = _dump({"done_at": time.time(), "partition": partition})
                completed += 1
                if completed % SWEEP_EVERY == 0:
                    _sweep(pending, partition, time.time() - DONE_RETENTION_S)
            await glue.settle()  # the table's writes are durable before this offset commits
            await done(stream, event)


def absorb(held: dict, kind: str, rows: list[dict]) -> int:
    """Add one side's rows to a held group, first copy wins; returns the rows dropped.

    A worker emits a group's G rollouts in one message and score_rollouts scores messages in
    order, so on each side the first copy of a sample is the same copy: keeping the first (never
    the last) pairs every completion with its own reward. Rows for a done request are dropped.
    """
    if "done_at" in held:
        return len(rows)
    have = {r["sample_idx"] for r in held[kind]}
    fresh = []
    for row in rows:
        if row["sample_idx"] not in have:
            have.add(row["sample_idx"])
            fresh.append(row)
    held[kind] += fresh
    return len(rows) - len(fresh)


def _sweep(pending, partition: int, before: float) -> None:
    """Forget done markers older than `before` that were written from this partition (a
    tombstone must go to the changelog partition the marker went to)."""
    expired = []
    for key, value in pending.items():
        held = _load(value)
        if held.get("partition") == partition and held.get("done_at", before) < before:
            expired.append(key)
    for key in expired:
        del pending[key]


def _by_request(rows: list[dict]) -> dict[str, list[dict]]:
    out: dict[str, list[dict]] = defaultdict(list)
    for row in rows:
        row.pop("produced_at", None)  # outputs get their own production time
        row.pop("event_id", None)
        out[row["request_id"]].append(row)
    return out


def _complete(held: dict[str, list[dict]]) -> list[dict] | None:
    """Experience rows once both sides of the group are complete, else None."""
    rollouts, _ = complete_groups(held["rollouts"])
    rewards, _ = complete_groups(held["rewards"])
    for request_id in rollouts.keys() & rewards.keys():
        return assemble_experience(rollouts[request_id], rewards[request_id])
    return None


def _load(value: bytes | None) -> dict:
    return json.loads(value) if value else {"rollouts": [], "rewards": []}


def _dump(held: dict) -> bytes:
    return json.dumps(held).encode()


PROCESSORS: dict[str, Callable[[faust.App, Glue, ProcessorConfig], None]] = {
    "score_rollouts": attach_score_rollouts,
    "assemble_experience": attach_assemble_experience,
}
