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
  kill:env
      SIGKILL of the environment server, restarted on its port after `env_down_s`: with this
      kind scheduled, the run's environment (of its data.tasks families) plays its episodes on
      an `rlstream env serve` the chaos run owns (`env.servers`). Episodes it was playing fail
      (env_closed), are dead-lettered and never trained; their groups are accounted env_failed.

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
from contextlib import nullcontext
from dataclasses import dataclass, field, replace
from pathlib import Path

from rlstream.config import Config
from rlstream.connectors.faults import FAULTS_DIR, refused_calls
from rlstream.ops.launcher.childrun import ChildRun, RunFailed, wait_for
from rlstream.ops.reliability.audit import (
    audit_run,
    drain,
)
from rlstream.ops.reliability.chaos_figures import (
    _pct,
    survived,
    unrecovered,
)
from rlstream.ops.stack.envserver import EnvServer
from rlstream.schemas import get

log = logging.getLogger(__name__)

PROCESS_FAULTS = ("kill:trainer", "kill:trainer@checkpoint", "kill:scheduler",
                  "kill:processors", "kill:rollouts", "stop:rollouts")  # fmt: skip
STORE_FAULTS = ("kill:broker", "s3-down", "qdrant-down")
SERVER_FAULTS = ("kill:env",)  # a server of the run that is not one of its processes
FAULT_KINDS = PROCESS_FAULTS + STORE_FAULTS + SERVER_FAULTS
OUTSIDE = ("broker", "s3", "qdrant", "env")  # targets that are not processes of the run
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
    env_down_s: float = 5.0
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


def environment_of(cfg: Config) -> str:
    """The environment the run's prompts play (of its first data.tasks family that plays one),
    for `kill:env`; ChaosError when they play none."""
    from rlstream.trainers.envs import TaskMix, get_task

    if not cfg.data.prompts:
        for name in TaskMix.parse(cfg.data.tasks).weights:
            if played := getattr(get_task(name), "environment", ""):
                return played
    raise ChaosError("kill:env: the run's prompts play no environment; give it a task family "
                     "that does, e.g. --set data.tasks=add,sub,calc")  # fmt: skip


def default_kinds(cfg: Config) -> tuple[str, ...]:
    """Every kind that applies to the run: `kill:env` only where its prompts play an
    environment."""
    try:
        environment_of(cfg)
    except ChaosError:
        return PROCESS_FAULTS + STORE_FAULTS
    return FAULT_KINDS


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

    def __init__(self, stack, run_pid: int, run_dir: Path, cfg: Config, args: ChaosArgs,
                 env_server: EnvServer | None = None):  # fmt: skip
        self.stack, self.run_pid, self.run_dir, self.cfg, self.args = (
            stack, run_pid, run_dir, cfg, args
        )  # fmt: skip
        self.env_server = env_server
        self.faults_dir = run_dir / "faults"
        self.faults_dir.mkdir(parents=True, exist_ok=True)

    def inject(self, fault: Fault) -> None:
        if fault.kind == "kill:trainer@checkpoint":
            fault.detail = self._kill_during_checkpoint()
        elif fault.kind == "kill:broker":
            self._outage(fault, "tansu", self.stack.kill_server, self.args.broker_down_s)
        elif fault.kind == "kill:env":
            fault.injected = time.time()
            self.env_server.kill()
            time.sleep(self.args.env_down_s)
            self.env_server.start()
            fault.detail = {"down_s": self.args.env_down_s, "environment": self.env_server.name}
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
            fault.detail = self._vector_store_outage()
        else:
            raise ChaosError(f"unknown fault kind {fault.kind!r}")
        fault.injected = fault.injected or time.time()
        fault.lifted = time.time()

    def _vector_store_outage(self) -> dict:
        """The failpoint on for `qdrant_down_s`, and on past that until the scheduler has felt
        it (a call refused): a scheduler between flushes and PPM reads may not touch the store
        for a while, and an outage nobody saw tests nothing."""
        flag, before = self.faults_dir / "qdrant", refused_calls(self.faults_dir, "qdrant")
        at = time.time()
        flag.touch()
        time.sleep(self.args.qdrant_down_s)
        deadline = time.monotonic() + self.args.recovery_timeout_s
        while refused_calls(self.faults_dir, "qdrant") == before and time.monotonic() < deadline:
            time.sleep(0.2)
        flag.unlink()
        return {"down_s": round(time.time() - at, 1), "_at": at,
                "calls_refused": refused_calls(self.faults_dir, "qdrant") - before}  # fmt: skip

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
    played = environment_of(cfg) if "kill:env" in args.kinds else ""
    run_dir = (out_root / cfg.run_id).resolve()
    run_dir.mkdir(parents=True, exist_ok=True)
    faults = schedule(args, cfg.loop.rollout_workers)
    # every injected kill is a crash to the supervisor: allow them all, however close together
    cfg = replace(cfg, loop=replace(cfg.loop, max_restarts=max(cfg.loop.max_restarts, len(faults))))
    home = run_dir / "home"  # no other stack's endpoints.json may be read by the run
    home.mkdir(exist_ok=True)
    durable = "kill:broker" in {f.kind for f in faults}  # a restarted broker keeps its log
    served = EnvServer(played, run_dir / "logs", cfg.env.options) if played else nullcontext()
    with EmbeddedStack(run_dir / "stack", durable=durable) as stack, served as env_server:
        if env_server is not None:  # the run plays its environment on the server chaos owns
            servers = json.loads(cfg.env.servers or "{}") | {played: env_server.address}
            cfg = replace(cfg, env=replace(cfg.env, servers=json.dumps(servers)))
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
            injector = Injector(stack, run.pid, run_dir, cfg, args, env_server)
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
    store_fault = fault.target in OUTSIDE
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
