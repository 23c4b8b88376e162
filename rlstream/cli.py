"""The `rlstream` command: stack, publish, tail, replay, topics, bench, train.

Commands are thin: they parse arguments, call a function from the package, and render tables
and progress with rich. Errors a user can fix are caught in `main` and printed as one line.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import statistics
import sys
from pathlib import Path

import typer
from rich.console import Console
from rich.table import Table

from rlstream.trainers import commands as trainer_commands
from rlstream.trainers.selection import commands as selection_commands

app = typer.Typer(
    name="rlstream",
    help="Event-streaming RL post-training with predictive prompt selection.",
    no_args_is_help=True,
    rich_markup_mode="rich",
    pretty_exceptions_enable=False,
    add_completion=False,
)
stack_app = typer.Typer(help="The embedded stack: Tansu broker, SeaweedFS S3, local Qdrant.")
bench_app = typer.Typer(help="Benchmarks that print tables (median and spread over repeats).")
config_app = typer.Typer(help="The run settings: every default, nested by concern.")
app.add_typer(stack_app, name="stack")
app.add_typer(bench_app, name="bench")
app.add_typer(config_app, name="config")
datasets_app = typer.Typer(help="Prompt files from other sources, ready for `rlstream publish`.")
app.add_typer(datasets_app, name="datasets")

console = Console(width=None if sys.stdout.isatty() else 160)  # piped: whole table rows
err = Console(stderr=True, soft_wrap=True)  # whole lines: logs and greps stay readable

SummaryOpt = typer.Option(None, "--summary", help="Write the headline figures here as JSON.")
StateDirOpt = typer.Option(
    None, "--state-dir", help="Stack state directory [default: $RLSTREAM_HOME or ./.rlstream]."
)


def print_figures(title: str, figures: dict) -> None:
    """A run's or a command's headline figures as a two-column table."""
    table = Table("figure", "value", title=title)
    for key, value in figures.items():
        shown = f"{value:,}" if isinstance(value, int) and not isinstance(value, bool) else value
        if isinstance(value, list) and len(value) > 12:  # a series: the summary file has it
            shown = f"{len(value)} entries (in --summary)"
        table.add_row(key, str(shown))
    console.print(table)


def write_summary(path: Path | None, figures: dict) -> None:
    if path is not None:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(figures, indent=2, default=str) + "\n")


def _state_dir(path: Path | None) -> Path:
    from rlstream.connectors.endpoints import state_dir

    return (path or state_dir()).resolve()


def event_for(topic: str):
    """A topic argument: the short name (`rollouts`), the full name (`rl.rollouts.v1`), or any
    topic on the broker whose messages carry a registered event (`rl.rewards.v1.rescored`)."""
    from rlstream.ops.topics import carried_event
    from rlstream.schemas import latest_events

    event = asyncio.run(carried_event(endpoints(), topic))
    if event is None:
        names = ", ".join(e.name for e in latest_events())
        raise typer.BadParameter(
            f"unknown topic {topic!r}: not an event name ({names}), and no topic of that name "
            "holds messages with rlstream event headers (see `rlstream topics`)"
        ) from None
    return event


def endpoints():
    from rlstream.connectors.endpoints import Endpoints

    return Endpoints.from_env()


def _version(value: bool) -> None:
    if value:
        from rlstream import __version__

        print(f"rlstream {__version__}")
        raise typer.Exit()


@app.callback()
def _root(
    version: bool = typer.Option(
        False, "--version", callback=_version, is_eager=True, help="Print the version and exit."
    ),  # fmt: skip
) -> None:
    """Event-streaming RL post-training with predictive prompt selection."""


# --- run -------------------------------------------------------------------------------------


@app.command()
def run(
    config: Path | None = trainer_commands.ConfigOpt,
    rl_steps: int | None = typer.Option(None, min=1, help="rl.steps: RL updates."),
    tasks: str | None = typer.Option(None, help="data.tasks, e.g. add,sub or add:2,mul@1-2."),
    fmt: str | None = trainer_commands.FormatOpt,
    sampler: str | None = typer.Option(
        None, help="selection.sampler: ppm (predictive, no answer read), uniform, greso, mopps."
    ),
    ppm_from: str | None = typer.Option(
        None, help="selection.ppm_from: start the PPM from an earlier ppm run (RUN_ID under --out)."
    ),
    algo: str | None = typer.Option(None, help="rl.algo: grpo or ppo (value head + GAE)."),
    hybrid: bool | None = typer.Option(
        None, "--hybrid/--no-hybrid", help="rl.hybrid: mix pre-training loss into RL updates."
    ),
    reward_rules: Path | None = typer.Option(
        None, help="rl.reward_rules: JSON reward rules that score_rollouts applies."
    ),
    reward_fn: str | None = typer.Option(
        None, help="rl.reward_fn: module:function or file.py:function, TRL's reward shape."
    ),
    prompts: str | None = typer.Option(
        None, help="data.prompts: a JSONL/CSV/Parquet file, or topic:DATASET [default: generated]."
    ),
    corpus: str | None = typer.Option(
        None, help="data.corpus: pre-training documents, a file or topic:DATASET."
    ),
    dataset: str | None = typer.Option(
        None, help="data.dataset: the dataset name [default: the file's stem]."
    ),
    mlflow: str | None = typer.Option(
        None, help="tracking.mlflow_uri: log to this MLflow server [default: $MLFLOW_TRACKING_URI]."
    ),
    model: str | None = trainer_commands.ModelOpt,
    lora: str | None = trainer_commands.LoraOpt,
    workers: int | None = typer.Option(None, min=1, max=8, help="loop.rollout_workers."),
    seed: int | None = typer.Option(None, help="Seed of splits, corpus, init and sampling."),
    out: Path = typer.Option(Path("runs"), help="Where the run's report, plots and logs go."),
    run_id: str = typer.Option("", help="Run id [default: from the time]."),
    resume: str | None = typer.Option(None, help="Continue RUN_ID from its last checkpoint."),
    data_only: bool = typer.Option(False, help="Only publish, read back and replay prompts."),
    timeout_s: float = typer.Option(3600, help="Give up if the trainer is not done by then."),
    overrides: list[str] = trainer_commands.SetOpt,
    summary: Path | None = SummaryOpt,
) -> None:
    """The main job: the streaming RL loop on the embedded stack (started and stopped here) or
    on RLSTREAM_* endpoints. Pre-trains, runs RL with rollout workers, evaluates, and writes a
    report with plots locally and to the object store. Ctrl-C stops cleanly."""
    from datetime import UTC, datetime

    from rlstream.config import load_config
    from rlstream.ops.run import how_to_continue, resumable

    if data_only:
        return _run_data_path(out, run_id, summary)
    if resume:
        path = out / resume / "config.json"
        if not path.exists():
            raise typer.BadParameter(f"no run {resume!r} under {out} (missing {path})")
        if not resumable(load_config(path).loop.durable_stack):
            raise typer.BadParameter(
                f"run {resume!r} cannot be resumed: " + how_to_continue(resume, out, False)
            )
        config, run_id = path, resume
    cfg = trainer_commands.build_config(
        config, overrides, rl__steps=rl_steps, data__tasks=tasks, data__format=fmt,
        selection__sampler=sampler, selection__ppm_from=ppm_from,
        rl__algo=algo, rl__hybrid=hybrid, rl__reward_rules=None if reward_rules is None else
        str(reward_rules.resolve()), loop__rollout_workers=workers, seed=seed,
        data__prompts=_source(prompts), data__corpus=_source(corpus), data__dataset=dataset,
        rl__reward_fn=trainer_commands.reward_fn_spec(reward_fn), tracking__mlflow_uri=mlflow,
        model__path=trainer_commands.model_source(model), model__lora=lora,
        run_id=run_id or datetime.now(UTC).strftime("run-%Y%m%d-%H%M%S"),
    )  # fmt: skip
    try:
        figures = _watched_run(cfg, out, timeout_s)
    except KeyboardInterrupt:
        err.print("interrupted: every process of the run stopped; "
                  + how_to_continue(cfg.run_id, out, cfg.loop.durable_stack))  # fmt: skip
        raise typer.Exit(130) from None
    print_figures(f"run {cfg.run_id}", figures)
    console.print(f"report: [bold]{figures['report']}[/]")
    write_summary(summary, figures)
    if not figures.get("completed"):
        raise typer.Exit(1)


def _source(value: str | None) -> str | None:
    """A data source as the run's processes see it: files absolute, topic:NAME as given."""
    if value is None or value.startswith("topic:"):
        return value
    return str(Path(value).resolve())


@app.command()
def chaos(
    config: Path | None = trainer_commands.ConfigOpt,
    faults: int = typer.Option(12, min=1, help="Faults per run."),
    seed: int = typer.Option(0, help="Seed of the fault schedule (and of the run)."),
    repeats: int = typer.Option(1, min=1, help="Runs, with seeds seed, seed+1, ..."),
    kinds: str | None = typer.Option(
        None, help="Comma-separated fault kinds [default: all of them; see the table below]."
    ),
    rl_steps: int | None = typer.Option(None, min=1, help="rl.steps: RL updates per run."),
    workers: int | None = typer.Option(None, min=1, max=8, help="loop.rollout_workers."),
    s3_down_s: float = typer.Option(30.0, min=0, help="How long the S3 server is down."),
    qdrant_down_s: float = typer.Option(30.0, min=0, help="How long Qdrant is unavailable."),
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
    overrides: list[str] = trainer_commands.SetOpt,
    summary: Path | None = SummaryOpt,
) -> None:
    """The real loop under scheduled faults (SIGKILL and SIGSTOP of every process kind, the S3
    server down, Qdrant unavailable), then an audit by event id: nothing lost, nothing trained
    twice, the archive equal to what was published. Prints each fault's recovery time."""
    from dataclasses import replace
    from datetime import UTC, datetime

    from rlstream.ops import chaos as chaos_mod

    chosen = tuple(k.strip() for k in kinds.split(",")) if kinds else chaos_mod.FAULT_KINDS
    unknown = [k for k in chosen if k not in chaos_mod.FAULT_KINDS]
    if unknown:
        raise typer.BadParameter(
            f"unknown fault kind {unknown[0]!r}; choose from {', '.join(chaos_mod.FAULT_KINDS)}",
            param_hint="--kinds",
        )
    if until not in chaos_mod.UNTIL:
        raise typer.BadParameter(f"{until!r}: choose steps or faults", param_hint="--until")
    rid = run_id or datetime.now(UTC).strftime("chaos-%Y%m%d-%H%M%S")
    cfg = trainer_commands.build_config(
        config, overrides, run_id=rid, rl__steps=rl_steps, loop__rollout_workers=workers
    )
    for name in ("prompts", "corpus"):
        source = getattr(cfg.data, name) or ""
        if source.startswith("topic:"):
            raise typer.BadParameter(f"data.{name}: `rlstream chaos` starts its own stack, where "
                                     f"{source} holds nothing; give a file")  # fmt: skip
    results = []
    for i in range(repeats):
        args = chaos_mod.ChaosArgs(faults=faults, seed=seed + i, kinds=chosen,
                                   s3_down_s=s3_down_s, qdrant_down_s=qdrant_down_s,
                                   until=until)  # fmt: skip
        this = replace(cfg, run_id=rid if repeats == 1 else f"{rid}-{i}", seed=cfg.seed + i)
        result = chaos_mod.run_chaos(this, out, args, say=lambda m: print(m, flush=True))
        console.print(chaos_mod.table(result))
        results.append(result)
    figures = chaos_mod.combine(results) | chaos_mod.mtbf(results, fault_rate_per_h)
    if repeats > 1:
        print_figures(f"chaos, {repeats} runs", {k: v for k, v in figures.items() if k != "runs"})
    write_summary(summary, figures)
    if not figures["survived"]:
        raise typer.Exit(1)


@app.command()
def fuzz(
    config: Path | None = trainer_commands.ConfigOpt,
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
    overrides: list[str] = trainer_commands.SetOpt,
    summary: Path | None = SummaryOpt,
) -> None:
    """Malformed messages on every topic the loop consumes, while a run is live: random bytes,
    truncated Arrow, bad headers, unknown events and versions, schema mismatches, nulls, NaN
    rewards, empty and over-long completions, token ids outside the vocabulary, bad group sizes,
    another run's rows. Every owner must dead-letter each one it owns, nothing may crash, the
    accuracy is compared with an unfuzzed run of the same seed. Prints a table per class."""
    from datetime import UTC, datetime

    from rlstream.config import Config
    from rlstream.ops import fuzz as fuzz_mod

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
        cfg = trainer_commands.build_config(config, overrides, run_id=rid, rl__steps=rl_steps)
        result = fuzz_mod.run_fuzz(cfg, out, args, say=lambda m: print(m, flush=True))
    console.print(fuzz_mod.table(result))
    write_summary(summary, result)
    if not result["survived"]:
        raise typer.Exit(1)


@app.command()
def serve(
    host: str = typer.Option("127.0.0.1", help="Interface to listen on (loopback by default)."),
    port: int = typer.Option(8765, min=1, max=65535, help="TCP port."),
    out: Path = typer.Option(Path("runs"), help="Where the runs live (one directory each)."),
    no_auth: bool = typer.Option(False, help="No bearer token (allowed on loopback only)."),
) -> None:
    """Run control over HTTP: submit, list, follow (server-sent events), stop and resume runs,
    fetch their reports, publish prompts; a web view at /. Needs RLSTREAM_API_TOKEN (bearer)
    unless --no-auth.
    Runs use a running stack, or one started here for the server's lifetime."""
    import os

    import uvicorn

    from rlstream.ops.run import stack_or_endpoints
    from rlstream.ops.serve import Runs, make_app

    token = os.environ.get("RLSTREAM_API_TOKEN") or None
    loopback = host in ("127.0.0.1", "localhost", "::1")
    if token is None and not no_auth:
        raise typer.BadParameter("set RLSTREAM_API_TOKEN (clients send it as a bearer token), "
                                 "or --no-auth on loopback")  # fmt: skip
    if no_auth and not loopback:
        raise typer.BadParameter(f"--no-auth: only on loopback, not on {host!r}")
    out = out.resolve()
    with stack_or_endpoints(out / "_stack") as (stack, embedded):
        runs = Runs(out, dict(os.environ) | stack.as_env())
        where = "started for this server" if embedded else "running"
        console.print(
            f"rlstream serve on http://{host}:{port} (web view: /, API docs: /docs); "
            f"runs under {out}; stack {where} (broker {stack.kafka_bootstrap})"
        )
        uvicorn.run(make_app(runs, token if not no_auth else None, stack), host=host, port=port,
                    log_level="warning")  # fmt: skip


@datasets_app.command("export")
def datasets_export(
    source: str = typer.Argument(..., help="rg:NAME, a reasoning-gym dataset (e.g. rg:gcd)."),
    size: int = typer.Option(1000, min=1, help="Prompts to write."),
    seed: int = typer.Option(0, help="The dataset generator's seed."),
    out: Path = typer.Option(..., help="The JSONL prompt file to write."),
    fmt: str = typer.Option(
        "direct",
        "--format",
        help="direct (the completion is the answer) or cot (the verifier reads only the final "
        "<answer>...</answer> of a worked completion: verifier cot:rg:NAME).",
    ),
) -> None:
    """Write a reasoning-gym task as a prompt file with its verifier named, to publish and
    train on like any user file (`rlstream run --prompts FILE`)."""
    if not source.startswith("rg:") or source == "rg:":
        raise typer.BadParameter(f"{source!r}: give rg:NAME (a reasoning-gym dataset)")
    if fmt not in ("direct", "cot"):
        raise typer.BadParameter(f"{fmt!r}: choose direct or cot", param_hint="--format")
    from rlstream.trainers.envs.rgym import export_rows

    try:
        rows = export_rows(source.removeprefix("rg:"), size, seed)
    except (KeyError, ValueError) as exc:
        raise typer.BadParameter(f"{source}: {exc}") from None
    if fmt == "cot":
        rows = [r | {"verifier": f"cot:{r['verifier']}"} for r in rows]
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text("".join(json.dumps(row) + "\n" for row in rows))
    longest = max(len(r["text"]) for r in rows)
    print_figures(f"exported {source}", {"prompts": len(rows), "file": str(out),
                  "verifier": rows[0]["verifier"], "longest_text_chars": longest})  # fmt: skip


@app.command()
def export(
    run_id: str = typer.Argument(..., help="The run whose policy to export."),
    out: Path = typer.Option(..., help="The directory to write (a Hugging Face model)."),
    version: int | None = typer.Option(None, help="Policy version [default: the newest]."),
    runs: Path = typer.Option(Path("runs"), help="Where `rlstream run` wrote the run."),
) -> None:
    """Write a published policy version as a Hugging Face directory (config.json,
    model.safetensors, tokenizer files) that `AutoModelForCausalLM.from_pretrained` and
    `AutoTokenizer.from_pretrained` load with no rlstream code. Reads the running stack's object
    store, else the run's own embedded stack (started for the copy)."""
    from rlstream.connectors.objectstore import ObjectStore
    from rlstream.ops.run import stack_or_endpoints
    from rlstream.streams.policystore import download_policy, stored_versions

    with stack_or_endpoints(runs / run_id / "stack") as (stack, _):
        store = ObjectStore(stack)
        versions = stored_versions(store, run_id)
        if not versions:
            raise typer.BadParameter(f"run {run_id!r} has no policy versions in the object store")
        chosen = max(versions) if version is None else version
        if chosen not in versions:
            shown = ", ".join(map(str, sorted(versions)))
            raise typer.BadParameter(f"--version {version}: run {run_id!r} has {shown}")
        download_policy(store, versions[chosen], out)
    files = sorted(p.name for p in out.iterdir())
    print_figures(f"exported {run_id} version {chosen}",
                  {"directory": str(out.resolve()), "version": chosen,
                   "versions_stored": len(versions), "files": ", ".join(files)})  # fmt: skip


@config_app.command("show")
def config_show(
    config: Path | None = trainer_commands.ConfigOpt,
    overrides: list[str] = trainer_commands.SetOpt,
    describe: bool = typer.Option(False, "--describe", help="Every setting with its meaning."),
) -> None:
    """Print the effective config (defaults < --config file < --set) as YAML, the shape
    `--config` reads; --describe lists every setting with its default and meaning."""
    from rich.markup import escape

    from rlstream.config import Config, show
    from rlstream.config import describe as describe_settings

    if describe:
        table = Table("setting", "default", "meaning", title="rlstream settings")
        for name, default, doc in describe_settings(Config):
            table.add_row(escape(name), escape(default), escape(doc))
        console.print(table)
        return
    print(show(trainer_commands.build_config(config, overrides)), end="")


IDLE_SHARE_TARGET = 0.10  # bench loop: the trainer waits for experience under 10% of its time
PLAIN_PROGRESS_EVERY_S = 5.0  # off a terminal (CI, nohup, a log file): one line this often


def _watched_run(cfg, out: Path, timeout_s: float = 3600) -> dict:
    """run_loop with the live view (phase, step, reward, accuracy, lag, rates, idle share);
    off a terminal, a plain progress line every PLAIN_PROGRESS_EVERY_S instead."""
    import time

    from rich.live import Live

    from rlstream.ops.loop import run_loop

    if not console.is_terminal:
        last = {"at": float("-inf"), "phase": None, "line": None}

        def on_plain_tick(view, sup, news) -> None:
            for line in news:
                print(line, flush=True)
            last["line"] = _progress_line(cfg, view, sup)
            due = time.monotonic() - last["at"] >= PLAIN_PROGRESS_EVERY_S
            if due or view.phase != last["phase"]:
                last["at"], last["phase"] = time.monotonic(), view.phase
                print(last["line"], flush=True)

        figures = run_loop(cfg, out, on_tick=on_plain_tick, timeout_s=timeout_s)
        if last["line"]:
            print(last["line"], flush=True)  # where the run ended
        return figures

    with Live(console=console, refresh_per_second=2) as live:

        def on_tick(view, sup, news) -> None:
            for line in news:
                console.print(f"[yellow]{line}[/]")
            live.update(_run_table(cfg, view, sup))

        return run_loop(cfg, out, on_tick=on_tick, timeout_s=timeout_s)


def _pct(x) -> str:
    return "-" if x is None else f"{100 * x:.1f}%"


def _progress_line(cfg, view, sup) -> str:
    """The live view's figures on one line, for logs."""
    import time

    restarts = {c.name: c.restarts for c in sup.children if c.restarts}
    parts = [
        time.strftime("%H:%M:%S"),
        f"run {cfg.run_id}",
        f"phase {view.phase}",
        f"pretrain step {view.pretrain_step}/{cfg.pretrain.max_steps}",
        "val loss -" if view.val_loss is None else f"val loss {view.val_loss:.3f}",
        f"rl step {view.rl_step}/{cfg.rl.steps}",
        f"greedy {_pct(view.accuracy)}",
        f"pass@1 {_pct(view.pass1)}",
        "reward -" if view.reward is None else f"reward {view.reward:.3f}",
        "lag -" if view.policy_lag is None else f"lag {view.policy_lag:.2f}",
    ]
    return " | ".join(parts + ([f"restarts {restarts}"] if restarts else []))


def _run_table(cfg, view, sup) -> Table:
    table = Table(title=f"rlstream run {cfg.run_id}", show_header=False)
    table.add_row("phase", view.phase)
    val = "" if view.val_loss is None else f", val loss {view.val_loss:.3f}"
    table.add_row("pre-training step", f"{view.pretrain_step} / {cfg.pretrain.max_steps}{val}")
    table.add_row("RL step", f"{view.rl_step} / {cfg.rl.steps}")
    table.add_row("held-out greedy / pass@1", f"{_pct(view.accuracy)} / {_pct(view.pass1)}")
    table.add_row("batch reward", "-" if view.reward is None else f"{view.reward:.3f}")
    table.add_row(
        "policy lag (groups, recent)", "-" if view.policy_lag is None else f"{view.policy_lag:.2f}"
    )
    rates = ", ".join(f"{t.split('.')[1]} {r:.1f}" for t, r in sorted(view.rates.items()) if r)
    table.add_row("messages/s", rates or "-")
    table.add_row(
        "processes",
        ", ".join(
            f"{c.name}{'*' * c.restarts}"
            + ("" if c.proc and c.proc.poll() is None else " (exited)")
            for c in sup.children
        ),
    )
    return table


def _run_data_path(out: Path, run_id: str, summary: Path | None) -> None:
    from rlstream.ops.run import RunArgs, run_data_path, sample_prompts

    args = RunArgs(prompts=sample_prompts(), out=out, run_id=run_id)

    def show(rows: list[dict]) -> None:
        table = Table("prompt_id", "task", "text", "answer", title="read back from rl.prompts.v1")
        for r in rows:
            table.add_row(r["prompt_id"], r["task"], r["text"], str(r["answer"]))
        console.print(table)

    figures = run_data_path(args, say=console.print, show=show)
    print_figures(f"run {figures['run_id']}", figures)
    console.print(f"report: [bold]{figures['report']}[/]")
    write_summary(summary, figures)


# --- stack -----------------------------------------------------------------------------------


@stack_app.command("up")
def stack_up(
    state_dir: Path | None = StateDirOpt,
    durable: bool = typer.Option(False, help="Keep the broker's log in the S3 server."),
    prometheus: bool = typer.Option(
        False, help="Also run Prometheus: it scrapes every run on the stack, with the alert rules."
    ),
    foreground: bool = typer.Option(False, help="Run in this terminal; Ctrl-C stops it."),
) -> None:
    """Start the broker and the S3 server (once: a running stack is reused)."""
    from rlstream.ops import stackctl

    directory = _state_dir(state_dir)
    if foreground:
        raise typer.Exit(stackctl.supervise(directory, durable, prometheus))
    state, started = stackctl.up(directory, durable=durable, prometheus=prometheus)
    verb = "started" if started else "already running"
    console.print(f"[green]stack {verb}[/] in {directory}")
    _print_endpoints(state["endpoints"])


def _print_endpoints(public: dict) -> None:
    table = Table(show_header=False, box=None)
    for key, value in public.items():
        table.add_row(key, str(value))
    console.print(table)


@stack_app.command("down")
def stack_down(state_dir: Path | None = StateDirOpt) -> None:
    """Stop every server of the stack; no process or port is left behind."""
    from rlstream.ops import stackctl

    stopped = stackctl.down(_state_dir(state_dir))
    console.print(f"stopped: {', '.join(stopped)}" if stopped else "no stack was running")


@stack_app.command("status")
def stack_status(
    state_dir: Path | None = StateDirOpt,
    as_json: bool = typer.Option(False, "--json", help="Print JSON instead of a table."),
) -> None:
    """Each server's pid, port, uptime and resident memory, and the total."""
    from rlstream.ops import stackctl

    rows = stackctl.status(_state_dir(state_dir))
    total = round(sum(r["rss_mb"] for r in rows), 1)
    if as_json:
        print(json.dumps({"servers": rows, "total_rss_mb": total}, indent=2))
        return
    if not rows:
        console.print("no stack is running (start one with `rlstream stack up`)")
        raise typer.Exit(1)
    table = Table("server", "pid", "port", "alive", "uptime", "RSS MB", title="rlstream stack")
    for r in rows:
        alive = "[green]yes[/]" if r["alive"] else "[red]no[/]"
        table.add_row(
            r["server"], str(r["pid"]), str(r["port"]), alive, f"{r['uptime_s']:.0f}s",
            f"{r['rss_mb']:.1f}",
        )  # fmt: skip
    table.add_row("total", "", "", "", "", f"{total:.1f}", style="bold")
    console.print(table)


# --- publish / tail / replay / topics -------------------------------------------------------


def _rate_progress():
    from rich.progress import (
        BarColumn,
        MofNCompleteColumn,
        Progress,
        TextColumn,
        TimeElapsedColumn,
    )

    return Progress(
        TextColumn("[bold]{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TextColumn("{task.fields[rate]}"),
        TimeElapsedColumn(),
        console=err,
        transient=False,
    )


@app.command()
def publish(
    file: Path = typer.Argument(..., exists=True, dir_okay=False, help=".jsonl, .csv or .parquet"),
    topic: str = typer.Option("prompts", "--topic", "-t", help="Short or full topic name."),
    batch_rows: int = typer.Option(256, min=1, max=100_000, help="Rows per Kafka message."),
    run_id: str = typer.Option("default", help="Run id written into every event's envelope."),
    dataset: str | None = typer.Option(
        None, help="Dataset the rows join (prompts, corpus): `rlstream run --prompts topic:NAME`."
    ),
    summary: Path | None = SummaryOpt,
) -> None:
    """Validate rows from FILE and publish them as Arrow events; bad rows are reported.
    Prompts are also checked for a verifier that can read their answer."""
    import time

    from rlstream.connectors.files import count_rows
    from rlstream.ops.publish import publish_file, verifier_check

    event = event_for(topic)
    if dataset is not None and "dataset" not in event.schema.names:
        raise typer.BadParameter(f"--dataset: {event.topic} rows have no dataset (prompts, corpus)")
    total = count_rows(file)
    with _rate_progress() as progress:
        task = progress.add_task(f"publish → {event.topic}", total=total, rate="")
        started = time.perf_counter()

        def on_progress(rows: int) -> None:
            rate = rows / max(time.perf_counter() - started, 1e-9)
            progress.update(task, completed=rows, rate=f"{rate:,.0f} rows/s")

        report = asyncio.run(
            publish_file(endpoints(), file, event, batch_rows=batch_rows, run_id=run_id,
                         dataset=dataset, check=verifier_check(event), on_progress=on_progress)
        )  # fmt: skip
    for where, reason in report.bad_rows[:50]:
        err.print(f"[yellow]skipped[/] {file.name} {where}: {reason}")
    if len(report.bad_rows) > 50:
        err.print(f"[yellow]... and {len(report.bad_rows) - 50} more bad rows[/]")
    figures = report.summary()
    print_figures(f"published {file.name}", figures)
    write_summary(summary, figures)


def _read_range(from_beginning, since, until, from_offset, follow):
    from rlstream.connectors.reading import ReadRange
    from rlstream.ops.replay import parse_time

    return ReadRange(
        from_beginning=from_beginning,
        from_offset=from_offset,
        since_ms=parse_time(since) if since else None,
        until_ms=parse_time(until) if until else None,
        follow=follow,
    )


def _cell(value) -> str:
    from datetime import datetime

    if isinstance(value, datetime):
        return value.strftime("%H:%M:%S.%f")[:-3]
    if isinstance(value, list):
        return f"[{len(value)} items]"
    if isinstance(value, bytes):
        return f"<{len(value)} bytes>"
    text = str(value)
    return text if len(text) <= 40 else text[:37] + "..."


def _json_value(value):
    import base64
    from datetime import datetime

    if isinstance(value, bytes):
        return base64.b64encode(value).decode()
    if isinstance(value, datetime):
        return value.isoformat()
    return value


@app.command()
def tail(
    topic: str = typer.Argument(..., help="Short (`rollouts`) or full (`rl.rollouts.v1`) name."),
    from_beginning: bool = typer.Option(False, "--from-beginning", help="Start at offset 0."),
    since: str | None = typer.Option(None, help="Start at a time: ISO-8601, `10m`, epoch ms."),
    follow: bool = typer.Option(False, "--follow", "-f", help="Keep waiting for new events."),
    where: str | None = typer.Option(None, help="SQL filter, e.g. \"reward > 0 AND task='add'\""),
    as_json: bool = typer.Option(False, "--json", help="One JSON object per row, for piping."),
    limit: int | None = typer.Option(None, min=1, help="Stop after this many rows."),
    summary: Path | None = SummaryOpt,
) -> None:
    """Decode and show a topic's events; undecodable messages are shown with their reason."""
    from rlstream.ops.replay import RowFilter, decoded_messages

    event = event_for(topic)
    row_filter = RowFilter(event, where) if where else None
    # Without --follow, show what the topic holds; with it and no start, only new events.
    start_at_beginning = from_beginning or not follow
    rng = _read_range(start_at_beginning, since, None, None, follow)
    shown, undecodable = 0, 0
    columns = [f.name for f in event.schema if f.name not in ("event_id", "run_id")]

    async def run() -> None:
        nonlocal shown, undecodable
        first = True
        async for message in decoded_messages(endpoints(), event, rng, row_filter=row_filter):
            where_ = {"_partition": message.partition, "_offset": message.offset}
            if message.error is not None:
                undecodable += 1
                if as_json:
                    print(json.dumps({**where_, "_error": str(message.error),
                                      "_kind": message.error.kind}), flush=True)  # fmt: skip
                else:
                    err.print(f"[red]undecodable[/] p{message.partition}@{message.offset}: "
                              f"{message.error}")  # fmt: skip
                continue
            rows = message.rows.to_pylist()
            if limit is not None:
                rows = rows[: limit - shown]
            if as_json:
                for row in rows:
                    out = {k: _json_value(v) for k, v in row.items()}
                    print(json.dumps({**out, **where_}), flush=True)
            elif rows:
                table = Table(show_header=first, box=None, pad_edge=False)
                for name in columns:
                    table.add_column(name, no_wrap=True, overflow="ellipsis", min_width=6)
                for row in rows:
                    table.add_row(*(_cell(row[c]) for c in columns))
                console.print(table)
                first = False
            shown += len(rows)
            if limit is not None and shown >= limit:
                return

    with contextlib.suppress(KeyboardInterrupt):
        asyncio.run(run())
    write_summary(summary, {"topic": event.topic, "rows": shown, "undecodable": undecodable})


@app.command()
def replay(
    topic: str = typer.Argument(..., help="Short or full topic name."),
    out: Path = typer.Option(..., "--out", "-o", help="Parquet file to write."),
    since: str | None = typer.Option(None, help="From this time: ISO-8601, `10m`, epoch ms."),
    until: str | None = typer.Option(None, help="Up to this time (inclusive)."),
    from_offset: int | None = typer.Option(None, min=0, help="From this offset per partition."),
    summary: Path | None = SummaryOpt,
) -> None:
    """Read a time or offset range of a topic into Parquet for DuckDB, Polars or pandas."""
    from rlstream.ops.replay import replay_to_parquet

    event = event_for(topic)
    rng = _read_range(True, since, until, from_offset, False)
    with _rate_progress() as progress:
        task = progress.add_task(f"replay {event.topic}", total=None, rate="")

        def on_progress(p) -> None:
            progress.update(task, completed=p.read, total=p.total, rate=f"{p.value_bytes:,} B")

        report = asyncio.run(replay_to_parquet(endpoints(), event, rng, out,
                                               on_progress=on_progress))  # fmt: skip
        progress.update(task, total=report.messages, completed=report.messages)
    for partition, offset, reason in report.bad_messages[:20]:
        err.print(f"[yellow]skipped[/] p{partition}@{offset}: {reason}")
    figures = report.summary()
    print_figures(f"replayed into {out}", figures)
    write_summary(summary, figures)


@app.command()
def topics(
    as_json: bool = typer.Option(False, "--json", help="Print JSON instead of a table."),
) -> None:
    """Every topic with partitions, message counts and consumer-group lag."""
    from rlstream.ops.topics import describe

    infos = asyncio.run(describe(endpoints()))
    if as_json:
        print(json.dumps([i.__dict__ for i in infos], indent=2))
        return
    table = Table("topic", "event", "partitions", "messages", "consumer-group lag", title="topics")
    for i in infos:
        lag = ", ".join(f"{g}: {n:,}" for g, n in sorted(i.lag.items())) or "-"
        table.add_row(i.topic, i.event or "-", str(i.partitions), f"{i.messages:,}", lag)
    console.print(table)


@app.command()
def reprocess(
    processor: str = typer.Argument(..., help="Processor to re-run: score_rollouts."),
    source: str = typer.Option("rollouts", "--from", help="Recorded topic to read."),
    target: str = typer.Option(..., "--to", help="New topic to write (created if missing)."),
    run_id: str | None = typer.Option(None, help="Only rows of this run."),
    verifier: str = typer.Option("reprocess", help="Verifier name written on the new rewards."),
    reward_rules: Path | None = typer.Option(None, exists=True, help="JSON reward rules file."),
    summary: Path | None = SummaryOpt,
) -> None:
    """Re-run a stream processor over a recorded topic into a new topic, under its own consumer
    group, without touching the live loop (e.g. re-score rollouts with a changed verifier)."""
    from rlstream.ops.reprocess import REPROCESSORS
    from rlstream.ops.reprocess import reprocess as run_reprocess

    if processor not in REPROCESSORS:
        raise typer.BadParameter(f"unknown processor {processor!r}; known: {sorted(REPROCESSORS)}")
    reward_fn = None
    if reward_rules is not None:
        from rlstream.trainers.rewards import build_reward

        reward_fn = build_reward(reward_rules)
    event = event_for(source)
    from rlstream.schemas import all_events

    if target in {e.topic for e in all_events()}:
        raise typer.BadParameter(
            f"--to {target}: a live topic; write to a new one, e.g. {target}.reprocessed"
        )
    report = asyncio.run(
        run_reprocess(
            endpoints(),
            processor,
            target,
            source=event.topic,
            run_id=run_id,
            verifier=verifier,
            reward_fn=reward_fn,
        )
    )
    print_figures(f"reprocessed {report.source} -> {report.target}", report.__dict__)
    write_summary(summary, report.__dict__)


@bench_app.command("loop")
def bench_loop(
    config: Path | None = trainer_commands.ConfigOpt,
    rl_steps: int | None = typer.Option(None, min=1, help="rl.steps: RL updates."),
    workers: int | None = typer.Option(None, min=1, max=8, help="loop.rollout_workers."),
    repeats: int = typer.Option(3, min=1, help="Streamed runs (median and min-max over them)."),
    compare_local: bool = typer.Option(
        True, help="Also run the in-process loop with the same settings and seed."
    ),
    out: Path = typer.Option(Path("runs"), help="Where the runs' reports go."),
    overrides: list[str] = trainer_commands.SetOpt,
    summary: Path | None = SummaryOpt,
) -> None:
    """Default streaming runs, measured: trainer idle share, request-to-experience latency,
    policy-lag histogram, messages/s per topic, and accuracy against the in-process loop."""
    from collections import Counter
    from dataclasses import replace
    from datetime import UTC, datetime

    rid = datetime.now(UTC).strftime("bench-%Y%m%d-%H%M%S")
    cfg = trainer_commands.build_config(
        config, overrides, run_id=rid, rl__steps=rl_steps, loop__rollout_workers=workers
    )
    if compare_local:
        trainer_commands.streaming_only(cfg, "`bench loop`'s in-process twin")
    workers = cfg.loop.rollout_workers
    runs = []
    for i in range(repeats):
        err.print(f"streamed run {i + 1}/{repeats} ...")
        runs.append(_watched_run(replace(cfg, run_id=f"{rid}-{i}"), out))
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
    config: Path | None = trainer_commands.ConfigOpt,
    repeats: int = typer.Option(3, min=1, help="Runs per arm (one Ctrl-C; two Ctrl-C)."),
    at_step: int = typer.Option(2, min=1, help="The RL step at which Ctrl-C is sent."),
    second_after_s: float = typer.Option(1.0, min=0, help="Two Ctrl-C arm: the gap (s)."),
    out: Path = typer.Option(Path("runs"), help="Where the runs go."),
    overrides: list[str] = trainer_commands.SetOpt,
    summary: Path | None = SummaryOpt,
) -> None:
    """Ctrl-C to `rlstream run` on its own embedded stack: seconds until it exited, every
    process of the run and every server of the stack gone (target 10 s), exit code 130; and
    a second Ctrl-C a moment later (kills what is left at once)."""
    from datetime import UTC, datetime

    from rlstream.ops import stopbench

    rid = datetime.now(UTC).strftime("stop-%Y%m%d-%H%M%S")
    cfg = trainer_commands.build_config(config, overrides, run_id=rid)
    args = stopbench.StopArgs(repeats=repeats, at_step=at_step, second_after_s=second_after_s)
    figures = stopbench.run_stop_bench(cfg, out, args, say=lambda m: err.print(m))
    console.print(stopbench.table(figures))
    write_summary(summary, figures)


@bench_app.command("broker")
def bench_broker(
    messages: int = typer.Option(2000, min=10, help="Messages per repeat and arm."),
    repeats: int = typer.Option(5, min=1, help="Repeats (arms alternate order)."),
    rows: int = typer.Option(64, min=1, help="Rows per rollout event."),
    summary: Path | None = SummaryOpt,
) -> None:
    """Produce+consume throughput of rollout events, codec vs raw bytes, and the codec alone."""
    from rlstream.ops.bench_broker import broker_bench, codec_bench

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
    from rlstream.ops.stack import EmbeddedStack

    with tempfile.TemporaryDirectory(prefix="rlstream-bench-") as tmp:
        err.print("no stack running: starting a temporary one")
        with EmbeddedStack(Path(tmp)) as stack:
            yield stack.endpoints


trainer_commands.register(app, bench_app)
selection_commands.register(bench_app)


def _user_errors() -> tuple[type[BaseException], ...]:
    try:  # the learning-core commands run where the streaming stack is not installed
        from aiokafka.errors import KafkaConnectionError, KafkaError
    except ImportError:
        return (ValueError, FileNotFoundError)
    from rlstream.connectors.files import UnsupportedFile
    from rlstream.connectors.kafka import TopicConfigError
    from rlstream.connectors.reading import TopicNotFound
    from rlstream.ops.childrun import RunFailed
    from rlstream.ops.replay import BadTime
    from rlstream.ops.stack import StackError

    return (KafkaConnectionError, KafkaError, UnsupportedFile, TopicConfigError, TopicNotFound,
            BadTime, StackError, RunFailed, ValueError, FileNotFoundError,
            TimeoutError)  # fmt: skip


def main() -> None:
    """Run the CLI; errors a user can fix become one line on stderr and exit status 2."""
    from rlstream.ops.procs import heed_interrupts

    heed_interrupts()
    try:
        app()
    except KeyboardInterrupt:
        err.print("interrupted")
        sys.exit(130)
    except Exception as exc:  # noqa: BLE001  (narrowed just below)
        if not isinstance(exc, _user_errors()):
            raise
        err.print(f"[red]error:[/] {_explain(exc)}")
        sys.exit(2)


def _explain(exc: BaseException) -> str:
    if type(exc).__name__ == "KafkaConnectionError":  # aiokafka may not be installed here
        bootstrap = endpoints().kafka_bootstrap
        return (
            f"cannot reach the Kafka broker at {bootstrap}: start the embedded stack with "
            "`rlstream stack up`, or set RLSTREAM_KAFKA_BOOTSTRAP"
        )
    return str(exc).splitlines()[0] if str(exc) else type(exc).__name__


if __name__ == "__main__":
    main()
