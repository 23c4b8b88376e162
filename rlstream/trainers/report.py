"""Reporting for the local loop: progress bars, the summary dict, history/curves/table outputs."""

from __future__ import annotations

import json
from pathlib import Path


def progress_bars(enabled: bool):
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    return Progress(
        TextColumn("{task.description:<9}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        TextColumn("{task.fields[info]}"),
        disable=not enabled,
    )


def bar_info(row: dict, keys: dict[str, str]) -> str:
    return "  ".join(f"{label} {row[k]:.3f}" for k, label in keys.items() if k in row)


def make_summary(run, final: dict, wall_s: float) -> dict:
    pe, st = run.pretrain_eval, run.state
    return {
        "tasks": run.cfg.data.tasks,
        "dataset": run.dataset,
        "eval_prompts": len(run.eval_set),
        "refused": run.refused,
        "bad_rows": {source: rows[:20] for source, rows in run.bad_rows.items()},
        "algo": run.cfg.rl.algo,
        "sampler": run.cfg.selection.sampler,
        "ppm_features": run.cfg.ppm_feature_spec() if run.cfg.selection.sampler == "ppm" else None,
        "params": st.model.num_params(),
        "trainable_params": st.model.num_params(trainable=True),
        "pretrain_steps": pe.get("steps"),
        "pretrain_wall_s": pe.get("wall_s"),
        "pretrain_accuracy": pe.get("greedy"),
        "pretrain_pass1": pe.get("pass1"),
        "final_accuracy": final["greedy"],
        "final_pass1": final.get("pass1"),
        "pretrain_by_task": pe.get("greedy_by_task"),
        "final_by_task": final["greedy_by_task"],
        "rl_steps": st.rl_step,
        "rollouts": st.rollouts,
        "rollouts_generated": run.generated,
        "dropped_groups": st.stale_groups,
        "zero_variance_share": round(st.zero_variance_groups / st.trained_groups, 4)
        if st.trained_groups
        else None,
        "corpus_added": len(run.added_docs),
        "wall_s": wall_s,
    }


def write_outputs(run, opts, summary: dict) -> None:
    """history.json, curves.png, the effective config.yaml and the trained policy (`model/`, a
    Hugging Face directory) under opts.out_dir; the summary JSON at opts.summary; the final
    table when progress is on."""
    from rlstream.config import show
    from rlstream.trainers.policy import save_policy

    a = run.cfg
    if opts.out_dir:
        from rlstream.trainers.plots import plot_curves

        out = Path(opts.out_dir)
        out.mkdir(parents=True, exist_ok=True)
        (out / "history.json").write_text(json.dumps(run.history))
        (out / "config.yaml").write_text(show(run.cfg))
        plot_curves(run.history, out / "curves.png")
        save_policy(run.state.policy(), out / "model")
    if opts.summary:
        Path(opts.summary).parent.mkdir(parents=True, exist_ok=True)
        Path(opts.summary).write_text(json.dumps(summary, indent=2))
    if opts.progress:
        from rich.console import Console
        from rich.table import Table

        t = Table(title=f"rlstream local run: {a.data.tasks} ({a.rl.algo}, {a.selection.sampler})")
        t.add_column("held-out")
        t.add_column("pre-trained", justify="right")
        t.add_column("after RL", justify="right")
        fmt = lambda v: "-" if v is None else f"{v:.1%}"  # noqa: E731
        t.add_row(
            "greedy accuracy", fmt(summary["pretrain_accuracy"]), fmt(summary["final_accuracy"])
        )
        t.add_row("pass@1", fmt(summary["pretrain_pass1"]), fmt(summary["final_pass1"]))
        for task, acc in summary["final_by_task"].items():
            before = (summary["pretrain_by_task"] or {}).get(task)
            t.add_row(f"  greedy {task}", fmt(before), fmt(acc))
        Console().print(t)
        Console().print(
            f"{summary['rl_steps']} RL steps, {summary['rollouts']} rollouts, "
            f"{summary['wall_s']:.0f} s"
        )
