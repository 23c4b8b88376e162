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
      SIGKILL of the broker (every node of a Kafka cluster), restarted on its ports after
      `broker_down_s`; Tansu's stack is durable (its log in the S3 server) whenever this kind
      is scheduled, so no record is lost; Kafka keeps its log on disk.
  kill:leader
      on a three-node Kafka cluster (`--broker kafka --nodes 3`): SIGKILL of the node that
      leads a partition of rl.experience.v2, restarted after `broker_down_s` once the other
      two nodes, which hold every acknowledged write (replication 3, min in-sync 2), have
      elected a new leader (waited for up to the recovery timeout).
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
import time
from contextlib import nullcontext
from dataclasses import replace
from pathlib import Path

from rlstream.config import Config
from rlstream.connectors.faults import FAULTS_DIR
from rlstream.ops.launcher.childrun import ChildRun, wait_for
from rlstream.ops.reliability.audit import (
    audit_run,
    drain,
)
from rlstream.ops.reliability.chaos_faults import (  # noqa: F401  (the command's names)
    FAULT_KINDS,
    OUTSIDE,
    RANK_FAULTS,
    UNTIL,
    ChaosArgs,
    ChaosError,
    Fault,
    Injector,
    check_cluster,
    default_kinds,
    environment_of,
    schedule,
    work_done,
)
from rlstream.ops.reliability.chaos_figures import (
    _pct,
    survived,
    unrecovered,
)
from rlstream.ops.stack.envserver import EnvServer

log = logging.getLogger(__name__)


def run_chaos(cfg: Config, out_root: Path, args: ChaosArgs, say=print) -> dict:
    """Run the loop under faults, drain it, audit it; return the figures."""
    from rlstream.ops.stack.embedded import EmbeddedStack

    bad = [k for k in args.kinds if k not in FAULT_KINDS]
    if bad:
        raise ChaosError(f"unknown fault kind {bad[0]!r}; kinds: {', '.join(FAULT_KINDS)}")
    played = environment_of(cfg) if "kill:env" in args.kinds else ""
    if "kill:leader" in args.kinds:
        check_cluster(args.broker, args.nodes)
    if set(RANK_FAULTS) & set(args.kinds) and cfg.loop.trainer_ranks < 2:
        raise ChaosError("kill:trainer-1 kills a trainer rank besides rank 0: add "
                         "--set loop.trainer_ranks=2")  # fmt: skip
    run_dir = (out_root / cfg.run_id).resolve()
    run_dir.mkdir(parents=True, exist_ok=True)
    faults = schedule(args, cfg.loop.worker_range[0])
    # every injected kill is a crash to the supervisor: allow them all, however close together
    cfg = replace(cfg, loop=replace(cfg.loop, max_restarts=max(cfg.loop.max_restarts, len(faults))))
    home = run_dir / "home"  # no other stack's endpoints.json may be read by the run
    home.mkdir(exist_ok=True)
    durable = "kill:broker" in {f.kind for f in faults}  # a restarted broker keeps its log
    served = EnvServer(played, run_dir / "logs", cfg.env.options) if played else nullcontext()
    stack = EmbeddedStack(run_dir / "stack", durable=durable, broker=args.broker, nodes=args.nodes)
    with stack, served as env_server:
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
        "broker": f"{stack.broker} x{stack.nodes}",
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
