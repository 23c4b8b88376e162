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
from dataclasses import dataclass, field
from pathlib import Path

from rlstream import metrics
from rlstream.config import Config, show
from rlstream.connectors.endpoints import Endpoints
from rlstream.connectors.kafka import EventProducer
from rlstream.ops import procs
from rlstream.schemas import get, make_event_id, rows_to_batch
from rlstream.trainers.envs import TaskMix, sample_prompts
from rlstream.trainers.pretrain import build_corpus

PROMPTS, CORPUS = get("prompts"), get("corpus")
STOP_GRACE_S = 5.0  # children get this long after SIGTERM (the trainer saves; the scheduler
# flushes Qdrant) before SIGKILL; they stop together, so Ctrl-C ends a run within it


async def seed_topics(endpoints: Endpoints, cfg: Config, batch_rows: int = 2000) -> dict:
    """Publish the run's prompt pool and pre-training corpus (deterministic from the seed)."""
    mix = TaskMix.parse(cfg.data.tasks)
    pool = sample_prompts(mix, cfg.data.pool_size, "train", cfg.seed, unique=False)
    prompts = [
        p.to_row() | {"split": "train", "event_id": make_event_id("pool", cfg.run_id, i)}
        for i, p in enumerate(pool)
    ]
    docs = build_corpus(mix, cfg.data.corpus_docs, cfg.data.flaw_rate, cfg.seed, cfg.seed)
    corpus = [
        {"doc_id": f"{cfg.run_id}-doc-{i:08d}", "text": d, "source": "generator"}
        for i, d in enumerate(docs)
    ]
    async with EventProducer(endpoints) as producer:
        for event, rows in ((PROMPTS, prompts), (CORPUS, corpus)):
            for i in range(0, len(rows), batch_rows):
                batch = rows_to_batch(event, rows[i : i + batch_rows], run_id=cfg.run_id)
                await producer.send(event, batch)
    return {"prompts_published": len(prompts), "corpus_published": len(corpus)}


@dataclass
class Child:
    name: str
    argv: list[str]
    log: Path
    proc: subprocess.Popen | None = None
    metrics_port: int = 0
    restarts: int = 0
    finished: bool = False


@dataclass
class Supervisor:
    """Starts the loop's processes and restarts a crashed one (up to max_restarts each)."""

    cfg_path: Path
    env: dict[str, str]
    log_dir: Path
    workers: int = 2
    max_restarts: int = 3
    children: list[Child] = field(default_factory=list)

    def __post_init__(self) -> None:
        py, cfg = sys.executable, str(self.cfg_path)
        run = Config.read(self.cfg_path)
        scoring = ["--run-id", run.run_id]
        scoring += ["--reward-rules", run.rl.reward_rules] if run.rl.reward_rules else []
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
            elif child.restarts < self.max_restarts:
                child.restarts += 1
                news.append(f"{child.name} exited with {code}; restart {child.restarts}")
                self._spawn(child)
            else:
                child.finished = True
                news.append(
                    f"{child.name} crashed {child.restarts + 1} times; giving up (log: {child.log})"
                )
        return news

    def trainer(self) -> Child:
        return self.children[0]

    def stop(self) -> None:
        """SIGTERM every child at once; SIGKILL what is left after STOP_GRACE_S (a second
        Ctrl-C while waiting kills them at once)."""
        alive = [c.proc.pid for c in self.children if c.proc and c.proc.poll() is None]
        procs.terminate_all(alive, timeout_s=STOP_GRACE_S)


def child_env(endpoints: Endpoints, cfg: Config, run_dir: Path | None = None) -> dict[str, str]:
    env = dict(os.environ) | endpoints.as_env()
    env["RLSTREAM_SESSION_TIMEOUT_MS"] = str(cfg.loop.session_timeout_ms)
    env["OMP_NUM_THREADS"] = str(cfg.threads(streaming=True))
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
    from rlstream.ops.report import write_report
    from rlstream.ops.run import stack_or_endpoints
    from rlstream.ops.watch import RunWatcher

    out = (out_root / cfg.run_id).resolve()
    out.mkdir(parents=True, exist_ok=True)
    cfg_path = cfg.write(out / "config.json")
    (out / "config.yaml").write_text(show(cfg))
    started = time.monotonic()
    with stack_or_endpoints(out / "stack") as (endpoints, embedded):
        seeded = asyncio.run(seed_topics(endpoints, cfg))
        watcher = RunWatcher(endpoints, cfg.run_id).start()
        sup = Supervisor(
            cfg_path, child_env(endpoints, cfg, out), out / "logs", cfg.loop.rollout_workers
        )
        sup.start()
        (out / "metrics.json").write_text(json.dumps(sup.metrics_endpoints(), indent=2))
        targets = metrics.file_sd_targets(sup.metrics_endpoints(), cfg.run_id)
        (out / "prometheus-targets.json").write_text(json.dumps(targets, indent=2))
        try:
            ok = wait_for_trainer(
                sup, lambda news: on_tick and on_tick(watcher.view, sup, news), timeout_s
            )
        finally:
            sup.stop()
        time.sleep(2.5)  # one more throughput sample after the last events
        watcher.stop()
        summary = (
            collect(endpoints, cfg)
            | seeded
            | {
                "messages_per_s": rl_rates(watcher.view),
                "completed": ok,
                "embedded_stack": embedded,
                "restarts": {c.name: c.restarts for c in sup.children if c.restarts},
                "wall_s": round(time.monotonic() - started, 1),
            }
        )
        report = write_report(out, summary, watcher.view)
        store = ObjectStore(endpoints)
        for path in (report, out / "curves.png"):
            store.put_file(f"{cfg.run_id}/reports/{path.name}", path)
    summary["report"] = str(report)
    return summary


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


def qdrant_figures(endpoints: Endpoints, cfg: Config) -> dict:
    """Prompts with outcome statistics in the run's Qdrant collection (the environment state)."""
    from rlstream.connectors.vectors import vector_client
    from rlstream.streams.scheduler import collection_name

    client = vector_client(endpoints)
    try:
        name = collection_name(cfg.run_id)
        count = client.count(name).count if client.collection_exists(name) else 0
    finally:
        client.close()
    return {"qdrant_prompts": count}


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
    figures = {"run_id": cfg.run_id, "sampler": cfg.selection.sampler, **trainer}
    figures |= {
        "experience_published": len(published_ids),
        "experience_messages_redelivered": len(published) - len(published_ids),
        "experience_archived": len(archived),
        "archive_duplicates": len(archived) - len(set(archived)),
        "archive_matches_topic": set(archived) == published_ids,
    }
    return figures | latency(requests, published) | qdrant_figures(endpoints, cfg)
