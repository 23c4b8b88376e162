"""`rlstream run` (with its live view), `rlstream mirror`, `rlstream export` and
`rlstream config show`."""

from __future__ import annotations

from pathlib import Path

import typer
from rich.table import Table

from rlstream.cli.app import (
    SummaryOpt,
    app,
    config_app,
    console,
    err,
    print_figures,
    write_summary,
)
from rlstream.cli.train import (
    ConfigOpt,
    FormatOpt,
    LoraOpt,
    ModelOpt,
    SetOpt,
    build_config,
    model_source,
    reward_fn_spec,
)


@app.command()
def run(
    config: Path | None = ConfigOpt,
    rl_steps: int | None = typer.Option(None, min=1, help="rl.steps: RL updates."),
    tasks: str | None = typer.Option(None, help="data.tasks, e.g. add,sub or add:2,mul@1-2."),
    fmt: str | None = FormatOpt,
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
    model: str | None = ModelOpt,
    lora: str | None = LoraOpt,
    workers: str | None = typer.Option(
        None, help="loop.rollout_workers: N, or auto:MIN-MAX (scaled on the request backlog)."
    ),
    seed: int | None = typer.Option(None, help="Seed of splits, corpus, init and sampling."),
    out: Path = typer.Option(Path("runs"), help="Where the run's report, plots and logs go."),
    run_id: str = typer.Option("", help="Run id [default: from the time]."),
    resume: str | None = typer.Option(None, help="Continue RUN_ID from its last checkpoint."),
    data_only: bool = typer.Option(False, help="Only publish, read back and replay prompts."),
    prepare_only: bool = typer.Option(
        False,
        help="Write the run's config.json and publish its data on the configured stack, start no "
        "process (the processes run elsewhere: docs/deploy.md).",
    ),
    timeout_s: float = typer.Option(3600, help="Give up if the trainer is not done by then."),
    overrides: list[str] = SetOpt,
    summary: Path | None = SummaryOpt,
) -> None:
    """The main job: the streaming RL loop on the embedded stack (started and stopped here) or
    on RLSTREAM_* endpoints. Pre-trains, runs RL with rollout workers, evaluates, and writes a
    report with plots locally and to the object store. Ctrl-C stops cleanly."""
    from datetime import UTC, datetime

    from rlstream.config import load_config
    from rlstream.ops.launcher.datapath import how_to_continue, resumable

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
    cfg = build_config(
        config, overrides, rl__steps=rl_steps, data__tasks=tasks, data__format=fmt,
        selection__sampler=sampler, selection__ppm_from=ppm_from,
        rl__algo=algo, rl__hybrid=hybrid, rl__reward_rules=None if reward_rules is None else
        str(reward_rules.resolve()), loop__rollout_workers=workers, seed=seed,
        data__prompts=_source(prompts), data__corpus=_source(corpus), data__dataset=dataset,
        rl__reward_fn=reward_fn_spec(reward_fn), tracking__mlflow_uri=mlflow,
        model__path=model_source(model), model__lora=lora,
        run_id=run_id or datetime.now(UTC).strftime("run-%Y%m%d-%H%M%S"),
    )  # fmt: skip
    if prepare_only:
        from rlstream.ops.launcher.datapath import external_stack
        from rlstream.ops.launcher.loop import run_loop

        if not external_stack():
            raise typer.BadParameter("a prepared run needs a stack that outlives this command: "
                                     "set the RLSTREAM_* endpoints, or `rlstream stack up`",
                                     param_hint="--prepare-only")  # fmt: skip
        figures = run_loop(cfg, out, prepare_only=True)
        print_figures(f"run {cfg.run_id} prepared", figures)
        write_summary(summary, figures)
        return
    try:
        figures = watched_run(cfg, out, timeout_s)
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
def mirror(
    run_id: str = typer.Argument(..., help="The live run whose request stream to mirror."),
    candidate: str = typer.Option(
        ...,
        help="The policy to evaluate: a stored version of the run, an exported directory "
        "(`rlstream export`) or an s3:// URI.",
    ),
    name: str = typer.Option("candidate", help="Its name on rl.eval_results.v1 (mirror:NAME)."),
    prompts: int = typer.Option(64, min=1, help="Mirrored prompts to judge, then stop."),
    timeout_s: float = typer.Option(600.0, min=1.0, help="Stop after this long regardless."),
    runs: Path = typer.Option(Path("runs"), help="Where the run is (its config.json)."),
    summary: Path | None = SummaryOpt,
) -> None:
    """Evaluate a candidate policy on a mirror of a live run's prompts: its own consumer group
    on the run's rollout requests, beside the rollout workers', so the training loop is
    untouched. Each prompt is solved greedily by the candidate and by the policy serving the run,
    graded by its verifier; the paired figures go to rl.eval_results.v1 as task mirror:NAME."""
    import asyncio

    from rlstream.config import Config
    from rlstream.connectors.objectstore import ObjectStore
    from rlstream.ops.launcher.datapath import run_stack
    from rlstream.streams.mirror import load_candidate
    from rlstream.streams.mirror import mirror as mirror_run

    path = runs.resolve() / run_id / "config.json"
    if not path.exists():
        raise typer.BadParameter(f"no run {run_id!r} under {runs} (no {path})", param_hint="RUN")
    cfg = Config.read(path)
    with run_stack(runs.resolve(), run_id) as stack:
        policy = load_candidate(ObjectStore(stack), run_id, candidate)
        figures = asyncio.run(mirror_run(cfg, stack, policy, name, prompts, timeout_s=timeout_s,
                                         say=err.print))  # fmt: skip
    print_figures(f"mirror {name} of run {run_id}", figures)
    write_summary(summary, figures)


@app.command()
def export(
    run_id: str = typer.Argument(..., help="The run whose policy to export."),
    out: Path = typer.Option(..., help="The directory to write (a Hugging Face model)."),
    version: int | None = typer.Option(None, help="Policy version [default: the newest]."),
    runs: Path = typer.Option(
        Path("runs"), help="Where the run is: `rlstream run --out` or `rlstream serve --out`."
    ),
) -> None:
    """Write a published policy version as a Hugging Face directory (config.json,
    model.safetensors, tokenizer files) that `AutoModelForCausalLM.from_pretrained` and
    `AutoTokenizer.from_pretrained` load with no rlstream code. Reads the running stack's object
    store, else the run's own embedded stack (started for the copy)."""
    from rlstream.connectors.objectstore import ObjectStore
    from rlstream.ops.launcher.datapath import run_stack
    from rlstream.streams.policystore import download_policy, stored_versions

    with run_stack(runs.resolve(), run_id) as stack:
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
    config: Path | None = ConfigOpt,
    overrides: list[str] = SetOpt,
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
    print(show(build_config(config, overrides)), end="")


IDLE_SHARE_TARGET = 0.10  # bench loop: the trainer waits for experience under 10% of its time


PLAIN_PROGRESS_EVERY_S = 5.0  # off a terminal (CI, nohup, a log file): one line this often


def watched_run(cfg, out: Path, timeout_s: float = 3600) -> dict:
    """run_loop with the live view (phase, step, reward, accuracy, lag, rates, idle share);
    off a terminal, a plain progress line every PLAIN_PROGRESS_EVERY_S instead."""
    import time

    from rich.live import Live

    from rlstream.ops.launcher.loop import run_loop

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
    from rlstream.ops.launcher.datapath import RunArgs, run_data_path, sample_prompts

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
