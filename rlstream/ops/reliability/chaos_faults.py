"""`rlstream chaos`'s faults: their kinds and schedule, and how each is injected into a running
loop (`Injector`): which process is which, when it works again. The run under faults and its
audit are `chaos.py`."""

from __future__ import annotations

import json
import logging
import os
import random
import signal
import time
from dataclasses import dataclass, field
from pathlib import Path

from rlstream.config import Config
from rlstream.connectors.faults import refused_calls
from rlstream.ops.launcher.childrun import RunFailed
from rlstream.ops.stack.envserver import EnvServer
from rlstream.schemas import get

PROCESS_FAULTS = ("kill:trainer", "kill:trainer@checkpoint", "kill:scheduler",
                  "kill:processors", "kill:rollouts", "stop:rollouts")  # fmt: skip
STORE_FAULTS = ("kill:broker", "s3-down", "qdrant-down")
SERVER_FAULTS = ("kill:env",)  # a server of the run that is not one of its processes
CLUSTER_FAULTS = ("kill:leader",)  # one node of a three-node Kafka cluster
RANK_FAULTS = ("kill:trainer-1",)  # a trainer rank besides rank 0 (loop.trainer_ranks > 1)
FAULT_KINDS = PROCESS_FAULTS + STORE_FAULTS + SERVER_FAULTS + CLUSTER_FAULTS + RANK_FAULTS
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
    broker: str | None = None  # the stack's (`EmbeddedStack`): tansu or kafka, nodes 1 or 3
    nodes: int | None = None
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


def check_cluster(broker: str | None, nodes: int | None) -> None:
    """`kill:leader` needs a cluster that outlives one node: ChaosError otherwise."""
    from rlstream.ops.stack.embedded import broker_choice

    if broker_choice(broker, nodes) != ("kafka", 3):
        raise ChaosError("kill:leader kills one node of a three-node Kafka cluster: "
                         "add --broker kafka --nodes 3")  # fmt: skip


def default_kinds(cfg: Config, broker: str | None = None, nodes: int | None = None) -> tuple:
    """Every kind that applies to the run: `kill:env` only where its prompts play an
    environment, `kill:leader` only on a three-node Kafka cluster, `kill:trainer-1` only with
    trainer ranks."""
    kinds = PROCESS_FAULTS + STORE_FAULTS
    if cfg.loop.trainer_ranks > 1:
        kinds += RANK_FAULTS
    try:
        environment_of(cfg)
        kinds += SERVER_FAULTS
    except ChaosError:
        pass
    try:
        check_cluster(broker, nodes)
        kinds += CLUSTER_FAULTS
    except ChaosError:
        pass
    return kinds


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
        if f.kind in ("kill:broker", "kill:leader"):
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

    from rlstream.ops.stack.procs import command_line

    module = MODULES.get(name.split("-")[0], "rlstream.streams.rollout_worker")
    for p in psutil.Process(run_pid).children(recursive=True):
        try:
            cmd = command_line(p)
            if cmd[1:3] != ["-m", module] or p.status() == psutil.STATUS_ZOMBIE:
                continue
        except psutil.NoSuchProcess:
            continue
        if name.startswith("rollouts-") and f"w{name.split('-')[1]}" not in cmd:
            continue
        rank = cmd[cmd.index("--rank") + 1] if "--rank" in cmd else None
        if name.startswith("trainer") and rank != (name.split("-")[1] if "-" in name else None):
            continue  # trainer ranks: "trainer" is rank 0, "trainer-N" the one with --rank N
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
        elif fault.kind == "kill:broker":  # every node of the broker
            fault.injected = time.time()
            nodes = self.stack.broker_servers()
            for name in nodes:
                self.stack.kill_server(name)
            time.sleep(self.args.broker_down_s)
            self.stack.start_servers(nodes)
            fault.detail = {"down_s": self.args.broker_down_s, "nodes": len(nodes)}
        elif fault.kind == "kill:leader":
            fault.detail = self._kill_leader()
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

    def _kill_leader(self) -> dict:
        """SIGKILL the node that leads a partition of the experience topic (picked by the run's
        seed), and start it again after `broker_down_s` and once the other two have elected a
        new leader (bounded by the recovery timeout): they hold every write (min in-sync 2);
        the loop's clients follow the new leader. When the killed node was also the active
        controller, a new controller must first be elected and then fence it, which on a
        loaded machine can take longer than `broker_down_s`; a restart before that would be an
        election nobody saw, testing nothing."""
        import asyncio

        topic = get("experience").topic
        rng = random.Random(self.args.seed)
        leaders = asyncio.run(partition_leaders(self.stack.endpoints, topic))
        partition = rng.choice(sorted(leaders))
        leader = leaders[partition]
        at = time.time()
        self.stack.kill_server(f"kafka-{leader}")
        down_until = time.monotonic() + self.args.broker_down_s
        deadline = time.monotonic() + max(self.args.broker_down_s, self.args.recovery_timeout_s)
        elected, elected_s = None, None  # the partition's leader while the old one is down
        quiet = logging.getLogger("aiokafka")  # its clients log every refused connection
        level, quiet.level = quiet.level, logging.CRITICAL
        while time.monotonic() < deadline:
            try:
                now = asyncio.run(partition_leaders(self.stack.endpoints, topic))
                if now.get(partition, leader) not in (leader, -1):
                    elected, elected_s = now[partition], round(time.time() - at, 1)
                    break
            except Exception:  # noqa: BLE001  (metadata from a cluster mid-election)
                pass
            time.sleep(0.2)
        quiet.setLevel(level)
        time.sleep(max(0.0, down_until - time.monotonic()))
        down_s = round(time.time() - at, 1)
        self.stack.start_server(f"kafka-{leader}")
        return {"topic": topic, "partition": partition, "leader": leader, "new_leader": elected,
                "elected_after_s": elected_s, "down_s": down_s,
                "_at": at}  # fmt: skip

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


async def partition_leaders(endpoints, topic: str) -> dict[int, int]:
    """Partition -> the node id that leads it (-1 while none does)."""
    from rlstream.connectors.kafka import admin

    client = admin(endpoints)
    await client.start()
    try:
        (described,) = await client.describe_topics([topic])
        return {p["partition"]: p["leader"] for p in described["partitions"]}
    finally:
        await client.close()
