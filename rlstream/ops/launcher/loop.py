"""`rlstream run`: the streaming RL loop on the embedded stack (or RLSTREAM_* endpoints).

Seeds the run's topics (the prompt pool and the pre-training corpus, both from the task
environments), then supervises the loop's processes — trainer, scheduler, stream processors,
rollout workers — restarting any that crash (each resumes from its checkpoint or its committed
offsets), shows a live view, and when the trainer is done writes the report.
"""

from __future__ import annotations

import asyncio
import json
import sys
import time
from dataclasses import replace
from pathlib import Path

from rlstream import metrics
from rlstream.config import Config, show
from rlstream.connectors.endpoints import Endpoints
from rlstream.ops.launcher.figures import (
    _run_rows,
    collect,
    rl_rates,
    scheduler_figures,
    selection_compute,
    time_to_mark,
)
from rlstream.ops.launcher.live import LIVE_FILE, LiveFile, resource_figures, server_pids
from rlstream.ops.launcher.seeding import seed_topics, with_dataset
from rlstream.ops.launcher.supervisor import Supervisor, child_env, wait_for_trainer
from rlstream.ops.stack import procs
from rlstream.tracking import open_tracker, safely

TRACK_EVERY_S = 5.0  # MLflow: new eval and training figures are sent this often
OTHERS_AFTER_S = 30.0
"""The scheduler, processors and rollout workers start once pre-training has taken its first
step, or this long after the trainer if it has not (its dataset not yet published, a resumed
run past pre-training): they idle through pre-training anyway, and importing torch in five
processes at once on 2 cores held the trainer's start-up back."""


def run_loop(
    cfg: Config, out_root: Path, on_tick=None, timeout_s: float = 3600, prepare_only: bool = False
) -> dict:
    """Seed, supervise until the trainer is done, collect figures, write the report.
    `prepare_only`: write the run's config and publish its data, and start no process (for
    processes that run elsewhere, e.g. the cluster manifests in deploy/)."""
    started = time.monotonic()
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
    phases = {"prepare_s": time.monotonic() - started}  # start-up, phase by phase
    with stack_or_endpoints(out / "stack", cfg.loop.durable_stack) as (endpoints, embedded):
        phases["stack_s"] = time.monotonic() - started - sum(phases.values())
        seeded = asyncio.run(seed_topics(endpoints, cfg, out))
        phases["publish_s"] = time.monotonic() - started - sum(phases.values())
        if prepare_only:
            return {"run_id": cfg.run_id, "config": str(cfg_path), "prepared": True} | seeded
        watcher = RunWatcher(endpoints, cfg.run_id).start()
        sup = Supervisor(
            cfg_path, child_env(endpoints, cfg, out), out / "logs", cfg.loop.worker_range[0]
        )
        # the trainer alone first: the others wait for pre-training's first step (or for
        # OTHERS_AFTER_S), so their imports do not compete with the trainer's start-up
        sup.start(("trainer",))
        scraped = None  # the stack's Prometheus scrapes the run while it runs
        if endpoints.prometheus_targets:
            scraped = Path(endpoints.prometheus_targets) / f"{cfg.run_id}.json"

        def write_targets() -> None:  # where each process serves its metrics (as they start)
            (out / "metrics.json").write_text(json.dumps(sup.metrics_endpoints(), indent=2))
            targets = metrics.file_sd_targets(sup.metrics_endpoints(), cfg.run_id)
            (out / "prometheus-targets.json").write_text(json.dumps(targets, indent=2))
            if scraped is not None:
                scraped.write_text(json.dumps(targets, indent=2))

        write_targets()
        scaling = None
        if cfg.loop.autoscaled:
            from rlstream.ops.launcher.autoscale import WorkerScaling

            scaling = WorkerScaling(cfg, endpoints, sup)
        disks = {"broker": out / "stack" / "kafka", "s3": out / "stack" / "s3"} if embedded else {}
        live = LiveFile(out / LIVE_FILE, cfg, servers=server_pids(endpoints),
                        disks={n: d for n, d in disks.items() if d.is_dir()})  # fmt: skip
        tracked = {"at": time.monotonic(), "startup_s": None}
        spawned = time.monotonic()

        def tick(news: list[str]) -> None:
            if tracked["startup_s"] is None and watcher.view.phase != "starting":
                tracked["startup_s"] = round(time.monotonic() - started, 1)
                phases["processes_s"] = tracked["startup_s"] - sum(phases.values())
            if not sup.started_all() and (
                tracked["startup_s"] is not None or time.monotonic() - spawned > OTHERS_AFTER_S
            ):
                sup.start()
            if scaling is not None and (said := scaling.tick(watcher.view.rl_step)):
                news.append(said)
            if sup.ports_moved:  # a process started (or restarted) on a port of its own
                sup.ports_moved = False
                write_targets()
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
            if scaling is not None:
                scaling.stop()
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
                **({"stopped": sup.stopped} if sup.stopped else {}),
                "embedded_stack": embedded,
                "restarts": {c.name: c.restarts for c in sup.children if c.restarts},
                "wall_s": round(time.monotonic() - started, 1),
                "startup_s": tracked["startup_s"],  # launch -> pre-training's first step
                # the config and tokenizer, the stack, the data published, then the processes
                # (their imports, the trainer's read of the dataset, the first step)
                "startup_phases_s": {k: round(v, 1) for k, v in phases.items()},
            }
            | scheduler_figures(watcher.view.evals)
        )
        summary |= resource_figures(live.trace, summary.get("checkpoint_sizes", []))
        summary |= selection_compute(summary) | time_to_mark(watcher.view.evals)
        if scaling is not None:  # when the rollout workers were added and retired, and why
            summary |= scaling.figures()
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
    from rlstream.streams.ppm_export import PPM_EXPORT

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
    from rlstream.streams.ppm_export import export_ppm

    try:
        export_ppm(endpoints, run_id, directory)
    except Exception as exc:  # noqa: BLE001  (the run's result stands without it)
        print(f"warning: the PPM was not saved for --ppm-from ({exc})", file=sys.stderr)
