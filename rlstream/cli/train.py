"""CLI commands of the learning core, registered on the main `rlstream` app by rlstream.cli.

Keep heavy imports (torch) inside the command functions so `rlstream --help` stays fast.
"""

from __future__ import annotations

from pathlib import Path

import typer

ConfigOpt = typer.Option(
    None,
    "--config",
    help="YAML or JSON file of settings (the shape `rlstream config show` prints).",
)
SetOpt = typer.Option(
    [],
    "--set",
    help="Any setting NAME=VALUE, dotted (rl.lr=3e-5) or a unique leaf name; repeatable.",
)

ModelOpt = typer.Option(
    None,
    "--model",
    help="model.path: a local Hugging Face model directory, or preset:NAME (tiny, qwen2-0.5b).",
)

LoraOpt = typer.Option(
    None, "--lora", help="model.lora: LoRA adapters on --model DIR, e.g. r=16,alpha=32."
)
FormatOpt = typer.Option(
    None,
    "--format",
    help="data.format: direct (the answer alone) or cot (worked steps, then <answer>X</answer>; "
    "raise model.block_size to 96 and rl.max_new_tokens to 48).",
)


def build_config(config: Path | None, overrides: list[str], base=None, **options):
    """The effective Config: defaults (or `base`) < --config file < the command's flags < --set.
    Flags are given as dotted names with `__` for dots (rl__steps=...); None = not given.
    A bad setting raises ConfigError, which the CLI prints as one line (exit status 2)."""
    from rlstream.config import load_config

    dotted = {k.replace("__", "."): v for k, v in options.items()}
    return load_config(config, overrides, dotted, base=base)


def reward_fn_spec(spec: str | None) -> str | None:
    """A reward function as every process sees it: a file path made absolute."""
    if spec is None:
        return None
    where, sep, name = spec.rpartition(":")
    return f"{Path(where).resolve()}{sep}{name}" if where.endswith(".py") else spec


def model_source(value: str | None) -> str | None:
    """A model as every process sees it: an existing directory made absolute; presets and
    anything else as given (the config check explains what is wrong with it)."""
    if value is None or value.startswith("preset:") or not Path(value).expanduser().exists():
        return value
    return str(Path(value).expanduser().resolve())


def streaming_only(cfg, command: str) -> None:
    """topic:DATASET sources need the broker: refuse them where the loop runs in-process."""
    from rlstream.config import ConfigError

    for name in ("prompts", "corpus"):
        source = getattr(cfg.data, name)
        if source is not None and source.startswith("topic:"):
            raise ConfigError(
                f"data.{name}: {command} runs in-process and reads files; for {source} use "
                f"`rlstream run --{name} {source}`"
            )


def register(app: typer.Typer, bench_app: typer.Typer) -> None:
    """Add the learning-core commands (`train`, `bench train`) to the CLI."""

    @app.command("train")
    def train(
        mode: str = typer.Option("local", help="local: pre-train, RL and evaluate in-process"),
        config: Path | None = ConfigOpt,
        tasks: str | None = typer.Option(None, help="data.tasks, e.g. add,sub:2,mul@1-2"),
        fmt: str | None = FormatOpt,
        algo: str | None = typer.Option(None, help="rl.algo: grpo or ppo"),
        sampler: str | None = typer.Option(None, help="selection.sampler: ppm, uniform, ..."),
        rl_steps: int | None = typer.Option(None, help="rl.steps"),
        pretrain_max_steps: int | None = typer.Option(None, help="pretrain.max_steps"),
        seed: int | None = typer.Option(None, help="seed of splits, corpus, init and sampling"),
        threads: int | None = typer.Option(None, help="model.threads (torch CPU threads)"),
        backend: str | None = typer.Option(None, help="model.backend: torch, deepspeed or auto"),
        hybrid: bool | None = typer.Option(None, "--hybrid/--no-hybrid", help="rl.hybrid"),
        reward_rules: Path | None = typer.Option(None, help="rl.reward_rules: JSON rules file"),
        reward_fn: str | None = typer.Option(None, help="rl.reward_fn: module:function"),
        mlflow: str | None = typer.Option(None, help="tracking.mlflow_uri (MLflow server)"),
        model: str | None = ModelOpt,
        lora: str | None = LoraOpt,
        prompts: Path | None = typer.Option(None, help="data.prompts: JSONL/CSV/Parquet file"),
        corpus: Path | None = typer.Option(None, help="data.corpus: documents file"),
        checkpoint_dir: Path | None = typer.Option(None, help="checkpoint directory"),
        resume: bool = typer.Option(False, help="resume from the newest checkpoint"),
        out_dir: Path | None = typer.Option(None, help="history.json, curves.png, config.yaml"),
        summary: Path | None = typer.Option(None, help="write the summary JSON here"),
        progress: bool = typer.Option(True, help="progress bars and final table"),
        overrides: list[str] = SetOpt,
    ) -> None:
        """Pre-train a model on verifiable tasks, then improve it with RL (no Kafka)."""
        if mode != "local":
            raise typer.BadParameter("only --mode local exists here; streaming is `rlstream run`")
        from rlstream.trainers.local import LocalOptions, train_local

        s = lambda p: None if p is None else str(p)  # noqa: E731
        cfg = build_config(
            config, overrides, data__tasks=tasks, data__format=fmt, rl__algo=algo,
            selection__sampler=sampler, rl__steps=rl_steps,
            pretrain__max_steps=pretrain_max_steps, seed=seed,
            model__threads=threads, model__backend=backend, rl__hybrid=hybrid,
            rl__reward_rules=s(reward_rules), data__prompts=s(prompts), data__corpus=s(corpus),
            rl__reward_fn=reward_fn_spec(reward_fn), tracking__mlflow_uri=mlflow,
            model__path=model_source(model), model__lora=lora,
        )  # fmt: skip
        streaming_only(cfg, "`rlstream train`")
        opts = LocalOptions(s(checkpoint_dir), resume, s(out_dir), s(summary), progress)
        train_local(cfg, opts)

    @bench_app.command("train")
    def bench_train(
        repeats: int = typer.Option(5, help="timed repeats (median and spread reported)"),
        threads: int = typer.Option(2, help="torch CPU threads"),
        device: str = typer.Option("auto", help="cpu, cuda or auto"),
        batch_size: int = typer.Option(64, help="sequences per training step"),
        model: str = typer.Option("preset:tiny", help="a model directory or preset:NAME"),
        block_size: int = typer.Option(32, min=8, help="sequence length (model.block_size)"),
        json_out: Path | None = typer.Option(None, "--json", help="also write results as JSON"),
    ) -> None:
        """Training tokens/s against a bare torch loop and sampling tokens/s against
        model.generate, on the same Hugging Face model (median and spread over repeats)."""
        from rlstream.trainers.bench import print_table, run_bench

        res = run_bench(repeats, threads, device, batch_size, model_source(model) or model,
                        block_size)  # fmt: skip
        print_table(res)
        if json_out:
            import json

            json_out.write_text(json.dumps(res, indent=2))
