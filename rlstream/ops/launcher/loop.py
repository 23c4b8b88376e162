"""`rlstream run`: the streaming RL loop on the embedded stack (or RLSTREAM_* endpoints).

Seeds the run's topics (the prompt pool and the pre-training corpus, both from the task
environments), then supervises the loop's processes — trainer, scheduler, stream processors,
rollout workers — restarting any that crash (each resumes from its checkpoint or its committed
offsets), shows a live view, and when the trainer is done writes the report.
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import time
from collections import defaultdict
from dataclasses import dataclass, field, replace
from pathlib import Path

from rlstream import metrics
from rlstream.config import Config, show
from rlstream.connectors.endpoints import Endpoints
from rlstream.connectors.reading import read_rows_where
from rlstream.ops.commands.publish import publish_file
from rlstream.ops.stack import procs
from rlstream.schemas import get
from rlstream.tracking import open_tracker, safely

PROMPTS, CORPUS = get("prompts"), get("corpus")
BAD_ROWS_SHOWN = 20  # refused rows listed in the summary and report (all are counted)
STOP_GRACE_S = 5.0  # children get this long after SIGTERM (the trainer saves; the scheduler
# flushes Qdrant) before SIGKILL; they stop together, so Ctrl-C ends a run within it


def with_dataset(cfg: Config) -> Config:
    """The config with data.dataset named (`datasets.dataset_name`), as every process reads it."""
    from rlstream.trainers.datasets import dataset_name

    return replace(cfg, data=replace(cfg.data, dataset=dataset_name(cfg)))


async def seed_topics(endpoints: Endpoints, cfg: Config, out: Path) -> dict:
    """Publish the run's data like any user: generated prompts and corpus are written to
    `<run>/data/*.jsonl` first; files named by data.prompts / data.corpus go as they are;
    topic:DATASET sources are already on the topics. Bad rows are reported, not fatal."""
    from rlstream.trainers.datasets import generated_corpus_rows, generated_prompt_rows

    dataset, data_dir = cfg.data.dataset, out / "data"
    prompts, corpus = cfg.data.prompts, cfg.data.corpus
    if prompts is None:
        data_dir.mkdir(parents=True, exist_ok=True)
        prompts = str(write_jsonl(data_dir / "prompts.jsonl", generated_prompt_rows(cfg, dataset)))
        if corpus is None:
            rows = generated_corpus_rows(cfg, dataset)
            corpus = str(write_jsonl(data_dir / "corpus.jsonl", rows))
    figures: dict = {"dataset": dataset, "bad_rows": {}}
    for event, source in ((PROMPTS, prompts), (CORPUS, corpus)):
        if source is None or source.startswith("topic:"):
            continue
        report = await publish_file(
            endpoints, Path(source), event, batch_rows=2000, run_id=cfg.run_id, dataset=dataset,
            check=run_admission(cfg) if event is PROMPTS else None,
        )  # fmt: skip
        figures[f"{event.name}_published"] = report.rows_published
        if report.bad_rows:
            figures["bad_rows"][str(source)] = report.bad_rows[:BAD_ROWS_SHOWN]
            figures[f"{event.name}_refused"] = len(report.bad_rows)
    return figures


def run_admission(cfg: Config):
    """A row check for `publish_file`: the prompts this run cannot train on are refused."""
    from rlstream.schemas import RowError
    from rlstream.trainers.datasets import prompt_problem
    from rlstream.trainers.lm import load_tokenizer

    tok, room = load_tokenizer(cfg.model), cfg.model.block_size - cfg.rl.max_new_tokens

    def check(row: dict) -> None:
        problem = prompt_problem(row, tok, room)
        if problem:
            raise RowError(problem)

    return check


def write_jsonl(path: Path, rows: list[dict]) -> Path:
    with open(path, "w") as f:
        for row in rows:
            f.write(json.dumps(row) + "\n")
    return path


@dataclass
class Child:
    name: str
    argv: list[str]
    log: Path
    proc: subprocess.Popen | None = None
    metrics_port: int = 0
    restarts: int = 0
    finished: bool = False
    crashes: list[float] = field(default_factory=list)  # monotonic times, within the window


@dataclass
class Supervisor:
    """Starts the loop's processes and restarts a crashed one, unless it crashed more than
    `loop.max_restarts` times within `loop.restart_window_s` (a crash loop, not a fault)."""

    cfg_path: Path
    env: dict[str, str]
    log_dir: Path
    workers: int = 2
    children: list[Child] = field(default_factory=list)

    def __post_init__(self) -> None:
        py, cfg = sys.executable, str(self.cfg_path)
        run = Config.read(self.cfg_path)
        self.max_restarts, self.window_s = run.loop.max_restarts, run.loop.restart_window_s
        scoring = ["--run-id", run.run_id, "--config", cfg]
        scoring += ["--reward-rules", run.rl.reward_rules] if run.rl.reward_rules else []
        scoring += ["--reward-fn", run.rl.reward_fn] if run.rl.reward_fn else []
        scoring += ["--verifier-timeout-s", str(run.rl.verifier_timeout_s)]
        specs = [
            ("trainer", [py, "-m", "rlstream.streams.trainer", "--config", cfg]),
            ("scheduler", [py, "-m", "rlstream.streams.scheduler", "--config", cfg]),
            (
                "processors",
                [
                    py,
                    "-m",
                    "rlstream.streams.worker",
                    "score_rollouts",
                    "assemble_experience",
                    "--app-id",
                    self._group("processors"),
                    *scoring,
                ],
            ),
        ] + [
            (
                f"rollouts-{i}",
                [
                    py,
                    "-m",
                    "rlstream.streams.rollout_worker",
                    "--config",
                    cfg,
                    "--worker-id",
                    f"w{i}",
                ],
            )
            for i in range(1, self.workers + 1)
        ]
        ports = procs.free_ports(len(specs))
        self.children = [
            Child(n, a, self.log_dir / f"{n}.log", metrics_port=port)
            for (n, a), port in zip(specs, ports, strict=True)
        ]

    def metrics_endpoints(self) -> dict[str, str]:
        """Where each process serves its Prometheus metrics."""
        return {c.name: f"http://127.0.0.1:{c.metrics_port}/metrics" for c in self.children}

    def _group(self, role: str) -> str:
        return Config.read(self.cfg_path).group(role)

    def start(self) -> None:
        self.log_dir.mkdir(parents=True, exist_ok=True)
        for child in self.children:
            self._spawn(child)

    def _spawn(self, child: Child) -> None:
        env = self.env | {"RLSTREAM_METRICS_PORT": str(child.metrics_port)}
        child.proc = procs.spawn(child.argv, log=child.log, env=env)

    def poll(self) -> list[str]:
        """Restart crashed children; return events worth telling the user."""
        news = []
        for child in self.children:
            code = child.proc.poll() if child.proc else None
            if code is None or child.finished:
                continue
            if code == 0:
                child.finished = True
                news.append(f"{child.name} finished")
                continue
            now = time.monotonic()
            child.crashes = [t for t in child.crashes if now - t < self.window_s] + [now]
            if len(child.crashes) <= self.max_restarts:
                child.restarts += 1
                news.append(f"{child.name} exited with {code}; restart {child.restarts}")
                self._spawn(child)
            else:
                child.finished = True
                news.append(f"{child.name} crashed {len(child.crashes)} times in "
                            f"{self.window_s:.0f} s; giving up (log: {child.log})")  # fmt: skip
        return news

    def trainer(self) -> Child:
        return self.children[0]

    def stop(self) -> None:
        """SIGTERM every child at once; SIGKILL what is left after STOP_GRACE_S (a second
        Ctrl-C while waiting kills them at once)."""
        alive = [c.proc.pid for c in self.children if c.proc and c.proc.poll() is None]
        procs.terminate_all(alive, timeout_s=STOP_GRACE_S)


TRACK_EVERY_S = 5.0  # MLflow: new eval and training figures are sent this often
LIVE_FILE = "live.json"  # the live figures, rewritten about once a second (`rlstream serve`)


class LiveFile:
    """The run's live figures as a JSON file beside its report, for readers in other processes
    (`rlstream serve` streams it); written atomically (temp file + rename).

    `trace` is the figures that have no event of their own (policy lag, messages/s) sampled
    every `TRACE_EVERY_S`, thinned to every other sample past `TRACE_MAX`, so a page opened
    mid-run can draw them from the start; a resumed run continues its trace."""

    TRACE_EVERY_S, TRACE_MAX = 5.0, 720

    def __init__(
        self, path: Path, cfg: Config, every_s: float = 1.0, servers: dict[str, int] | None = None
    ):
        self.path, self.cfg, self.every_s = path, cfg, every_s
        self.at = self.traced_at = float("-inf")
        self.usage = ProcessUsage()
        self.servers = servers or {}  # name -> pid of a local server (the broker, S3)
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
        for c in sup.children:
            if not (c.proc and c.proc.poll() is None):
                continue
            try:
                proc = self._procs.setdefault(c.proc.pid, psutil.Process(c.proc.pid))
                cpu = proc.cpu_percent(None)  # the first call of a process says 0.0
                memory = proc.memory_full_info()
            except (psutil.NoSuchProcess, psutil.AccessDenied):
                continue
            if c.proc.poll() is not None:  # exited meanwhile: a zombie reads 0 bytes resident
                continue
            out[c.name] = {"cpu_percent": round(cpu, 1), "rss_mb": round(memory.rss / 2**20, 1),
                           "pss_mb": round(memory.pss / 2**20, 1)}  # fmt: skip
        return out


def rss_mb(pids: dict[str, int]) -> dict[str, float]:
    """Resident memory (MiB) of each named process still alive."""
    import psutil

    out = {}
    for name, pid in pids.items():
        try:
            out[name] = round(psutil.Process(pid).memory_info().rss / 2**20, 1)
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            continue
    return out


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
    with fewer than 3 points over 10 steps); the same slope of the checkpoint's size. A soak
    run's target is flat (`benchmarks/soak.yaml`)."""
    series: dict[str, list[tuple[int, float]]] = defaultdict(list)  # RL phase only
    last: dict[str, float] = {}
    pss: dict[str, float] = {}
    for t in trace:
        step = t.get("rl_step") or 0
        seen = {n: p[1] for n, p in t.get("processes", {}).items() if p[1] is not None}
        pss |= {n: p[2] for n, p in t.get("processes", {}).items() if p[2:] and p[2] is not None}
        for name, rss in (seen | t.get("servers", {})).items():
            last[name] = rss
            if step:
                series[name].append((step, rss))
    sizes = [(step, size) for step, size in checkpoint_sizes if step]
    return {
        "rss_mb_end": dict(sorted(last.items())),
        "pss_mb_end": dict(sorted(pss.items())),
        "pss_mb_loop_total_end": round(sum(pss.values()), 1) if pss else None,
        "rss_mb_slope_per_1k_steps": {n: slope_per_1k(pts) for n, pts in sorted(series.items())},
        "checkpoint_bytes_end": sizes[-1][1] if sizes else None,
        "checkpoint_bytes_slope_per_1k_steps": slope_per_1k(sizes),
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
            c.name: {"alive": bool(c.proc and c.proc.poll() is None), "restarts": c.restarts}
            for c in sup.children
        },
        "evals": [
            {k: r[k] for k in ("step", "task", "metric", "value")} for r in view.evals[-2000:]
        ],
    }


def child_env(endpoints: Endpoints, cfg: Config, run_dir: Path | None = None) -> dict[str, str]:
    env = dict(os.environ) | endpoints.as_env()
    env["RLSTREAM_SESSION_TIMEOUT_MS"] = str(cfg.loop.session_timeout_ms)
    env["OMP_NUM_THREADS"] = str(cfg.threads(streaming=True))
    env["RLSTREAM_S3_RETRY_S"] = str(cfg.loop.s3_retry_s)
    if run_dir is not None:
        env["RLSTREAM_FAUST_DIR"] = str(Path(run_dir).resolve() / "faust")
    return env


def wait_for_trainer(sup: Supervisor, on_tick, timeout_s: float) -> bool:
    """Supervise until the trainer exits cleanly; on_tick(news) drives the live view."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        news = sup.poll()
        on_tick(news)
        trainer = sup.trainer()
        if trainer.finished:
            return trainer.proc.returncode == 0
        time.sleep(0.5)
    return False


def run_loop(cfg: Config, out_root: Path, on_tick=None, timeout_s: float = 3600) -> dict:
    """Seed, supervise until the trainer is done, collect figures, write the report."""
    from rlstream.connectors.objectstore import ObjectStore
    from rlstream.ops.launcher.datapath import how_to_continue, stack_or_endpoints
    from rlstream.ops.launcher.report import write_report
    from rlstream.ops.launcher.watch import RunWatcher
    from rlstream.streams.policystore import stored_versions
    from rlstream.trainers.datasets import with_tokenizer

    cfg = with_dataset(cfg)
    out = (out_root / cfg.run_id).resolve()
    out.mkdir(parents=True, exist_ok=True)
    cfg = with_tokenizer(cfg, out / "tokenizer")  # bpe:N: trained once, every process loads it
    cfg = with_warm_start(cfg, out_root)
    cfg_path = cfg.write(out / "config.json")
    (out / "config.yaml").write_text(show(cfg))
    tracker = open_tracker(cfg, out)
    started = time.monotonic()
    with stack_or_endpoints(out / "stack", cfg.loop.durable_stack) as (endpoints, embedded):
        seeded = asyncio.run(seed_topics(endpoints, cfg, out))
        watcher = RunWatcher(endpoints, cfg.run_id).start()
        sup = Supervisor(
            cfg_path, child_env(endpoints, cfg, out), out / "logs", cfg.loop.rollout_workers
        )
        sup.start()
        (out / "metrics.json").write_text(json.dumps(sup.metrics_endpoints(), indent=2))
        targets = metrics.file_sd_targets(sup.metrics_endpoints(), cfg.run_id)
        (out / "prometheus-targets.json").write_text(json.dumps(targets, indent=2))
        scraped = None  # the stack's Prometheus scrapes the run while it runs
        if endpoints.prometheus_targets:
            scraped = Path(endpoints.prometheus_targets) / f"{cfg.run_id}.json"
            scraped.write_text(json.dumps(targets, indent=2))
        live = LiveFile(out / LIVE_FILE, cfg, servers=server_pids(endpoints))
        tracked = {"at": time.monotonic(), "startup_s": None}

        def tick(news: list[str]) -> None:
            if tracked["startup_s"] is None and watcher.view.phase != "starting":
                tracked["startup_s"] = round(time.monotonic() - started, 1)
            live.write(watcher.view, sup)
            if time.monotonic() - tracked["at"] > TRACK_EVERY_S:
                tracked["at"] = time.monotonic()
                safely(tracker, "log_evals", list(watcher.view.evals))
            if on_tick:
                on_tick(watcher.view, sup, news)

        try:
            ok = wait_for_trainer(sup, tick, timeout_s)
            sampled_at = time.monotonic() + 2.5  # one more throughput sample after the last events
        except KeyboardInterrupt:
            procs.kill_all_on_next_interrupt(
                "interrupted again: killed every process of the run; "
                + how_to_continue(cfg.run_id, out_root, cfg.loop.durable_stack)
            )
            safely(tracker, "stopped")
            sup.stop()
            watcher.stop()  # its connections would hold the broker's shutdown open
            raise
        finally:
            sup.stop()
            if scraped is not None:
                scraped.unlink(missing_ok=True)
        time.sleep(max(0.0, sampled_at - time.monotonic()))  # while the children stop
        watcher.stop()
        if cfg.selection.sampler == "ppm":  # what a later run's --ppm-from starts from
            safely_export_ppm(endpoints, cfg.run_id, out / "ppm")
        live.write(watcher.view, sup, force=True)  # where the run ended
        summary = (
            collect(endpoints, cfg)
            | seeded
            | {
                "messages_per_s": rl_rates(watcher.view),
                "completed": ok,
                "embedded_stack": embedded,
                "restarts": {c.name: c.restarts for c in sup.children if c.restarts},
                "wall_s": round(time.monotonic() - started, 1),
                "startup_s": tracked["startup_s"],  # launch -> the first pre-training figures
            }
            | scheduler_figures(watcher.view.evals)
        )
        summary |= resource_figures(live.trace, summary.get("checkpoint_sizes", []))
        report = write_report(out, summary, watcher.view)
        store = ObjectStore(endpoints)
        try:  # the copy beside the run's other objects; the run's own files are the record
            for path in (report, out / "curves.png"):
                store.put_file(f"{cfg.run_id}/reports/{path.name}", path)
        except Exception as exc:  # noqa: BLE001  (an S3 failure after the retries: say so)
            print(f"warning: the report stays in {out} only: uploading it failed ({exc})",
                  file=sys.stderr)  # fmt: skip
        if tracker is not None:
            safely(tracker, "log_evals", list(watcher.view.evals))
            stored = stored_versions(store, cfg.run_id)  # what the pruning kept
            versions = [r for r in asyncio.run(_run_rows(endpoints, "policy_versions", cfg.run_id))
                        if r["version"] in stored]  # fmt: skip
            artifacts = [report, out / "curves.png", out / "config.yaml"]
            safely(tracker, "finish", summary, artifacts, versions)
    summary["report"] = str(report)
    return summary


def with_warm_start(cfg: Config, out_root: Path) -> Config:
    """`selection.ppm_from` as the directory of that run's PPM export (a run id is looked up
    under `out_root`; a resumed run keeps the directory it was given)."""
    from rlstream.streams.scheduler import PPM_EXPORT

    name = cfg.selection.ppm_from
    if not name:
        return cfg
    directory = Path(name) if Path(name).is_absolute() else (out_root / name / "ppm").resolve()
    missing = [f for f in PPM_EXPORT if not (directory / f).exists()]
    if missing:
        raise ValueError(
            f"selection.ppm_from: no PPM of run {name!r} in {directory} (missing "
            f"{', '.join(missing)}); name a finished `--sampler ppm` run under {out_root}"
        )
    return replace(cfg, selection=replace(cfg.selection, ppm_from=str(directory)))


def safely_export_ppm(endpoints: Endpoints, run_id: str, directory: Path) -> None:
    from rlstream.streams.scheduler import export_ppm

    try:
        export_ppm(endpoints, run_id, directory)
    except Exception as exc:  # noqa: BLE001  (the run's result stands without it)
        print(f"warning: the PPM was not saved for --ppm-from ({exc})", file=sys.stderr)


async def _run_rows(endpoints: Endpoints, event_name: str, run_id: str) -> list[dict]:
    from rlstream.connectors.reading import read_run_rows

    return await read_run_rows(endpoints, get(event_name).topic, run_id)


def rl_rates(view) -> dict[str, float]:
    """Mean messages/s per topic over the RL phase (first to last sample with experience)."""
    samples = [(t, c) for t, c in view.throughput if c.get(get("experience").topic, 0) > 0]
    if len(samples) < 2:
        return {}
    (t0, c0), (t1, c1) = samples[0], samples[-1]
    return {
        topic.split(".")[1]: round((c1[topic] - c0.get(topic, 0)) / (t1 - t0), 2)
        for topic in c1
        if c1[topic] > c0.get(topic, 0)
    }


def latency(requests: list[dict], experience: list[dict]) -> dict:
    """Request-to-experience latency per group (produced_at of the request to that of the
    first experience row of its group), p50 and p99 in milliseconds."""
    import numpy as np

    asked = {r["request_id"]: r["produced_at"] for r in requests}
    done: dict[str, object] = {}
    for r in experience:
        if r["request_id"] in asked:
            done[r["request_id"]] = min(
                done.get(r["request_id"], r["produced_at"]), r["produced_at"]
            )
    ms = [(t - asked[k]).total_seconds() * 1000 for k, t in done.items()]
    if not ms:
        return {"request_to_experience_p50_ms": None, "request_to_experience_p99_ms": None}
    return {
        "request_to_experience_p50_ms": round(float(np.percentile(ms, 50)), 1),
        "request_to_experience_p99_ms": round(float(np.percentile(ms, 99)), 1),
    }


def scheduler_figures(evals: list[dict]) -> dict:
    """The scheduler's last report (eval_results rows): its PPM's live calibration on prompts
    never rolled out before (task `ppm`) and the time choosing prompts took (task
    `scheduler`), e.g. {"ppm_brier_unseen": 0.12, "scheduler_select_ms_per_round": 210.0}."""
    return {
        f"{r['task']}_{r['metric']}": round(r["value"], 4)
        for r in evals
        if r["task"] in ("ppm", "scheduler")
    }


def qdrant_figures(endpoints: Endpoints, cfg: Config) -> dict:
    """Prompts with outcome statistics in the run's Qdrant collection (the environment state)."""
    from rlstream.connectors.vectors import VectorStore
    from rlstream.streams.scheduler import collection_name

    store = VectorStore.open(endpoints, collection_name(cfg.run_id), 0, create=False)
    try:
        return {"qdrant_prompts": store.count() if store.exists() else 0}
    finally:
        store.close()


def collect(endpoints: Endpoints, cfg: Config) -> dict:
    """The run's figures: the trainer's summary, and experience published vs archived."""

    from rlstream.connectors.objectstore import ObjectStore

    store = ObjectStore(endpoints)
    name = f"{cfg.run_id}/reports/trainer.json"
    trainer = json.loads(store.get_bytes(name)) if store.exists(name) else {}
    published = asyncio.run(_run_rows(endpoints, "experience", cfg.run_id))
    archive = store.read_parquet_prefix(f"{cfg.run_id}/experience/")
    archived = archive.column("event_id").to_pylist() if archive.num_rows else []
    published_ids = {r["event_id"] for r in published}
    requests = asyncio.run(_run_rows(endpoints, "rollout_requests", cfg.run_id))
    prompts = asyncio.run(
        read_rows_where(endpoints, PROMPTS.topic, lambda r: r["dataset"] == cfg.data.dataset)
    )
    ppm = cfg.selection.sampler == "ppm"
    figures = {"run_id": cfg.run_id, "sampler": cfg.selection.sampler,
               "ppm_features": cfg.ppm_feature_spec() if ppm else None, **trainer}  # fmt: skip
    figures |= {
        "experience_published": len(published_ids),
        "experience_messages_redelivered": len(published) - len(published_ids),
        "experience_archived": len(archived),
        "archive_duplicates": len(archived) - len(set(archived)),
        "archive_matches_topic": set(archived) == published_ids,
    }
    figures |= latency(requests, published) | joined_mid_run(prompts, requests, cfg)
    return figures | qdrant_figures(endpoints, cfg)


def joined_mid_run(prompts: list[dict], requests: list[dict], cfg: Config) -> dict:
    """Train prompts of the dataset published after the run's first rollout request: how many,
    how many were requested since, and publish -> first request latency (p50, max; ms)."""
    import numpy as np

    from rlstream.trainers.datasets import prompt_problem, split_of_row
    from rlstream.trainers.lm import load_tokenizer

    if not requests:
        return {}
    tok, room = load_tokenizer(cfg.model), cfg.model.block_size - cfg.rl.max_new_tokens
    start = min(r["produced_at"] for r in requests)
    first: dict[str, object] = {}
    for r in requests:
        if r["prompt_id"] not in first or r["produced_at"] < first[r["prompt_id"]]:
            first[r["prompt_id"]] = r["produced_at"]
    late = {}
    for p in prompts:
        if p["produced_at"] <= start or split_of_row(p, cfg.data.heldout_frac) != "train":
            continue
        if not prompt_problem(p, tok, room):  # refused ones are dead letters, not late prompts
            late.setdefault(p["prompt_id"], p["produced_at"])
    waits = [
        (first[pid] - at).total_seconds() * 1000
        for pid, at in late.items()
        if pid in first and first[pid] >= at
    ]
    out = {"prompts_published_mid_run": len(late), "mid_run_prompts_requested": len(waits)}
    if waits:
        out["publish_to_first_request_p50_ms"] = round(float(np.percentile(waits, 50)), 1)
        out["publish_to_first_request_max_ms"] = round(max(waits), 1)
    return out
