"""`rlstream chaos`: the real loop under scheduled faults, then an audit of it by event id.

It starts its own embedded stack (so it can take the S3 server away), runs `rlstream run`
against it as a user would, and once RL is under way injects faults from a seeded schedule,
one at a time, each after the loop recovered from the one before:

  kill:trainer, kill:scheduler, kill:processors, kill:rollouts-N
      SIGKILL; the supervisor restarts the process, which resumes from its checkpoint or its
      committed offsets.
  kill:trainer@checkpoint
      SIGKILL the moment the trainer logs that it is writing a checkpoint (the kill lands
      while the checkpoint is written; `mid_write` says whether it was still missing).
  stop:rollouts-N
      SIGSTOP for the session timeout + 4 s, then SIGCONT: a frozen member, evicted by a
      rebalance, that comes back.
  kill:broker
      SIGKILL of the broker, restarted on its port after `broker_down_s`; the stack is durable
      (Tansu's log in the S3 server) whenever this kind is scheduled, so no record is lost.
  s3-down
      the S3 server stopped for `s3_down_s`, then restarted on its ports with its data.
  qdrant-down
      the vector store unavailable for `qdrant_down_s` (a failpoint, `connectors/faults.py`:
      the embedded Qdrant lives inside the scheduler process).

Recovery time is from the fault (the kill; the start of an outage or a freeze) to the next
trained step after the faulted process works again: its own work counter on its metrics
endpoint moved (a restarted trainer's steps, scheduler's requests, processors' experience
messages, rollout worker's completions) and then the trainer trained a step. Steps are read
from `live.json` (about 1 s resolution).

After the run the rollout workers and processors run on until every request issued has its
group on rl.experience.v2 (the drain), and the audit checks, by event id, from the topics,
the trainer's ledger and the archive:
- nothing lost: every rollout request became one group of G rows that the trainer trained,
  dropped as stale or filtered, or that was still unconsumed (past the trainer's committed
  offsets), untrained when the run ended, or held in the trainer's newest checkpoint (taken,
  its offsets committed, trained by a resumed run);
- no experience row trained twice (an event id trained in two ledger entries);
- the archive holds exactly the published experience, once;
- the run completed all its steps (`--until faults`: stopped cleanly by its Ctrl-C).
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import random
import signal
import time
from collections import Counter, defaultdict
from dataclasses import dataclass, field, replace
from pathlib import Path

import numpy as np

from rlstream.config import Config
from rlstream.connectors.endpoints import Endpoints
from rlstream.connectors.faults import FAULTS_DIR
from rlstream.ops.launcher.childrun import ChildRun, RunFailed, wait_for
from rlstream.schemas import get

log = logging.getLogger(__name__)

PROCESS_FAULTS = ("kill:trainer", "kill:trainer@checkpoint", "kill:scheduler",
                  "kill:processors", "kill:rollouts", "stop:rollouts")  # fmt: skip
STORE_FAULTS = ("kill:broker", "s3-down", "qdrant-down")
FAULT_KINDS = PROCESS_FAULTS + STORE_FAULTS
UNTRAINED = ("stale", "filtered", "untrained_at_end")
DRAIN_STALL_S = 45.0
"""A drain that produced no group for this long restarts its processes: once, a drain's rollout
workers idled through the whole drain timeout (180 s) on a durable stack just after the run's
Ctrl-C, cause not found; a second drain of the same run served the requests in 42 s."""
UNTIL = {
    "steps": "the run trains all its rl.steps, faults spread evenly over them",
    "faults": "faults one after another; once the last recovered and tail_steps more steps are "
    "trained, the run is stopped with Ctrl-C (rl.steps is only an upper bound)",
}
"""How a chaos run ends. A fault costs however many steps the loop trains while it recovers
(outages and a frozen worker let it train on buffered experience, in bursts), so "steps" needs
generous rl.steps to fit every fault; "faults" takes only as long as the faults do."""


class ChaosError(RunFailed):
    """The chaos run could not go on (the loop died, a fault could not be injected)."""


@dataclass
class ChaosArgs:
    faults: int = 12
    seed: int = 0
    kinds: tuple[str, ...] = FAULT_KINDS
    s3_down_s: float = 30.0
    broker_down_s: float = 5.0
    qdrant_down_s: float = 30.0
    warmup_steps: int = 2  # RL steps before the first fault
    tail_steps: int = 3  # steps left fault-free at the end
    until: str = "steps"  # "steps": the run trains all rl.steps; "faults": see UNTIL
    recovery_timeout_s: float = 300.0
    drain_timeout_s: float = 180.0
    run_timeout_s: float = 5400.0


@dataclass
class Fault:
    kind: str
    target: str
    step: int = 0  # rl_step when injected
    injected: float = 0.0  # epoch seconds
    lifted: float = 0.0
    recovered: float | None = None
    detail: dict = field(default_factory=dict)

    @property
    def recovery_s(self) -> float | None:
        return None if self.recovered is None else round(self.recovered - self.injected, 2)

    @property
    def after_lifted_s(self) -> float | None:
        return None if self.recovered is None else round(self.recovered - self.lifted, 2)


def schedule(args: ChaosArgs, workers: int) -> list[Fault]:
    """`args.faults` faults cycling through the kinds in a seeded order, each kind as evenly
    as the count allows; rollout workers are picked in turn."""
    rng = random.Random(args.seed)
    kinds = list(args.kinds)
    out: list[Fault] = []
    while len(out) < args.faults:
        rng.shuffle(kinds)
        out += [Fault(k, "") for k in kinds]
    out = out[: args.faults]
    worker = rng.randrange(workers)
    for f in out:
        if f.kind == "kill:broker":
            f.target = "broker"
        elif f.kind.endswith("rollouts"):
            worker = worker % workers + 1
            f.target = f"rollouts-{worker}"
        elif f.kind.startswith(("kill:", "stop:")):
            f.target = f.kind.split(":", 1)[1].split("@")[0]
        else:
            f.target = f.kind.split("-")[0]
    return out


MODULES = {"trainer": "rlstream.streams.trainer", "scheduler": "rlstream.streams.scheduler",
           "processors": "rlstream.streams.worker"}  # fmt: skip


def pid_of(run_pid: int, name: str) -> int:
    """The pid of process `name` (trainer, scheduler, processors, rollouts-N) among the
    children of the `rlstream run` process `run_pid` (never another run's, whatever its id)."""
    import psutil

    module = MODULES.get(name, "rlstream.streams.rollout_worker")
    for p in psutil.Process(run_pid).children(recursive=True):
        try:
            cmd = p.cmdline()
            if module not in cmd or p.status() == psutil.STATUS_ZOMBIE:
                continue
        except psutil.NoSuchProcess:
            continue
        if name.startswith("rollouts-") and f"w{name.split('-')[1]}" not in cmd:
            continue
        return p.pid
    raise ChaosError(f"no running {name} process under the run (pid {run_pid})")


WORK = {
    "trainer": ("rlstream_trainer_steps_total", {"phase": "rl"}),
    "scheduler": ("rlstream_scheduler_requests_total", {}),
    "processors": ("rlstream_producer_messages_total", {"topic": get("experience").topic}),
    "rollouts": ("rlstream_rollout_worker_completions_total", {}),
}


def work_done(run_dir: Path, name: str) -> float | None:
    """The process's work counter from its metrics endpoint (None while it serves none)."""
    import urllib.request

    from prometheus_client.parser import text_string_to_metric_families

    try:
        url = json.loads((run_dir / "metrics.json").read_text())[name]
        with urllib.request.urlopen(url, timeout=1) as response:
            text = response.read().decode()
    except (OSError, ValueError, KeyError):
        return None
    metric, labels = WORK[name.split("-")[0]]
    total = 0.0
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == metric and labels.items() <= sample.labels.items():
                total += sample.value
    return total


class Injector:
    """Injects one fault and lifts it; owns the stack it can take servers out of."""

    def __init__(self, stack, run_pid: int, run_dir: Path, cfg: Config, args: ChaosArgs):
        self.stack, self.run_pid, self.run_dir, self.cfg, self.args = (
            stack, run_pid, run_dir, cfg, args
        )  # fmt: skip
        self.faults_dir = run_dir / "faults"
        self.faults_dir.mkdir(parents=True, exist_ok=True)

    def inject(self, fault: Fault) -> None:
        if fault.kind == "kill:trainer@checkpoint":
            fault.detail = self._kill_during_checkpoint()
        elif fault.kind == "kill:broker":
            self._outage(fault, "tansu", self.stack.kill_server, self.args.broker_down_s)
        elif fault.kind.startswith("kill:"):
            fault.injected = time.time()
            os.kill(pid_of(self.run_pid, fault.target), signal.SIGKILL)
        elif fault.kind.startswith("stop:"):
            pid = pid_of(self.run_pid, fault.target)
            frozen = self.cfg.loop.session_timeout_ms / 1000 + 4
            fault.injected = time.time()
            os.kill(pid, signal.SIGSTOP)
            time.sleep(frozen)
            os.kill(pid, signal.SIGCONT)
            fault.detail = {"frozen_s": frozen}
        elif fault.kind == "s3-down":
            self._outage(fault, "seaweedfs", self.stack.stop_server, self.args.s3_down_s)
        elif fault.kind == "qdrant-down":
            flag = self.faults_dir / "qdrant"
            fault.injected = time.time()
            flag.touch()
            time.sleep(self.args.qdrant_down_s)
            flag.unlink()
            fault.detail = {"down_s": self.args.qdrant_down_s}
        else:
            raise ChaosError(f"unknown fault kind {fault.kind!r}")
        fault.injected = fault.injected or time.time()
        fault.lifted = time.time()

    def _outage(self, fault: Fault, server: str, take_down, down_s: float) -> None:
        """Take a stack server down (stop or kill it), then start it again after `down_s`."""
        fault.injected = time.time()
        take_down(server)
        time.sleep(down_s)
        self.stack.start_server(server)
        fault.detail = {"down_s": down_s}

    def _kill_during_checkpoint(self) -> dict:
        """Follow the trainer's log; SIGKILL it as soon as it says a checkpoint is being
        written, and report whether that checkpoint was still incomplete."""
        from rlstream.connectors.objectstore import ObjectStore, checkpoint_prefix
        from rlstream.trainers.checkpoint import checkpoint_name

        logfile = self.run_dir / "logs" / "trainer.log"
        pid = pid_of(self.run_pid, "trainer")
        offset = logfile.stat().st_size
        deadline = time.monotonic() + self.args.recovery_timeout_s
        while time.monotonic() < deadline:
            with open(logfile, "rb") as f:
                f.seek(offset)
                new = f.read()
            at = new.find(b"checkpoint at step ")
            if at >= 0:
                os.kill(pid, signal.SIGKILL)
                killed = time.time()
                step = int(new[at + 19 :].split()[0])
                store = ObjectStore(self.stack.endpoints)
                name = checkpoint_prefix(self.cfg.run_id) + checkpoint_name(step)
                return {"checkpoint_step": step, "mid_write": not store.exists(name), "_at": killed}
            offset += max(0, new.rfind(b"\n") + 1)
            time.sleep(0.005)
        raise ChaosError("the trainer wrote no checkpoint while waiting to kill it")


def run_chaos(cfg: Config, out_root: Path, args: ChaosArgs, say=print) -> dict:
    """Run the loop under faults, drain it, audit it; return the figures."""
    from rlstream.ops.stack.embedded import EmbeddedStack

    bad = [k for k in args.kinds if k not in FAULT_KINDS]
    if bad:
        raise ChaosError(f"unknown fault kind {bad[0]!r}; kinds: {', '.join(FAULT_KINDS)}")
    run_dir = (out_root / cfg.run_id).resolve()
    run_dir.mkdir(parents=True, exist_ok=True)
    faults = schedule(args, cfg.loop.rollout_workers)
    # every injected kill is a crash to the supervisor: allow them all, however close together
    cfg = replace(cfg, loop=replace(cfg.loop, max_restarts=max(cfg.loop.max_restarts, len(faults))))
    home = run_dir / "home"  # no other stack's endpoints.json may be read by the run
    home.mkdir(exist_ok=True)
    durable = "kill:broker" in {f.kind for f in faults}  # a restarted broker keeps its log
    with EmbeddedStack(run_dir / "stack", durable=durable) as stack:
        env = os.environ | stack.endpoints.as_env()
        env |= {
            "RLSTREAM_HOME": str(home),
            FAULTS_DIR: str(run_dir / "faults"),
            "RLSTREAM_LOGLEVEL": "INFO",
        }  # faust's rebalances and recoveries, for forensics
        say(f"chaos: run {cfg.run_id}, {len(faults)} faults of "
            f"{len({f.kind for f in faults})} kinds, seed {args.seed}")  # fmt: skip
        started = time.time()
        with ChildRun(cfg, out_root, env, "chaos") as run:
            injector = Injector(stack, run.pid, run_dir, cfg, args)
            _inject_all(run, injector, faults, cfg, args, say)
            if args.until == "faults":
                _stop_after(run, args, say)
            code = run.wait(args.run_timeout_s)
            if code == 130 and args.until == "faults":  # stopped: no summary, the live view
                figures = _figures_of(run.live.read()) | {"stopped": True, "stop_s": run.stop_s}
            else:
                figures = run.summary()
        say("chaos: run finished; draining what was in flight")
        drained = drain(stack.endpoints, cfg, run_dir, env, args.drain_timeout_s)
        audit = asyncio.run(audit_run(stack.endpoints, cfg))
    recoveries = [f.recovery_s for f in faults if f.recovery_s is not None]
    result = {
        "run_id": cfg.run_id,
        "seed": args.seed,
        "faults": sum(1 for f in faults if f.injected),
        "faults_planned": len(faults),
        "fault_kinds": sorted({f.kind for f in faults if f.injected}),
        "unrecovered_faults": sum(unrecovered(f) for f in faults),
        "recovery_p50_s": _pct(recoveries, 50),
        "recovery_p99_s": _pct(recoveries, 99),
        "recovery_max_s": max(recoveries) if recoveries else None,
        **audit,
        "drain_s": drained,
        "until": args.until,
        "completed": bool(figures.get("completed")) and figures.get("rl_steps") == cfg.rl.steps,
        "stopped_cleanly": bool(figures.get("stopped")),  # exit 130 on Ctrl-C (until faults)
        "stop_s": figures.get("stop_s"),  # Ctrl-C to the exit of every process of the run
        "rl_steps": figures.get("rl_steps"),
        "final_accuracy": figures.get("final_accuracy"),
        "restarts": figures.get("restarts", {}),
        "wall_s": round(time.time() - started, 1),
        "fault_log": [
            {
                "kind": f.kind,
                "target": f.target,
                "step": f.step,
                "at_s": round(f.injected - started, 1) if f.injected else None,
                "recovery_s": f.recovery_s,
                "after_lifted_s": f.after_lifted_s,
                **{k: v for k, v in f.detail.items() if not k.startswith("_")},
            }
            for f in faults
        ],  # fmt: skip
    }
    result["survived"] = survived(result)
    (run_dir / "chaos.json").write_text(json.dumps(result, indent=2))
    return result


def unrecovered(f: Fault) -> bool:
    """Injected, and the loop never trained again while the run went on."""
    return bool(f.injected) and f.recovered is None and not f.detail.get("run_ended_first")


def survived(r: dict) -> bool:
    """The run's verdict: every fault recovered, nothing lost or trained twice, no request
    issued twice, the archive equal to what was published, and the run complete (or, until
    faults, stopped cleanly once they were over)."""
    ended = r["stopped_cleanly"] if r.get("until") == "faults" else r["completed"]
    return bool(
        ended and r["unrecovered_faults"] == 0 and r["experience_lost"] == 0
        and r["trained_twice"] == 0 and r["archive_matches_published"]
        and not r.get("requests_reissued")
    )  # fmt: skip


def _pct(values: list[float], q: float) -> float | None:
    return round(float(np.percentile(values, q)), 2) if values else None


def _inject_all(run: ChildRun, injector: Injector, faults, cfg: Config, args, say) -> None:
    """Inject each fault once RL is `warmup_steps` in, each after the previous one recovered
    (until steps: spread evenly over the steps that are left, recoveries taking steps too); stop
    early if the run is nearly done."""
    live = run.live
    wait_for(lambda: run.ended() or (live.phase() == "rl" and live.step()
             >= args.warmup_steps), args.run_timeout_s, "the RL phase", live, say)  # fmt: skip
    if run.ended():
        return
    last = cfg.rl.steps - args.tail_steps
    used: list[int] = []  # steps each recovery took (the loop trains on meanwhile)
    for i, fault in enumerate(faults):
        now, left = live.step(), len(faults) - i
        spare = last - now - left * (sum(used) / len(used) if used else 0.0)
        due = now + max(0, int(spare / left)) if i and args.until == "steps" else now
        wait_for(lambda d=due: run.ended() or live.step() >= d,
                 args.run_timeout_s, f"step {due}", live, say)  # fmt: skip
        if run.ended() or live.step() >= last:
            say(f"chaos: the run reached step {live.step()} of {cfg.rl.steps}; "
                f"{len(faults) - i} faults not injected")  # fmt: skip
            return
        _one_fault(run, injector, fault, args, say)
        used.append(live.step() - fault.step)
        say(f"chaos: fault {i + 1}/{len(faults)} {fault.kind} ({fault.target}) at step "
            f"{fault.step}: recovered in {fault.recovery_s} s")  # fmt: skip


def _stop_after(run: ChildRun, args, say) -> None:
    """Until faults: `tail_steps` steps after the last fault, Ctrl-C the run (every process
    stops, as a terminal's Ctrl-C stops them)."""
    live = run.live
    if run.ended():
        return
    end = live.step() + args.tail_steps  # the last fault has recovered by now
    wait_for(lambda: run.ended() or live.step() >= end,
             args.recovery_timeout_s, f"step {end}", live, say)  # fmt: skip
    if not run.ended():
        say(f"chaos: faults over; stopping the run at step {live.step()} (Ctrl-C)")
        run.interrupt()


def _figures_of(state: dict) -> dict:
    """What a stopped run's live.json says of it (it writes no summary)."""
    processes = state.get("processes", {})
    return {
        "rl_steps": state.get("rl_step"),
        "final_accuracy": state.get("accuracy"),
        "restarts": {n: p["restarts"] for n, p in processes.items() if p.get("restarts")},
    }


def _one_fault(run: ChildRun, injector: Injector, fault: Fault, args, say) -> None:
    """Inject `fault`, then wait until the faulted process works again and a step is trained."""
    live = run.live
    fault.step = live.step()
    store_fault = fault.target in ("broker", "s3", "qdrant")
    if not store_fault:
        wait_for(lambda: live.running(fault.target), args.recovery_timeout_s,
                 f"{fault.target} to be running", live, say)  # fmt: skip
    before = None if store_fault else work_done(injector.run_dir, fault.target)
    injector.inject(fault)
    fault.injected = fault.detail.pop("_at", fault.injected)
    # a killed process restarts with its counters at 0; a frozen one keeps them
    baseline = 0.0 if fault.kind.startswith("kill:") else before or 0.0
    works_at: list[int] = []  # the step at which the process was seen working again

    def recovered() -> bool:
        if run.ended():
            return True
        if not works_at:
            done = None if store_fault else work_done(injector.run_dir, fault.target)
            if store_fault or (done is not None and done > baseline):
                works_at.append(live.step())
            return False
        return live.step() > works_at[0]

    wait_for(recovered, args.recovery_timeout_s, f"recovery from {fault.kind}", live, say)
    if works_at and live.step() > works_at[0]:
        fault.recovered = time.time()
    elif run.ended():  # the run finished its steps during the fault (the audit
        fault.detail["run_ended_first"] = True  # still checks it); no recovery time


def drain(endpoints: Endpoints, cfg: Config, run_dir: Path, env: dict, timeout_s: float) -> float:
    """Run the processors and rollout workers again until every request issued has its group
    on rl.experience.v2 (what was in flight when the trainer stopped); seconds it took."""
    from rlstream.ops.launcher.supervisor import Supervisor, child_env

    started = progressed = time.monotonic()
    sup = Supervisor(run_dir / "config.json", env | child_env(endpoints, cfg, run_dir),
                     run_dir / "logs" / "drain", cfg.loop.rollout_workers)  # fmt: skip
    sup.children = [c for c in sup.children if c.name not in ("trainer", "scheduler")]
    sup.start()
    done = -1
    try:
        while time.monotonic() - started < timeout_s:
            issued, groups = asyncio.run(_requests_and_groups(endpoints, cfg.run_id))
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


async def audit_run(endpoints: Endpoints, cfg: Config) -> dict:
    """Account for every rollout request of the run by event id (see the module's doc)."""
    from aiokafka import TopicPartition

    from rlstream.connectors.objectstore import ObjectStore
    from rlstream.connectors.reading import ReadRange, read_run_rows, read_topic
    from rlstream.ops.commands.topics import committed_offsets
    from rlstream.schemas import DecodeError, decode
    from rlstream.streams.trainer import ledger_prefix

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
    parts = {p for p, _ in first_offset.values()}
    committed = await committed_offsets(
        endpoints, cfg.group("trainer"), [TopicPartition(topic, p) for p in sorted(parts)]
    )
    committed_at = {tp.partition: off for tp, off in committed.items()}
    store = ObjectStore(endpoints)
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
    archive = store.read_parquet_prefix(f"{run_id}/experience/")
    archived = archive.column("event_id").to_pylist() if archive.num_rows else []
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
    from rlstream.connectors.reading import ReadRange, read_topic
    from rlstream.schemas import DecodeError, decode

    wanted, found = set(ids), {rid: {} for rid in ids}
    run_id, changelog = cfg.run_id, f"{cfg.group('processors')}-pending_groups-changelog"
    async for record in read_topic(endpoints, changelog, ReadRange()):
        key = (record.key or b"").decode(errors="replace")
        if key in wanted:  # the assembler's table writes for it (what a restart recovers)
            value = json.loads(record.value) if record.value else None
            state = "tombstone" if value is None else {k: len(v) if isinstance(v, list) else v
                                                       for k, v in value.items()}  # fmt: skip
            found[key].setdefault("changelog", []).append([record.partition, record.offset, state])
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
    return found


def table(result: dict) -> str:
    """The fault log and the verdict as Markdown tables."""
    lines = ["| # | fault | target | step | at (s) | recovery (s) | after lifted (s) | note |",
             "|---|---|---|---|---|---|---|---|"]  # fmt: skip
    for i, f in enumerate(result["fault_log"], 1):
        shown = ("kind", "target", "step", "at_s", "recovery_s", "after_lifted_s")
        note = ", ".join(f"{k} {v}" for k, v in f.items() if k not in shown)
        lines.append(f"| {i} | {f['kind']} | {f['target']} | {f['step']} | {f['at_s']} | "
                     f"{f['recovery_s']} | {f['after_lifted_s']} | {note} |")  # fmt: skip
    keys = ("faults", "fault_kinds", "unrecovered_faults", "recovery_p50_s", "recovery_p99_s",
            "requests", "requests_reissued", "groups_by_outcome", "experience_lost",
            "trained_twice", "incomplete_groups", "archive_matches_published", "until",
            "completed", "stopped_cleanly", "stop_s", "rl_steps", "restarts", "final_accuracy",
            "drain_s", "wall_s", "survived")  # fmt: skip
    lines += ["", "| figure | value |", "|---|---|"]
    lines += [f"| {k} | {result.get(k)} |" for k in keys]
    return "\n".join(lines)


def combine(results: list[dict]) -> dict:
    """The figures of one or several chaos runs: counts summed, kinds joined, recovery
    percentiles over every fault of every run, each run kept under `runs`."""
    recoveries = [f["recovery_s"] for r in results for f in r["fault_log"]
                  if f["recovery_s"] is not None]  # fmt: skip
    return {
        "faults": sum(r["faults"] for r in results),
        "fault_kinds": sorted({k for r in results for k in r["fault_kinds"]}),
        "unrecovered_faults": sum(r["unrecovered_faults"] for r in results),
        "experience_lost": sum(r["experience_lost"] for r in results),
        "trained_twice": sum(r["trained_twice"] for r in results),
        "archive_matches_published": all(r["archive_matches_published"] for r in results),
        "completed": all(r["completed"] for r in results),
        "recovery_p50_s": _pct(recoveries, 50),
        "recovery_p99_s": _pct(recoveries, 99),
        "survived": all(r["survived"] for r in results),
        "runs": results,
    }


def mtbf(results: list[dict], fault_rate_per_h: float) -> dict:
    """An MTBF bound from chaos runs. With k of n injected faults not survived (a run that
    failed its audit counts its unrecovered faults, at least one), the chance that a fault is
    not survived is at most p, the exact one-sided 95% (Clopper-Pearson) upper bound: about
    3/n when k = 0 (the rule of three). At `fault_rate_per_h` process faults an hour in
    production, failures come at most p x rate an hour, so MTBF >= 1 / (p x rate)."""
    n = sum(r["faults"] for r in results)
    k = sum(0 if r["survived"] else max(1, r["unrecovered_faults"]) for r in results)
    if n == 0:
        return {"faults_total": 0}
    p = binomial_upper_bound(k, n)
    return {
        "faults_total": n,
        "faults_not_survived": k,
        "p_not_survived_95": round(p, 4),
        "assumed_faults_per_h": fault_rate_per_h,
        "mtbf_lower_bound_h": round(1 / (p * fault_rate_per_h), 1),
    }


def binomial_upper_bound(k: int, n: int, confidence: float = 0.95) -> float:
    """The p at which seeing k or fewer in n has probability 1 - confidence (bisection)."""
    from math import comb

    def cdf(p: float) -> float:
        return sum(comb(n, i) * p**i * (1 - p) ** (n - i) for i in range(k + 1))

    if k >= n:
        return 1.0
    lo, hi = 0.0, 1.0
    for _ in range(60):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if cdf(mid) > 1 - confidence else (lo, mid)
    return hi
