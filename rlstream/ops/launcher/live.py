"""The run's live figures (live.json, read by the terminal view and `rlstream serve`): phase,
steps, accuracy, lag, messages/s, and each process's CPU and memory, traced over the run."""

from __future__ import annotations

import contextlib
import json
import os
import time
from collections import defaultdict
from pathlib import Path
from typing import TYPE_CHECKING

from rlstream.config import Config
from rlstream.connectors.endpoints import Endpoints

if TYPE_CHECKING:
    from rlstream.ops.launcher.supervisor import Supervisor

LIVE_FILE = "live.json"  # the live figures, rewritten about once a second (`rlstream serve`)


class LiveFile:
    """The run's live figures as a JSON file beside its report, for readers in other processes
    (`rlstream serve` streams it); written atomically (temp file + rename).

    `trace` is the figures that have no event of their own (policy lag, messages/s) sampled
    every `TRACE_EVERY_S`, thinned to every other sample past `TRACE_MAX`, so a page opened
    mid-run can draw them from the start; a resumed run continues its trace."""

    TRACE_EVERY_S, TRACE_MAX = 5.0, 720

    def __init__(
        self,
        path: Path,
        cfg: Config,
        every_s: float = 1.0,
        servers: dict[str, int] | None = None,
        disks: dict[str, Path] | None = None,
    ):
        self.path, self.cfg, self.every_s = path, cfg, every_s
        self.at = self.traced_at = float("-inf")
        self.usage = ProcessUsage()
        self.servers = servers or {}  # name -> pid of a local server (the broker, S3)
        self.disks = disks or {}  # name -> data directory of a local server
        try:
            self.trace: list[dict] = list(json.loads(path.read_text()).get("trace", []))
        except (OSError, ValueError, AttributeError):
            self.trace = []

    def write(self, view, sup: Supervisor, force: bool = False) -> None:
        if not force and time.monotonic() - self.at < self.every_s:
            return
        self.at = time.monotonic()
        figures = live_figures(self.cfg, view, sup)
        for name, usage in self.usage.sample(sup).items():
            figures["processes"][name] |= usage
        if force or self.at - self.traced_at >= self.TRACE_EVERY_S:
            self.traced_at = self.at
            self.trace.append({
                "t": figures["updated_at"],
                "rl_step": view.rl_step,
                "policy_lag": view.policy_lag,
                "messages_per_s": round(sum(figures["messages_per_s"].values()), 2),
                "completions": dict(view.completions),
                "processes": {n: [p.get("cpu_percent"), p.get("rss_mb"), p.get("pss_mb")]
                              for n, p in figures["processes"].items()},
                "servers": rss_mb(self.servers),
                "disks": {n: directory_mb(d) for n, d in self.disks.items()},
            })  # fmt: skip
            if len(self.trace) > self.TRACE_MAX:
                self.trace = self.trace[::2]
        tmp = self.path.with_suffix(".tmp")
        tmp.write_text(json.dumps(figures | {"trace": self.trace}, default=str))
        tmp.replace(self.path)


class ProcessUsage:
    """CPU share (percent of one core, since the last sample), resident memory and proportional
    memory (PSS: shared pages split between the processes that map them, so the processes'
    sum is what they hold together; torch's libraries are most of each one's RSS) of each
    child process, as the design notes' per-process views show them."""

    def __init__(self):
        self._procs: dict[int, object] = {}

    def sample(self, sup: Supervisor) -> dict[str, dict[str, float]]:
        import psutil

        out = {}
        for name, handle in sup.processes():
            if not (handle and handle.poll() is None):
                continue
            try:
                proc = self._procs.setdefault(handle.pid, psutil.Process(handle.pid))
                cpu = proc.cpu_percent(None)  # the first call of a process says 0.0
                memory = proc.memory_full_info()
            except (psutil.NoSuchProcess, psutil.AccessDenied):
                continue
            if handle.poll() is not None or not memory.rss:
                continue  # exited meanwhile: a process past its exit holds no memory map (0 bytes)
            out[name] = {"cpu_percent": round(cpu, 1), "rss_mb": round(memory.rss / 2**20, 1),
                         "pss_mb": round(memory.pss / 2**20, 1)}  # fmt: skip
        return out


def rss_mb(pids: dict[str, int]) -> dict[str, float]:
    """Resident memory (MiB) of each named process still alive."""
    import psutil

    out = {}
    for name, pid in pids.items():
        try:
            rss = psutil.Process(pid).memory_info().rss
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            continue
        if rss:  # 0: exiting, its memory map already gone
            out[name] = round(rss / 2**20, 1)
    return out


def directory_mb(directory: Path) -> float:
    """The disk the files under `directory` take, MiB (0 for none): blocks allocated, as `du`
    counts them (Kafka preallocates each active segment's indexes as 10 MB sparse files)."""
    total = 0
    for root, _, files in os.walk(directory):
        for name in files:
            with contextlib.suppress(OSError):  # a segment deleted meanwhile
                total += os.stat(os.path.join(root, name)).st_blocks * 512
    return round(total / 2**20, 1)


def server_pids(endpoints: Endpoints) -> dict[str, int]:
    """The local processes listening on the broker's and the S3 server's ports (none for a
    remote stack): their memory is traced beside the loop's (Tansu's memory storage keeps every
    record in RAM)."""
    import psutil

    wanted = {}
    for name, address in (("broker", endpoints.kafka_bootstrap), ("s3", endpoints.s3_endpoint)):
        host, _, port = address.split(",")[0].rpartition(":")
        if host in ("127.0.0.1", "localhost", "::1", "") and port.isdigit():
            wanted[int(port)] = name
    try:
        listening = psutil.net_connections(kind="tcp")
    except psutil.AccessDenied:
        return {}
    return {
        wanted[c.laddr.port]: c.pid
        for c in listening
        if c.status == psutil.CONN_LISTEN and c.laddr.port in wanted and c.pid
    }


def resource_figures(trace: list[dict], checkpoint_sizes: list) -> dict:
    """Memory per process: the last value seen (a process that finished first was last seen
    before the end) and the slope per 1,000 RL steps over the RL phase (least squares; None
    with fewer than 3 points over 10 steps); the same of the local servers' data directories
    and the slope of the checkpoint's size. A soak run's target is flat
    (`benchmarks/soak.yaml`)."""
    series: dict[str, list[tuple[int, float]]] = defaultdict(list)  # RL phase only
    disk_series: dict[str, list[tuple[int, float]]] = defaultdict(list)
    last: dict[str, float] = {}
    disk_last: dict[str, float] = {}
    pss: dict[str, float] = {}
    cpu: dict[str, list[float]] = defaultdict(list)  # RL phase: % of one core, per sample
    for t in trace:
        step = t.get("rl_step") or 0
        for name, p in t.get("processes", {}).items():
            if step and p[0] is not None:
                cpu[name].append(p[0])
        seen = {n: p[1] for n, p in t.get("processes", {}).items() if p[1] is not None}
        pss |= {n: p[2] for n, p in t.get("processes", {}).items() if p[2:] and p[2] is not None}
        for name, rss in (seen | t.get("servers", {})).items():
            last[name] = rss
            if step:
                series[name].append((step, rss))
        for name, mb in t.get("disks", {}).items():
            disk_last[name] = mb
            if step:
                disk_series[name].append((step, mb))
    sizes = [(step, size) for step, size in checkpoint_sizes if step]
    return {
        "rss_mb_end": dict(sorted(last.items())),
        "pss_mb_end": dict(sorted(pss.items())),
        "pss_mb_loop_total_end": round(sum(pss.values()), 1) if pss else None,
        "rss_mb_slope_per_1k_steps": {n: slope_per_1k(pts) for n, pts in sorted(series.items())},
        "disk_mb_end": dict(sorted(disk_last.items())),
        "disk_mb_slope_per_1k_steps": {
            n: slope_per_1k(pts) for n, pts in sorted(disk_series.items())
        },
        "checkpoint_bytes_end": sizes[-1][1] if sizes else None,
        "checkpoint_bytes_slope_per_1k_steps": slope_per_1k(sizes),
        # each process's mean share of the machine's cores over the RL phase (the scheduler's
        # is what choosing prompts takes from the rollout workers and the trainer)
        "cpu_share_of_cores_rl": {
            n: round(sum(v) / len(v) / (100 * (os.cpu_count() or 1)), 3)
            for n, v in sorted(cpu.items())
        },  # fmt: skip
    }


def slope_per_1k(points: list[tuple[int, float]]) -> float | None:
    """Least-squares slope of value on step, per 1,000 steps (pure)."""
    if len(points) < 3 or points[-1][0] - points[0][0] < 10:
        return None
    import numpy as np

    steps, values = np.array(points, dtype=float).T
    if np.ptp(steps) == 0:
        return None
    return round(float(np.polyfit(steps, values, 1)[0]) * 1000, 2)


def live_figures(cfg: Config, view, sup: Supervisor) -> dict:
    """What a run looks like now: phase, steps, accuracy, reward, lag, rates, processes."""
    return {
        "run_id": cfg.run_id,
        "dataset": cfg.data.dataset,
        "updated_at": time.time(),
        "phase": view.phase,
        "pretrain_step": view.pretrain_step,
        "pretrain_max_steps": cfg.pretrain.max_steps,
        "val_loss": view.val_loss,
        "rl_step": view.rl_step,
        "rl_steps": cfg.rl.steps,
        "accuracy": view.accuracy,
        "pass1": view.pass1,
        "reward": view.reward,
        "policy_lag": view.policy_lag,
        "messages_per_s": {t.split(".")[1]: r for t, r in view.rates.items() if r},
        "completions": dict(view.completions),
        "processes": {
            name: {
                "alive": bool(handle and handle.poll() is None),
                "restarts": sup.restarts_of(name),
            }
            for name, handle in sup.processes()
        },
        "evals": [
            {k: r[k] for k in ("step", "task", "metric", "value")} for r in view.evals[-2000:]
        ],
    }
