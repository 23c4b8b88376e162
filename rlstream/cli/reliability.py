"""`rlstream chaos` and `rlstream fuzz`: the loop under faults and malformed messages."""

from __future__ import annotations

import asyncio
from pathlib import Path

import typer

from rlstream.cli.app import (
    SummaryOpt,
    app,
    console,
    print_figures,
    write_summary,
)
from rlstream.cli.train import (
    ConfigOpt,
    SetOpt,
    build_config,
)


@app.command()
def chaos(
    config: Path | None = ConfigOpt,
    faults: int = typer.Option(12, min=1, help="Faults per run."),
    seed: int = typer.Option(0, help="Seed of the fault schedule (and of the run)."),
    repeats: int = typer.Option(1, min=1, help="Runs, with seeds seed, seed+1, ..."),
    kinds: str | None = typer.Option(
        None,
        help="Comma-separated fault kinds [default: all that apply: kill:env where the run's "
        "tasks play an environment; see the table below].",
    ),
    rl_steps: int | None = typer.Option(None, min=1, help="rl.steps: RL updates per run."),
    workers: int | None = typer.Option(None, min=1, max=8, help="loop.rollout_workers."),
    s3_down_s: float = typer.Option(30.0, min=0, help="How long the S3 server is down."),
    qdrant_down_s: float = typer.Option(30.0, min=0, help="How long Qdrant is unavailable."),
    env_down_s: float = typer.Option(
        5.0, min=0, help="How long the environment server is down (kill:env)."
    ),
    broker: str = typer.Option(
        None, help="The run's stack: tansu or kafka [default: $RLSTREAM_STACK_BROKER, tansu]."
    ),
    nodes: int = typer.Option(
        None, help="Kafka nodes: 1, or 3 (kill:leader needs 3) [default: $RLSTREAM_STACK_NODES, 1]."
    ),
    fault_rate_per_h: float = typer.Option(
        1.0, min=1e-6, help="Process faults an hour assumed in production (the MTBF bound)."
    ),
    until: str = typer.Option(
        "steps",
        help="How a run ends: 'steps' (all rl.steps, faults spread over them) or "
        "'faults' (Ctrl-C a few steps after the last fault; rl.steps an upper bound).",
    ),
    out: Path = typer.Option(Path("runs"), help="Where the runs and their audits go."),
    run_id: str = typer.Option("", help="Run id (-N per repeat) [default: from the time]."),
    overrides: list[str] = SetOpt,
    summary: Path | None = SummaryOpt,
) -> None:
    """The real loop under scheduled faults (SIGKILL and SIGSTOP of every process kind, the S3
    server down, Qdrant unavailable, the environment server killed, the leader of a
    partition killed on a three-node Kafka), then an audit by event id: nothing lost, nothing
    trained twice, the archive equal to what was published. Prints each fault's recovery
    time."""
    from dataclasses import replace
    from datetime import UTC, datetime

    from rlstream.ops.reliability import chaos as chaos_mod
    from rlstream.ops.reliability import chaos_figures

    if until not in chaos_mod.UNTIL:
        raise typer.BadParameter(f"{until!r}: choose steps or faults", param_hint="--until")
    rid = run_id or datetime.now(UTC).strftime("chaos-%Y%m%d-%H%M%S")
    cfg = build_config(
        config, overrides, run_id=rid, rl__steps=rl_steps, loop__rollout_workers=workers
    )
    from rlstream.ops.stack.embedded import StackError, broker_choice

    try:
        broker_choice(broker, nodes)
    except StackError as exc:
        raise typer.BadParameter(str(exc), param_hint="--broker / --nodes") from None
    chosen = (
        tuple(k.strip() for k in kinds.split(","))
        if kinds
        else chaos_mod.default_kinds(cfg, broker, nodes)
    )
    unknown = [k for k in chosen if k not in chaos_mod.FAULT_KINDS]
    if unknown:
        raise typer.BadParameter(
            f"unknown fault kind {unknown[0]!r}; choose from {', '.join(chaos_mod.FAULT_KINDS)}",
            param_hint="--kinds",
        )
    try:
        if "kill:env" in chosen:
            chaos_mod.environment_of(cfg)
        if "kill:leader" in chosen:
            chaos_mod.check_cluster(broker, nodes)
    except chaos_mod.ChaosError as exc:
        raise typer.BadParameter(str(exc), param_hint="--kinds") from None
    for name in ("prompts", "corpus"):
        source = getattr(cfg.data, name) or ""
        if source.startswith("topic:"):
            raise typer.BadParameter(f"data.{name}: `rlstream chaos` starts its own stack, where "
                                     f"{source} holds nothing; give a file")  # fmt: skip
    results = []
    for i in range(repeats):
        args = chaos_mod.ChaosArgs(faults=faults, seed=seed + i, kinds=chosen,
                                   s3_down_s=s3_down_s, qdrant_down_s=qdrant_down_s,
                                   env_down_s=env_down_s, until=until, broker=broker,
                                   nodes=nodes)  # fmt: skip
        this = replace(cfg, run_id=rid if repeats == 1 else f"{rid}-{i}", seed=cfg.seed + i)
        result = chaos_mod.run_chaos(this, out, args, say=lambda m: print(m, flush=True))
        console.print(chaos_figures.table(result))
        results.append(result)
    figures = chaos_figures.combine(results) | chaos_figures.mtbf(results, fault_rate_per_h)
    if repeats > 1:
        print_figures(f"chaos, {repeats} runs", {k: v for k, v in figures.items() if k != "runs"})
    write_summary(summary, figures)
    if not figures["survived"]:
        raise typer.Exit(1)


@app.command()
def fuzz(
    config: Path | None = ConfigOpt,
    messages: int = typer.Option(10_000, min=1, help="Malformed messages to send."),
    rate: float = typer.Option(200.0, min=1.0, help="Messages a second."),
    seed: int = typer.Option(0, help="Seed of the messages (and of the runs)."),
    rl_steps: int | None = typer.Option(None, min=1, help="rl.steps of the runs."),
    baseline: bool = typer.Option(True, help="First the same run without fuzz (its accuracy)."),
    attach: str | None = typer.Option(
        None, help="Fuzz this run in progress (its config from --out) instead of running one."
    ),
    out: Path = typer.Option(Path("runs"), help="Where the runs are."),
    run_id: str = typer.Option("", help="Run id [default: from the time]."),
    overrides: list[str] = SetOpt,
    summary: Path | None = SummaryOpt,
) -> None:
    """Malformed messages on every topic the loop consumes, while a run is live: random bytes,
    truncated Arrow, bad headers, unknown events and versions, schema mismatches, nulls, NaN
    rewards, empty and over-long completions, token ids outside the vocabulary, bad group sizes,
    another run's rows. Every owner must dead-letter each one it owns, nothing may crash, the
    accuracy is compared with an unfuzzed run of the same seed. Prints a table per class."""
    from datetime import UTC, datetime

    from rlstream.config import Config
    from rlstream.ops.reliability import fuzz as fuzz_mod

    args = fuzz_mod.FuzzArgs(messages=messages, rate_per_s=rate, seed=seed, baseline=baseline)
    if attach:
        path = out / attach / "config.json"
        if not path.exists():
            raise typer.BadParameter(f"no run {attach!r} under {out} (no {path})",
                                     param_hint="--attach")  # fmt: skip
        result = fuzz_mod.fuzz_live(Config.read(path), out, args,
                                    say=lambda m: print(m, flush=True))  # fmt: skip
    else:
        rid = run_id or datetime.now(UTC).strftime("fuzz-%Y%m%d-%H%M%S")
        cfg = build_config(config, overrides, run_id=rid, rl__steps=rl_steps)
        result = fuzz_mod.run_fuzz(cfg, out, args, say=lambda m: print(m, flush=True))
    console.print(fuzz_mod.table(result))
    write_summary(summary, result)
    if not result["survived"]:
        raise typer.Exit(1)


@app.command()
def audit(
    run: str = typer.Argument(..., help="The run's id."),
    out: Path = typer.Option(Path("runs"), help="Where the run is."),
    drain: bool = typer.Option(
        True, help="First serve the requests still in flight when the run ended."
    ),
    drain_timeout_s: float = typer.Option(180.0, min=1.0, help="How long the drain may take."),
    summary: Path | None = SummaryOpt,
) -> None:
    """Account for every rollout request of a finished run by event id, on the stack that holds
    it (its own embedded stack, started again from its directory, or RLSTREAM_* endpoints):
    trained once, or dropped as stale, filtered or a failed episode, or still unconsumed; no
    experience lost or trained twice; the archive equal to what was published. Experience the
    broker has since dropped (retention) is read from the archive. Exit 1 when the audit fails."""
    from rlstream.config import Config
    from rlstream.ops.launcher.datapath import run_stack
    from rlstream.ops.reliability.audit import audit_run
    from rlstream.ops.reliability.audit import drain as drain_run

    run_dir = (out / run).resolve()
    path = run_dir / "config.json"
    if not path.exists():
        raise typer.BadParameter(f"no run {run!r} under {out} (no {path})", param_hint="RUN")
    cfg = Config.read(path)
    with run_stack(out, run) as endpoints:
        drained = drain_run(endpoints, cfg, run_dir, {}, drain_timeout_s) if drain else None
        figures = asyncio.run(audit_run(endpoints, cfg)) | {"drain_s": drained}
    ok = (
        figures["experience_lost"] == 0
        and figures["trained_twice"] == 0
        and figures["archive_matches_published"]
    )
    figures["audit_passed"] = ok
    print_figures(f"audit of run {run}", {k: v for k, v in figures.items() if k != "lost_requests"})
    write_summary(summary, figures)
    if not ok:
        raise typer.Exit(1)
