"""`rlstream bench loop | stop | broker | envs | sandbox`: benchmarks of the running system."""

from __future__ import annotations

import asyncio
import contextlib
import statistics
from pathlib import Path

import typer
from rich.table import Table

from rlstream.cli.app import (
    SummaryOpt,
    bench_app,
    console,
    endpoints,
    err,
    write_summary,
)
from rlstream.cli.run import IDLE_SHARE_TARGET, watched_run
from rlstream.cli.train import (
    ConfigOpt,
    SetOpt,
    build_config,
    streaming_only,
)


@bench_app.command("loop")
def bench_loop(
    config: Path | None = ConfigOpt,
    rl_steps: int | None = typer.Option(None, min=1, help="rl.steps: RL updates."),
    workers: int | None = typer.Option(None, min=1, max=8, help="loop.rollout_workers."),
    repeats: int = typer.Option(3, min=1, help="Streamed runs (median and min-max over them)."),
    compare_local: bool = typer.Option(
        True, help="Also run the in-process loop with the same settings and seed."
    ),
    out: Path = typer.Option(Path("runs"), help="Where the runs' reports go."),
    overrides: list[str] = SetOpt,
    summary: Path | None = SummaryOpt,
) -> None:
    """Default streaming runs, measured: trainer idle share, request-to-experience latency,
    policy-lag histogram, messages/s per topic, and accuracy against the in-process loop."""
    from collections import Counter
    from dataclasses import replace
    from datetime import UTC, datetime

    rid = datetime.now(UTC).strftime("bench-%Y%m%d-%H%M%S")
    cfg = build_config(
        config, overrides, run_id=rid, rl__steps=rl_steps, loop__rollout_workers=workers
    )
    if compare_local:
        streaming_only(cfg, "`bench loop`'s in-process twin")
    workers = cfg.loop.rollout_workers
    runs = []
    for i in range(repeats):
        err.print(f"streamed run {i + 1}/{repeats} ...")
        runs.append(watched_run(replace(cfg, run_id=f"{rid}-{i}"), out))
    local = _local_twin(cfg) if compare_local else None

    def fig(key: str) -> tuple[float | None, str]:
        vals = sorted(r[key] for r in runs if r.get(key) is not None)
        if not vals:
            return None, "-"
        return statistics.median(vals), f"{vals[0]:g} - {vals[-1]:g}"

    figures: dict = {"repeats": repeats, "runs": runs}
    title = f"streaming loop, {workers} rollout workers, {repeats} runs (median, min - max)"
    table = Table("figure", "median", "min - max", "target", title=title)
    keys = {
        "trainer_idle_share": "trainer idle share",
        "request_to_experience_p50_ms": "request -> experience p50 (ms)",
        "request_to_experience_p99_ms": "request -> experience p99 (ms)",
        "final_accuracy": "held-out greedy accuracy, streamed",
        "stale_dropped": "stale groups dropped",
        "scheduler_select_ms_per_round": "choosing a step's prompts (ms)",
        "scheduler_candidates_per_round": "prompts scored to choose them",
        "wall_s": "wall s",
    }
    for key, label in keys.items():
        median, spread = fig(key)
        figures[key] = median
        target = ""
        if key == "trainer_idle_share" and median is not None:
            met = median < IDLE_SHARE_TARGET
            target = f"< {IDLE_SHARE_TARGET} " + ("[green]met[/]" if met else "[red]missed[/]")
        table.add_row(label, "-" if median is None else f"{median:g}", spread, target)
    if local is not None:
        figures["local_accuracy"] = local
        gap = figures["final_accuracy"] - local
        figures["streamed_minus_local"] = round(gap, 4)
        verdict = "[green]met[/]" if gap >= -0.03 else "[red]missed[/]"
        table.add_row("held-out greedy accuracy, in-process", f"{local:g}", "", "")
        table.add_row("streamed - in-process", f"{gap:+.3f}", "", f">= -0.03 {verdict}")
    lags = sum((Counter(r.get("policy_lag_histogram") or {}) for r in runs), Counter())
    figures["policy_lag_histogram"] = dict(sorted(lags.items()))
    table.add_row("policy lag (versions: groups, all runs)", str(figures["policy_lag_histogram"]))
    rates: dict[str, list[float]] = {}
    for r in runs:
        for topic, rate in r.get("messages_per_s", {}).items():
            rates.setdefault(topic, []).append(rate)
    figures["messages_per_s"] = {t: statistics.median(v) for t, v in sorted(rates.items())}
    for topic, v in sorted(rates.items()):
        spread = f"{min(v):g} - {max(v):g}"
        table.add_row(f"messages/s {topic}", f"{statistics.median(v):g}", spread)
    console.print(table)
    write_summary(summary, figures)


def _local_twin(cfg) -> float:
    """Held-out greedy accuracy of the in-process loop with the streamed run's settings (the
    same Config: sampler, algorithm, budgets and seed)."""
    from rlstream.trainers.local import LocalOptions, train_local

    err.print("in-process loop with the same settings and seed ...")
    return train_local(cfg, LocalOptions(progress=False))["final_accuracy"]


@bench_app.command("stop")
def bench_stop(
    config: Path | None = ConfigOpt,
    repeats: int = typer.Option(3, min=1, help="Runs per arm (one Ctrl-C; two Ctrl-C)."),
    at_step: int = typer.Option(2, min=1, help="The RL step at which Ctrl-C is sent."),
    second_after_s: float = typer.Option(1.0, min=0, help="Two Ctrl-C arm: the gap (s)."),
    out: Path = typer.Option(Path("runs"), help="Where the runs go."),
    overrides: list[str] = SetOpt,
    summary: Path | None = SummaryOpt,
) -> None:
    """Ctrl-C to `rlstream run` on its own embedded stack: seconds until it exited, every
    process of the run and every server of the stack gone (target 10 s), exit code 130; and
    a second Ctrl-C a moment later (kills what is left at once)."""
    from datetime import UTC, datetime

    from rlstream.ops.bench import stop as stopbench

    rid = datetime.now(UTC).strftime("stop-%Y%m%d-%H%M%S")
    cfg = build_config(config, overrides, run_id=rid)
    args = stopbench.StopArgs(repeats=repeats, at_step=at_step, second_after_s=second_after_s)
    figures = stopbench.run_stop_bench(cfg, out, args, say=lambda m: err.print(m))
    console.print(stopbench.table(figures))
    write_summary(summary, figures)


@bench_app.command("broker")
def bench_broker(
    messages: int = typer.Option(2000, min=10, help="Messages per repeat and arm."),
    repeats: int = typer.Option(5, min=1, help="Repeats (arms alternate order)."),
    rows: int = typer.Option(64, min=1, help="Rows per rollout event."),
    brokers: str = typer.Option(
        None, help="Compare brokers, each on a temporary embedded stack: e.g. tansu,kafka."
    ),
    summary: Path | None = SummaryOpt,
) -> None:
    """Produce+consume throughput of rollout events, codec vs raw bytes, and the codec alone;
    with --brokers, the same on each broker in one run, with its resident memory."""
    from rlstream.ops.bench.broker import broker_bench, codec_bench

    if brokers:
        compare_brokers([b.strip() for b in brokers.split(",")], messages, repeats, rows, summary)
        return
    with _stack_for_bench() as eps:
        err.print(f"broker bench: {repeats} repeats x {messages} messages x {rows} rows ...")
        result = asyncio.run(broker_bench(eps, messages=messages, repeats=repeats, rows=rows))
    codec = codec_bench(repeats=repeats, rows=rows)
    arms, size = result["arms"], result["message_bytes"]
    raw = arms["raw bytes"].median
    table = Table("path", "rows/s (median)", "min-max", "MB/s", "ratio vs raw",
                  title=f"broker throughput, {rows}-row rollout events of {size:,} B")  # fmt: skip
    figures: dict = {"message_bytes": size, "rows": rows, "messages": messages, "repeats": repeats}
    for name, fig in arms.items():
        mb_s = fig.median / rows * size / 1e6
        table.add_row(name, f"{fig.median:,.0f}", fig.spread(), f"{mb_s:,.1f}",
                      f"{fig.median / raw:.2f}")  # fmt: skip
        key = name.replace("+", "_").replace(" ", "_")
        figures[f"{key}_rows_per_s"] = round(fig.median, 1)
        figures[f"{key}_mb_per_s"] = round(mb_s, 2)
    ratio = arms["codec+broker"].median / raw
    figures["codec_vs_raw_ratio"] = round(ratio, 3)
    console.print(table)
    table = Table("codec alone (1 core)", "rows/s (median)", "min-max", "target",
                  title="Arrow IPC codec, validation included")  # fmt: skip
    for name, fig in codec.items():
        ok = "[green]met[/]" if fig.median >= 200_000 else "[red]missed[/]"
        table.add_row(name, f"{fig.median:,.0f}", fig.spread(), f">= 200,000 {ok}")
        figures[f"codec_{name}_rows_per_s"] = round(fig.median, 1)
    console.print(table)
    verdict = "[green]met[/]" if ratio >= 0.8 else "[red]missed[/]"
    console.print(f"codec+broker / raw bytes = {ratio:.2f} (target >= 0.80: {verdict})")
    write_summary(summary, figures)


def compare_brokers(names: list[str], messages: int, repeats: int, rows: int, summary) -> None:
    """`bench broker --brokers a,b`: each broker on a temporary embedded stack of its own, one
    after the other, measured alike; the table compares them against the first."""
    import tempfile

    import psutil

    from rlstream.ops.bench.broker import broker_bench
    from rlstream.ops.stack.embedded import EmbeddedStack, broker_choice

    results = {}
    for name in names:
        broker_choice(name)  # a bad name is one line before anything starts
        with tempfile.TemporaryDirectory(prefix=f"rlstream-bench-{name}-") as tmp:
            err.print(f"{name}: starting a temporary stack; {repeats} x {messages} messages ...")
            with EmbeddedStack(Path(tmp), broker=name) as stack:
                result = asyncio.run(broker_bench(stack.endpoints, messages=messages,
                                                  repeats=repeats, rows=rows))  # fmt: skip
                pids = [s.pid for s in stack.servers if s.name != "seaweedfs"]
                rss = sum(psutil.Process(pid).memory_info().rss for pid in pids) / 2**20
            results[name] = (result, rss)
    first = results[names[0]][0]["arms"]["raw bytes"].median
    table = Table("broker", "codec+broker rows/s", "raw bytes rows/s", "min-max (raw)",
                  f"raw vs {names[0]}", "broker RSS MiB",
                  title=f"brokers compared, {rows}-row rollout events")  # fmt: skip
    figures: dict = {"rows": rows, "messages": messages, "repeats": repeats}
    for name, (result, rss) in results.items():
        codec, raw = result["arms"]["codec+broker"], result["arms"]["raw bytes"]
        table.add_row(name, f"{codec.median:,.0f}", f"{raw.median:,.0f}", raw.spread(),
                      f"{raw.median / first:.2f}", f"{rss:,.0f}")  # fmt: skip
        figures[name] = {"codec_broker_rows_per_s": round(codec.median, 1),
                         "raw_rows_per_s": round(raw.median, 1),
                         "codec_vs_raw_ratio": round(codec.median / raw.median, 3),
                         "broker_rss_mb": round(rss, 1)}  # fmt: skip
    console.print(table)
    write_summary(summary, figures)


@contextlib.contextmanager
def _stack_for_bench():
    """The running stack's endpoints, or a temporary embedded stack for this command."""
    import os
    import tempfile

    from rlstream.connectors.endpoints import ENDPOINTS_FILE, state_dir

    configured = "RLSTREAM_KAFKA_BOOTSTRAP" in os.environ
    if configured or (state_dir() / ENDPOINTS_FILE).exists():
        yield endpoints()
        return
    from rlstream.ops.stack.embedded import EmbeddedStack

    with tempfile.TemporaryDirectory(prefix="rlstream-bench-") as tmp:
        err.print("no stack running: starting a temporary one")
        with EmbeddedStack(Path(tmp)) as stack:
            yield stack.endpoints


@bench_app.command("envs")
def bench_envs(
    latencies_ms: str = typer.Option("0,50", help="Added environment latency per step, ms."),
    concurrency: str = typer.Option("1,16", help="Episodes played at once by one engine."),
    episodes: int = typer.Option(64, min=1, help="Episodes per repeat and arm."),
    repeats: int = typer.Option(3, min=1),
    turns: int = typer.Option(3, min=1, help="Policy turns per episode."),
    summary: Path | None = SummaryOpt,
) -> None:
    """Episodes per second and the share of wall time spent waiting on environments, with
    added environment latency, one episode at a time against several at once (the engine the
    rollout workers run; median and min-max over the repeats)."""
    from rlstream.ops.bench.envs import envs_bench

    lat = [float(x) for x in latencies_ms.split(",")]
    conc = [int(x) for x in concurrency.split(",")]
    err.print(f"envs bench: {len(lat) * len(conc)} arms x {repeats} repeats x {episodes} "
              f"episodes of {turns} turns ...")  # fmt: skip
    arms = envs_bench(lat, conc, episodes, repeats, turns)
    base = {a.latency_ms: a.episodes_per_s.median for a in arms if a.concurrent == conc[0]}
    table = Table("env latency ms", "concurrent episodes", "episodes/s (median)", "min-max",
                  f"vs {conc[0]} at once", "waiting on the environment",
                  title="the episode engine (default preset, CPU)")  # fmt: skip
    figures: dict = {"episodes": episodes, "repeats": repeats, "turns": turns, "arms": []}
    for a in arms:
        eps = a.episodes_per_s
        table.add_row(f"{a.latency_ms:g}", str(a.concurrent), f"{eps.median:.1f}",
                      f"{min(eps.values):.1f}-{max(eps.values):.1f}",
                      f"{eps.median / base[a.latency_ms]:.2f}x",
                      f"{a.wait_share.median:.0%}")  # fmt: skip
        figures["arms"].append({"latency_ms": a.latency_ms, "concurrent": a.concurrent,
                                "episodes_per_s": round(eps.median, 2),
                                "episodes_per_s_values": [round(v, 2) for v in eps.values],
                                "wait_share": round(a.wait_share.median, 4)})  # fmt: skip
    console.print(table)
    write_summary(summary, figures)


@bench_app.command("sandbox")
def bench_sandbox(
    isolation: str = typer.Option(
        "in-process,subprocess,rlimits,namespaces",
        help="Arms: in-process, subprocess, rlimits, namespaces.",
    ),
    concurrency: str = typer.Option("1,4", help="Executions at once."),
    executions: int = typer.Option(200, min=1, help="Verifications per repeat and arm."),
    repeats: int = typer.Option(3, min=1),
    summary: Path | None = SummaryOpt,
) -> None:
    """Code verification's executions per second and p50 / p99 latency, sandboxed against
    unsandboxed, one at a time against several at once (the `fn` family's completions and
    tests; median and min-max over the repeats, latencies over every execution)."""
    from rlstream.ops.bench.sandbox import sandbox_bench
    from rlstream.sandbox.pool import isolation_of

    arms_of = [x.strip() for x in isolation.split(",") if x.strip()]
    unknown = set(arms_of) - {"in-process", "subprocess", "rlimits", "namespaces"}
    if unknown:
        raise typer.BadParameter(f"{sorted(unknown)[0]!r}: use in-process, subprocess, "
                                 "rlimits or namespaces", param_hint="--isolation")  # fmt: skip
    from rlstream.config import SandboxConfig

    if "namespaces" in arms_of and isolation_of(SandboxConfig()) != "namespaces":
        err.print("namespaces isolation needs root and unshare: that arm is left out")
        arms_of.remove("namespaces")
    conc = [int(x) for x in concurrency.split(",")]
    err.print(f"sandbox bench: {len(arms_of) * len(conc)} arms x {repeats} repeats x "
              f"{executions} verifications ...")  # fmt: skip
    arms = sandbox_bench(arms_of, conc, executions, repeats)
    base = {a.concurrent: a.per_s.median for a in arms if a.isolation == arms_of[0]}
    table = Table("isolation", "at once", "verifications/s (median)", "min-max",
                  f"vs {arms_of[0]}", "p50 ms", "p99 ms",
                  title="code verification (fn family: 5 tests each, CPU)")  # fmt: skip
    figures: dict = {"executions": executions, "repeats": repeats, "arms": []}
    for a in arms:
        rate = a.per_s
        table.add_row(a.isolation, str(a.concurrent), f"{rate.median:.0f}",
                      f"{min(rate.values):.0f}-{max(rate.values):.0f}",
                      f"{rate.median / base[a.concurrent]:.3f}x",
                      f"{a.percentile(0.5):.2f}", f"{a.percentile(0.99):.2f}")  # fmt: skip
        figures["arms"].append({"isolation": a.isolation, "concurrent": a.concurrent,
                                "per_s": round(rate.median, 1),
                                "per_s_values": [round(v, 1) for v in rate.values],
                                "p50_ms": round(a.percentile(0.5), 3),
                                "p99_ms": round(a.percentile(0.99), 3)})  # fmt: skip
    console.print(table)
    write_summary(summary, figures)
