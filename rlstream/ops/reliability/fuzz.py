"""`rlstream fuzz`: malformed messages on every topic the loop's processes consume, mid-run.

Each message is one of a class of defect, built from a well-formed event of the topic:

    encoding  random bytes, truncated Arrow IPC, no headers, an unknown event or version, the
              headers of another event, a required column missing, nulls in a required field,
              a well-formed event of another kind (the wrong topic)
    rows      rows of the run that decode but cannot be its rows: a NaN or infinite reward, an
              empty or over-long completion, a token id outside the vocabulary, a negative or
              huge group size
    other run well-formed rows of another run (every consumer must leave them alone)

Where the topic has an owner — a consumer group that must take every message (the scheduler
for prompts and rewards, the rollout workers for requests, the processors for rollouts and
rewards, the trainer for experience) — each owner must dead-letter the message with its reason
(matched by topic, partition and offset). Topics read only by followers (the corpus, policy
versions: every process reads them whole, none owns them) get encoding defects, which their
readers must skip. Rows of another run must draw no dead letter. The run must go on: no process
restarts, the run completes, its accuracy within the spread of unfuzzed runs.
"""

from __future__ import annotations

import asyncio
import json
import math
import os
import random
import time
from collections import Counter, defaultdict
from dataclasses import dataclass, replace
from pathlib import Path

import pyarrow as pa

from rlstream.config import Config
from rlstream.connectors.endpoints import Endpoints
from rlstream.ops.launcher.childrun import PROGRESS_EVERY_S, ChildRun, Live, wait_for
from rlstream.schemas import encode, get, rows_to_batch
from rlstream.schemas.codec import headers_for

OTHER_RUN = "fuzz-other-run"
OWNERS = {  # event -> the process kinds that must dead-letter a bad message on its topic
    "prompts": ("scheduler",),
    "rollout_requests": ("rollout-workers",),
    "rollouts": ("processors",),
    "rewards": ("processors", "scheduler"),
    "experience": ("trainer",),
}
FOLLOWED = ("corpus", "policy_versions")  # read whole by every process, owned by none
ENCODING = ("random_bytes", "truncated_arrow", "no_headers", "unknown_event", "unknown_version",
            "other_event_headers", "missing_column", "null_required", "wrong_topic")  # fmt: skip
ROWS = {  # row defects and the events whose rows carry the field
    "nan_reward": ("rewards", "experience"),
    "inf_reward": ("rewards", "experience"),
    "empty_completion": ("rollouts", "experience"),
    "long_completion": ("rollouts", "experience"),
    "token_outside_vocab": ("rollouts", "experience"),
    "negative_group_size": ("rollout_requests", "rollouts", "rewards"),
    "huge_group_size": ("rollout_requests", "rollouts", "rewards"),
}


@dataclass
class FuzzMessage:
    cls: str
    event: str  # the topic's event
    value: bytes | None
    headers: list[tuple[str, bytes]]
    owners: tuple[str, ...]  # who must dead-letter it; () for skipped or left alone
    where: tuple[str, int, int] | None = None  # (topic, partition, offset) once sent


def plan(n: int, seed: int) -> list[tuple[str, str]]:
    """`n` (class, event) pairs cycling through every pair that applies, in a seeded order."""
    pairs = [(c, e) for e in OWNERS for c in ENCODING]
    pairs += [(c, e) for c, events in ROWS.items() for e in events]
    pairs += [("other_run", e) for e in OWNERS]
    pairs += [(c, e) for e in FOLLOWED for c in ENCODING if c != "wrong_topic"]
    rng = random.Random(seed)
    out: list[tuple[str, str]] = []
    while len(out) < n:
        rng.shuffle(pairs)
        out += pairs
    return out[:n]


def template(event: str, run_id: str, cfg: Config, i: int) -> dict:
    """A well-formed row of `event` for this run (its ids are the fuzzer's own)."""
    req, g = f"fuzz-{i:06d}", cfg.rl.group_size
    common = {"event_id": f"fuzz-{event}-{i}", "run_id": run_id, "request_id": req,
              "prompt_id": f"fuzz-p{i}", "task": "add"}  # fmt: skip
    tokens = {"prompt_tokens": [5, 6, 7], "completion_tokens": [8, 1], "logprobs": [-0.5, -0.1]}
    rows = {
        "prompts": {
            "prompt_id": f"fuzz-p{i}",
            "text": "1+2=",
            "task": "add",
            "answer": "3",
            "dataset": f"fuzz-{i}",
        },  # fmt: skip
        "rollout_requests": common
        | {"text": "1+2=", "answer": "3", "group_size": g, "sampler": "fuzz"},  # fmt: skip
        "rollouts": common
        | {
            "sample_idx": 0,
            "group_size": g,
            "prompt_text": "1+2=",
            "answer": "3",
            "completion": "3",
            **tokens,
        },  # fmt: skip
        "rewards": common
        | {
            "sample_idx": 0,
            "group_size": g,
            "reward": 1.0,
            "correct": True,
            "verifier": "fuzz",
        },  # fmt: skip
        "experience": common | {"sample_idx": 0, "reward": 1.0, "correct": True, **tokens},
        "corpus": {"doc_id": f"fuzz-d{i}", "text": "1+2=3", "source": "fuzz"},
        "policy_versions": {
            "version": 10**6 + i,
            "checkpoint_uri": "s3://nowhere/x",
            "step": 1,
            "phase": "rl",
        },  # fmt: skip
    }[event]
    return {"run_id": run_id} | rows


def defective_row(cls: str, row: dict, cfg: Config) -> dict:
    """`row` with the defect `cls`."""
    long = cfg.model.block_size * 4
    change = {
        "nan_reward": {"reward": math.nan},
        "inf_reward": {"reward": math.inf},
        "empty_completion": {"completion": "", "completion_tokens": [], "logprobs": []},
        "long_completion": {
            "completion": "1" * long,
            "completion_tokens": [8] * long,
            "logprobs": [-0.1] * long,
        },  # fmt: skip
        "token_outside_vocab": {"completion_tokens": [8, 10**6]},
        "negative_group_size": {"group_size": -4},
        "huge_group_size": {"group_size": 2**31 - 1},
    }[cls]
    return row | {k: v for k, v in change.items() if k in row}


def build(cls: str, event_name: str, cfg: Config, rng: random.Random, i: int) -> FuzzMessage:
    """One malformed message of class `cls` for the topic of `event_name`."""
    event = get(event_name)
    owners = OWNERS.get(event_name, ())
    if cls == "other_run":
        row = template(event_name, OTHER_RUN, cfg, i)
        value, headers = encode(event, rows_to_batch(event, [row], run_id=OTHER_RUN))
        return FuzzMessage(cls, event_name, value, headers, ())
    row = template(event_name, cfg.run_id, cfg, i)
    if cls in ROWS:
        bad = defective_row(cls, row, cfg)
        value, headers = encode(event, rows_to_batch(event, [bad], run_id=cfg.run_id))
        return FuzzMessage(cls, event_name, value, headers, owners)
    value, headers = encode(event, rows_to_batch(event, [row], run_id=cfg.run_id))
    if cls == "random_bytes":
        value = rng.randbytes(rng.randrange(0, 2048))
        headers = headers if rng.random() < 0.5 else []
    elif cls == "truncated_arrow":
        value = value[: rng.randrange(1, len(value))]
    elif cls == "no_headers":
        headers = []
    elif cls == "unknown_event":
        headers = [("event", b"fuzz_nonsense"), ("schema_version", b"1")]
    elif cls == "unknown_version":
        headers = [("event", event_name.encode()), ("schema_version", b"999")]
    elif cls == "other_event_headers":
        other = "rewards" if event_name != "rewards" else "rollouts"
        headers = headers_for(get(other))
    elif cls == "missing_column":
        batch = rows_to_batch(event, [row], run_id=cfg.run_id)
        required = [f.name for f in event.payload_fields if not f.nullable]
        value = _ipc(batch.drop_columns([rng.choice(required)]))
    elif cls == "null_required":
        batch = rows_to_batch(event, [row], run_id=cfg.run_id)
        name = rng.choice([f.name for f in event.payload_fields if not f.nullable])
        value = _ipc(_nulled(batch, name))
    elif cls == "wrong_topic":  # a good event of another kind: decodes, but not here
        other = "rewards" if event_name != "rewards" else "rollouts"
        o = get(other)
        value, headers = encode(o, rows_to_batch(o, [template(other, cfg.run_id, cfg, i)]))
    else:
        raise ValueError(f"unknown fuzz class {cls!r}")
    return FuzzMessage(cls, event_name, value, headers, owners)


def _ipc(batch: pa.RecordBatch) -> bytes:
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, batch.schema) as writer:
        writer.write_batch(batch)
    return sink.getvalue().to_pybytes()


def _nulled(batch: pa.RecordBatch, name: str) -> pa.RecordBatch:
    """`batch` with column `name` all null (its field made nullable, as a careless producer's)."""
    i = batch.schema.get_field_index(name)
    schema = batch.schema.set(i, batch.schema.field(i).with_nullable(True))
    columns = list(batch.columns)
    columns[i] = pa.nulls(batch.num_rows, type=columns[i].type)
    return pa.RecordBatch.from_arrays(columns, schema=schema)


def messages(cfg: Config, n: int, seed: int) -> list[FuzzMessage]:
    rng = random.Random(seed)
    return [build(c, e, cfg, rng, i) for i, (c, e) in enumerate(plan(n, seed))]


async def send(
    endpoints: Endpoints, batch: list[FuzzMessage], rate_per_s: float, stop, say=None
) -> int:
    """Publish the messages at about `rate_per_s` until `stop()`; record where each landed."""
    from rlstream.connectors.kafka import producer

    p = producer(endpoints)
    await p.start()
    sent, started = 0, time.monotonic()
    said = started
    try:
        for m in batch:
            if stop():
                break
            meta = await (await p.send(get(m.event).topic, m.value, key=f"fuzz{sent}".encode(),
                                       headers=m.headers))  # fmt: skip
            m.where = (meta.topic, meta.partition, meta.offset)
            sent += 1
            if say and time.monotonic() - said > PROGRESS_EVERY_S:
                said = time.monotonic()
                say(f"fuzz: {time.strftime('%H:%M:%S')} sent {sent} of {len(batch)}")
            ahead = sent / rate_per_s - (time.monotonic() - started)
            if ahead > 0:
                await asyncio.sleep(ahead)
    finally:
        await p.stop()
    return sent


async def account(endpoints: Endpoints, run_id: str, sent: list[FuzzMessage]) -> dict:
    """Each sent message against the run's dead letters: by class, what its owners did."""
    from rlstream.connectors.reading import read_run_rows

    letters = await read_run_rows(endpoints, get("dead_letters").topic, run_id)
    by_place: dict[tuple, set[str]] = defaultdict(set)
    reasons: Counter = Counter()
    for d in letters:
        place = (d["source_topic"], d["source_partition"], d["source_offset"])
        by_place[place].add(_kind_of(d["consumer"] or "", run_id))
        if d["raw_key"] and d["raw_key"].startswith(b"fuzz"):
            reasons[d["error_kind"]] += 1
    rows = defaultdict(Counter)
    missed: list[dict] = []
    for m in sent:
        got = by_place.get(m.where, set())
        outcome = _outcome(m, got)
        rows[(m.cls, m.event)][outcome] += 1
        if outcome == "missed" and len(missed) < 20:
            missed.append({"class": m.cls, "event": m.event, "where": m.where,
                           "dead_lettered_by": sorted(got)})  # fmt: skip
    outcomes = Counter()
    for c in rows.values():
        outcomes.update(c)
    return {
        "messages_sent": len(sent),
        "outcomes": dict(outcomes),
        "dead_letters_by_reason": dict(reasons.most_common()),
        "by_class": {f"{c} @ {e}": dict(v) for (c, e), v in sorted(rows.items())},
        "missed": missed,
    }


def _kind_of(consumer: str, run_id: str) -> str:
    """The process kind of a dead letter's consumer name (`rlstream-<run>-scheduler`,
    `rlstream-<run>-rollout-workers/rollouts-1`, ...)."""
    name = consumer.split("/")[0].removeprefix(f"rlstream-{run_id}-")
    return name


def _outcome(m: FuzzMessage, got: set[str]) -> str:
    if m.cls == "other_run":
        return "left_alone" if not got else "dead_lettered_wrongly"
    if not m.owners:
        return "skipped_by_readers" if not got else "dead_lettered"
    return "dead_lettered" if set(m.owners) <= got else "missed"


@dataclass
class FuzzArgs:
    messages: int = 10_000
    rate_per_s: float = 200.0
    seed: int = 0
    baseline: bool = True
    stop_sending_at: float = 0.7  # share of rl.steps after which no more fuzz is sent
    run_timeout_s: float = 3600.0


def run_fuzz(cfg: Config, out_root: Path, args: FuzzArgs, say=print) -> dict:
    """A baseline run (unless not wanted), then the same run under fuzz; the figures."""
    from rlstream.ops.launcher.datapath import stack_or_endpoints

    out_root = out_root.resolve()
    with stack_or_endpoints(out_root / f"{cfg.run_id}-stack") as (endpoints, _):
        env = os.environ | endpoints.as_env()
        base = None
        if args.baseline:
            say(f"fuzz: baseline run {cfg.run_id}-base (no fuzz)")
            with ChildRun(replace(cfg, run_id=cfg.run_id + "-base"), out_root, env, "fuzz") as run:
                run.wait(args.run_timeout_s, say, who="fuzz")
                base = run.summary()
        batch = messages(cfg, args.messages, args.seed)
        say(f"fuzz: run {cfg.run_id}; {len(batch)} malformed messages at {args.rate_per_s:.0f}/s "
            "once RL is under way")  # fmt: skip
        started = time.time()
        with ChildRun(cfg, out_root, env, "fuzz") as run:
            live = run.live
            wait_for(lambda: run.ended() or live.phase() == "rl",
                     args.run_timeout_s, "the RL phase", live, say, who="fuzz")  # fmt: skip
            last = int(cfg.rl.steps * args.stop_sending_at)

            def over() -> bool:
                return run.ended() or live.step() >= last

            sent = asyncio.run(send(endpoints, batch, args.rate_per_s, over, say))
            say(f"fuzz: sent {sent} messages by step {live.step()}; waiting for the run")
            run.wait(args.run_timeout_s, say, who="fuzz")
            figures = run.summary()
        audit = asyncio.run(account(endpoints, cfg.run_id, batch[:sent]))
    result = {
        "run_id": cfg.run_id,
        "seed": args.seed,
        **audit,
        "crashes": sum(figures.get("restarts", {}).values()),
        "restarts": figures.get("restarts", {}),
        "completed": bool(figures.get("completed")),
        "final_accuracy": figures.get("final_accuracy"),
        "baseline_accuracy": base.get("final_accuracy") if base else None,
        "wall_s": round(time.time() - started, 1),
    }
    result["survived"] = survived(result, args.messages)
    (out_root / cfg.run_id / "fuzz.json").write_text(json.dumps(result, indent=2, default=str))
    return result


def fuzz_live(
    cfg: Config, out_root: Path, args: FuzzArgs, timeout_s: float = 120.0, say=print
) -> dict:
    """Fuzz a run in progress (its config from `<out>/<run>/config.json`): send the messages,
    then wait until every owner has dead-lettered what it owns (or `timeout_s`)."""
    endpoints = Endpoints.from_env()
    batch = messages(cfg, args.messages, args.seed)
    live = Live(out_root / cfg.run_id / "live.json")
    say(f"fuzz: {len(batch)} malformed messages into run {cfg.run_id} at {args.rate_per_s:.0f}/s")
    started = time.time()
    sent = asyncio.run(send(endpoints, batch, args.rate_per_s, lambda: False, say))
    deadline = time.monotonic() + timeout_s
    while True:
        audit = asyncio.run(account(endpoints, cfg.run_id, batch[:sent]))
        if not audit["outcomes"].get("missed") or time.monotonic() > deadline:
            break
        time.sleep(2)
    processes = live.read().get("processes", {})
    restarts = {n: p["restarts"] for n, p in processes.items() if p.get("restarts")}
    result = {"run_id": cfg.run_id, "seed": args.seed, **audit,
              "crashes": sum(restarts.values()), "restarts": restarts,
              "completed": None,  # the run goes on
              "final_accuracy": None, "baseline_accuracy": None,
              "wall_s": round(time.time() - started, 1)}  # fmt: skip
    result["survived"] = survived(result, args.messages)
    return result


def survived(r: dict, wanted: int) -> bool:
    """Every message sent, each owner's dead letter for every one it owns, nothing dead-lettered
    that should have been left alone, no process restarted, the run complete (a fuzzed live run:
    `completed` None, it goes on)."""
    o = r["outcomes"]
    return bool(
        r["messages_sent"] == wanted and not o.get("missed") and not o.get("dead_lettered_wrongly")
        and r["crashes"] == 0 and r["completed"] is not False
    )  # fmt: skip


def table(result: dict) -> str:
    """The fuzz figures as Markdown: per class and topic, then the verdict."""
    lines = ["| class @ event | dead-lettered | skipped by readers | left alone | missed |",
             "|---|---|---|---|---|"]  # fmt: skip
    for name, c in result["by_class"].items():
        lines.append(f"| {name} | {c.get('dead_lettered', 0)} | {c.get('skipped_by_readers', 0)}"
                     f" | {c.get('left_alone', 0)} | {c.get('missed', 0)} |")  # fmt: skip
    keys = ("messages_sent", "outcomes", "dead_letters_by_reason", "crashes", "completed",
            "final_accuracy", "baseline_accuracy", "wall_s", "survived")  # fmt: skip
    lines += ["", "| figure | value |", "|---|---|"]
    lines += [f"| {k} | {result.get(k)} |" for k in keys]
    return "\n".join(lines)
