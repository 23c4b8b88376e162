"""CLI commands of prompt selection (`rlstream bench selection`), registered by rlstream.cli."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import typer

from rlstream.cli.train import ConfigOpt, SetOpt, build_config

COT_BLOCK_SIZE, COT_MAX_NEW_TOKENS = 96, 48
"""The CoT pools' context and completion lengths, as every saved arm ran (`--resume` and
`--merge` combine arms of equal settings). 48 cuts 8.5% of countdown's worked solutions (up to
50 characters): those prompts cannot be solved in the bench; `rlstream run --format cot` gives
64 (config.FORMAT_DEFAULTS)."""


def register(bench_app: typer.Typer) -> None:
    """Add `bench selection` to the bench command group."""

    @bench_app.command("selection")
    def bench_selection(
        samplers: str = typer.Option(
            "uniform,dapo,greso,mopps,ppm,ppm:reference",
            help="samplers to compare; ppm:<featurizers> is a PPM variant, <ppm arm>@warm that arm "
            "warm-started from its final PPM of another seed (as --ppm-from)",
        ),
        seeds: int = typer.Option(3, help="seeds per sampler"),
        steps: int = typer.Option(None, help="RL steps per arm [default: 40; --quick 30]"),
        pool: str = typer.Option("both", help="default | late | both"),
        task: str = typer.Option(
            "add,sub", help="task mix (e.g. add,sub or add:2,mul@1-2) or rg:<reasoning-gym name>"
        ),
        fmt: str = typer.Option(
            None, "--format", help="direct or cot (worked solutions; context 96, completions 48)"
        ),
        target_accuracy: float = typer.Option(
            None, help="held-out greedy target (default: start + 90% of uniform's mean gain)"
        ),
        target_fraction: float = typer.Option(0.9, help="share of uniform's gain = the target"),
        out: Path = typer.Option(Path("bench-selection"), help="records.parquet, plots"),
        summary: Path = typer.Option(None, help="write the headline figures as JSON here"),
        quick: bool = typer.Option(False, help="preset: 2 seeds, 30 steps, 300 pre-train steps"),
        pool_size: int = typer.Option(None, help="train prompts per pool"),
        eval_prompts: int = typer.Option(None, help="held-out prompts"),
        late_warmup: int = typer.Option(None, help="uniform steps before the late pool"),
        late_extra: str = typer.Option(None, help="out-of-reach family of the late pool"),
        late_rl_lr: float = typer.Option(None, help="RL learning rate of the late pool's arms"),
        ppm_features: str = typer.Option(
            None,
            help="PPM featurizers of the ppm arm: minilm,text,hidden,prefill,confidence,reference",
        ),
        pretrain_steps: int = typer.Option(None, help="pre-training step cap"),
        corpus_docs: int = typer.Option(None, help="pre-training documents"),
        n_layer: int = typer.Option(None, help="policy layers"),
        n_embd: int = typer.Option(None, help="policy width"),
        block_size: int = typer.Option(None, help="policy context (raise for reasoning-gym)"),
        max_new_tokens: int = typer.Option(None, help="longest completion"),
        prompts_per_step: int = typer.Option(None, help="prompts per RL step (B)"),
        group_size: int = typer.Option(None, help="completions per prompt (G)"),
        eval_every: int = typer.Option(None, help="steps between greedy evaluations"),
        pass1_every: int = typer.Option(None, help="steps between pass@1 evaluations"),
        threads: int = typer.Option(1, help="torch threads"),
        cache_dir: Path = typer.Option(
            Path("~/.cache/rlstream/selection"), help="cached pre-trained checkpoints"
        ),
        progress: bool = typer.Option(True, help="progress bar and tables"),
        resume: bool = typer.Option(False, help="reuse arms saved under OUT/arms by a prior run"),
        merge: list[Path] = typer.Option(
            None,
            help="run nothing: rebuild the tables, plots and summary into OUT from the arms "
            "saved under each DIR/arms (pools or seeds benchmarked in separate processes)",
        ),
        config: Path = ConfigOpt,
        overrides: list[str] = SetOpt,
    ):
        """Compare prompt samplers (RESEARCH.md's table), mean ± std over seeds, per pool."""
        from rlstream.trainers.selection.bench import (
            BenchArgs,
            bench_config,
            run_bench,
            summarize_saved,
        )
        from rlstream.trainers.selection.bench import quick as quick_preset
        from rlstream.trainers.selection.loop import ArmArgs

        a = BenchArgs(
            samplers=samplers,
            seeds=seeds,
            steps=steps or 40,
            pool=pool,
            task=task,
            target_accuracy=target_accuracy,
            target_fraction=target_fraction,
            out=str(out),
            summary=str(summary) if summary else None,
            cache_dir=str(cache_dir),
            progress=progress,
            resume=resume,
            arm=ArmArgs(threads=threads),
            train=build_config(config, overrides, base=bench_config()),
        )
        if quick:
            a = quick_preset(a)
        a = _override(a, locals())
        if merge:
            missing = [str(d) for d in merge if not (d / "arms").is_dir()]
            if missing:
                raise typer.BadParameter(
                    f"no saved arms in {', '.join(missing)} (expected DIR/arms/*.json from "
                    "an earlier `rlstream bench selection --out DIR`)",
                    param_hint="--merge",
                )
            summarize_saved(a, [str(d) for d in merge])
            return
        run_bench(a)


def _override(a, opts: dict):
    """Explicit options win over the defaults and the --quick preset."""
    from rlstream.config import with_values

    pick = lambda keys: {k: opts[k] for k in keys if opts.get(k) is not None}  # noqa: E731
    top = pick(["steps", "pool_size", "eval_prompts", "late_warmup", "late_extra", "late_rl_lr"])
    names = {
        "corpus_docs": "data.corpus_docs",
        "n_layer": "model.n_layer",
        "n_embd": "model.n_embd",
        "block_size": "model.block_size",
        "pretrain_steps": "pretrain.max_steps",
        "max_new_tokens": "rl.max_new_tokens",
        "prompts_per_step": "rl.prompts_per_step",
        "group_size": "rl.group_size",
        "ppm_features": "selection.ppm_features",
    }
    train = {dotted: opts[k] for k, dotted in names.items() if opts.get(k) is not None}
    if opts.get("fmt") is not None:
        train["data.format"] = opts["fmt"]
        if opts["fmt"] == "cot":  # worked solutions are longer than the answers
            train.setdefault("model.block_size", COT_BLOCK_SIZE)
            train.setdefault("rl.max_new_tokens", COT_MAX_NEW_TOKENS)
    if opts.get("n_embd") is not None:
        train["model.n_head"] = max(1, min(4, opts["n_embd"] // 16))
    arm = pick(["eval_every", "pass1_every"])
    a = replace(a, train=with_values(a.train, **train), arm=replace(a.arm, **arm), **top)
    return replace(a)  # __post_init__ again: steps and task reach a.train
