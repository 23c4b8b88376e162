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
import os
import time
from collections import Counter, defaultdict
from dataclasses import dataclass, replace
from pathlib import Path

from rlstream.config import Config
from rlstream.connectors.endpoints import Endpoints
from rlstream.ops.launcher.childrun import PROGRESS_EVERY_S, ChildRun, Live, wait_for
from rlstream.ops.reliability.fuzz_messages import FuzzMessage, messages
from rlstream.schemas import get


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
