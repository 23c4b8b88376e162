"""CLI commands of the learning core, registered on the main `rlstream` app by rlstream.cli.

Keep heavy imports (torch) inside the command functions so `rlstream --help` stays fast.
"""

from __future__ import annotations

from pathlib import Path

import typer


def parse_overrides(items: list[str], settings: type | None = None) -> dict:
    """['corpus_docs=2000', 'hybrid=true'] -> typed values for the fields of a settings
    dataclass (default: rlstream.trainers.local.Args)."""
    from dataclasses import fields

    if settings is None:
        from rlstream.trainers.local import Args as settings

    types = {f.name: str(f.type) for f in fields(settings)}  # e.g. "int", "str | None"
    out = {}
    for item in items:
        key, sep, raw = item.partition("=")
        if not sep or key not in types:
            raise typer.BadParameter(
                f"--set {item!r}: expected FIELD=VALUE with FIELD one of {', '.join(sorted(types))}"
            )
        kind = next(t for t in ("bool", "int", "float", "str") if t in types[key])
        if "None" in types[key] and raw.lower() in ("", "none"):
            out[key] = None
        elif kind == "bool":
            out[key] = raw.lower() in ("1", "true", "yes", "on")
        else:
            try:
                out[key] = {"int": int, "float": float, "str": str}[kind](raw)
            except ValueError:
                raise typer.BadParameter(f"--set {item!r}: not a {kind}") from None
    return out


def register(app: typer.Typer, bench_app: typer.Typer) -> None:
    """Add the learning-core commands (`train`, `bench train`) to the CLI."""

    @app.command("train")
    def train(
        mode: str = typer.Option("local", help="local: pre-train, RL and evaluate in-process"),
        tasks: str = typer.Option(
            "add,sub", help="task mix, e.g. add,sub:2,mul@1-2 (name:weight@dmin-dmax)"
        ),
        algo: str = typer.Option("grpo", help="grpo or ppo"),
        rl_steps: int = typer.Option(300, help="RL steps"),
        pretrain_max_steps: int = typer.Option(2000, help="cap on pre-training steps"),
        seed: int = typer.Option(0, help="seed of splits, corpus, init and sampling"),
        threads: int = typer.Option(2, help="torch CPU threads"),
        backend: str = typer.Option("auto", help="torch, deepspeed or auto"),
        zero_stage: int = typer.Option(2, help="DeepSpeed ZeRO stage"),
        hybrid: bool = typer.Option(False, help="mix LM loss into RL, feed verified rollouts back"),
        reward_rules: Path | None = typer.Option(None, help="JSON reward rules file"),
        checkpoint_dir: Path | None = typer.Option(None, help="checkpoint directory"),
        checkpoint_every: int = typer.Option(0, help="steps between checkpoints (0: never)"),
        resume: bool = typer.Option(False, help="resume from the newest checkpoint"),
        out_dir: Path | None = typer.Option(None, help="history.json and curves.png go here"),
        summary: Path | None = typer.Option(None, help="write the summary JSON here"),
        progress: bool = typer.Option(True, help="progress bars and final table"),
        overrides: list[str] = typer.Option(
            [], "--set", help="any other Args field, e.g. --set corpus_docs=20000 (repeatable)"
        ),
    ) -> None:
        """Pre-train a small GPT on verifiable tasks, then improve it with RL (no Kafka)."""
        if mode != "local":
            raise typer.BadParameter("only --mode local exists here; streaming is `rlstream run`")
        from rlstream.trainers.local import Args, train_local

        s = lambda p: None if p is None else str(p)  # noqa: E731
        try:
            args = Args(
                tasks=tasks,
                algo=algo,
                rl_steps=rl_steps,
                seed=seed,
                threads=threads,
                pretrain_max_steps=pretrain_max_steps,
                backend=backend,
                zero_stage=zero_stage,
                hybrid=hybrid,
                reward_rules=s(reward_rules),
                checkpoint_dir=s(checkpoint_dir),
                checkpoint_every=checkpoint_every,
                resume=resume,
                out_dir=s(out_dir),
                summary=s(summary),
                progress=progress,
                **parse_overrides(overrides),
            )
        except (ValueError, KeyError) as e:
            raise typer.BadParameter(str(e)) from None
        train_local(args)

    @bench_app.command("train")
    def bench_train(
        repeats: int = typer.Option(5, help="timed repeats (median and spread reported)"),
        threads: int = typer.Option(2, help="torch CPU threads"),
        device: str = typer.Option("auto", help="cpu, cuda or auto"),
        batch_size: int = typer.Option(64, help="sequences per training step"),
        json_out: Path | None = typer.Option(None, "--json", help="also write results as JSON"),
    ) -> None:
        """Training tokens/s and sampling tokens/s (with and without KV cache), default model."""
        from rlstream.trainers.bench import print_table, run_bench

        res = run_bench(repeats=repeats, threads=threads, device=device, batch_size=batch_size)
        print_table(res)
        if json_out:
            import json

            json_out.write_text(json.dumps(res, indent=2))
