"""The run report: Markdown with the headline figures and one PNG of the run's curves."""

from __future__ import annotations

from collections import defaultdict
from pathlib import Path

from rlstream.ops.launcher.watch import RunView


def _series(evals: list[dict], task: str, metric: str) -> tuple[list[int], list[float]]:
    points = sorted(
        {(r["step"], r["value"]) for r in evals if r["task"] == task and r["metric"] == metric}
    )
    return [p[0] for p in points], [p[1] for p in points]


def plot_run(view: RunView, path: Path, lag_histogram: dict | None = None) -> Path:
    """curves.png: losses, reward, accuracy, entropy, messages/s, and the policy lag at
    rollout (the summary's histogram where given, so the two agree)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import MaxNLocator

    fig, axes = plt.subplots(2, 3, figsize=(15, 8))
    ax = axes[0][0]  # the two phases one after the other on one step axis, each its own scale
    pre_x, pre_y = _series(view.evals, "pretrain", "val_loss")
    ax.plot(pre_x, pre_y, color="tab:blue", label="pre-train val loss")
    ax.set(title="loss per phase", xlabel="step (pre-training, then RL)")
    ax.set_ylabel("pre-train val loss", color="tab:blue")
    rl_x, rl_y = _series(view.evals, "rl", "pg_loss")
    offset = max(pre_x, default=0)
    ax_rl = ax.twinx()
    ax_rl.plot([offset + x for x in rl_x], rl_y, color="tab:orange", lw=0.8)
    ax_rl.set_ylabel("RL policy loss", color="tab:orange")
    axes[0][1].plot(*_series(view.evals, "rl", "reward"))
    axes[0][1].set(title="batch reward", xlabel="RL step")
    for metric in ("greedy", "pass1"):
        axes[0][2].plot(*_series(view.evals, "all", metric), marker="o", label=metric)
    axes[0][2].set(title="held-out accuracy", xlabel="RL step", ylim=(0, 1))
    axes[0][2].legend()
    axes[1][0].plot(*_series(view.evals, "rl", "entropy"))
    axes[1][0].set(title="policy entropy", xlabel="RL step")
    t0 = view.throughput[0][0] if view.throughput else 0
    for topic in ("rl.rollout_requests.v1", "rl.rollouts.v1", "rl.rewards.v1", "rl.experience.v2"):
        xs, ys = [], []
        for (t1, c1), (t2, c2) in zip(view.throughput, view.throughput[1:], strict=False):
            xs.append(t2 - t0)
            ys.append((c2.get(topic, 0) - c1.get(topic, 0)) / max(1e-3, t2 - t1))
        axes[1][1].plot(xs, ys, label=topic.split(".")[1])
    axes[1][1].set(title="messages/s per topic", xlabel="seconds")
    axes[1][1].legend(fontsize=7)
    lags = defaultdict(int)
    for lag in view.lags:
        lags[lag] += 1
    if lag_histogram:
        lags = {int(k): v for k, v in lag_histogram.items()}
    axes[1][2].bar(list(lags), list(lags.values()))
    axes[1][2].set(title="policy lag at rollout (groups)", xlabel="versions behind")
    axes[1][2].xaxis.set_major_locator(MaxNLocator(integer=True))  # lags are whole versions
    axes[1][2].yaxis.set_major_locator(MaxNLocator(integer=True))
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)
    return path


def accuracy_by_task(evals: list[dict]) -> dict[str, tuple[float, float]]:
    """task -> (greedy accuracy of the pre-trained policy, of the last evaluation), from the
    run's held-out evaluations ("all" first)."""
    out = {}
    for task in sorted({r["task"] for r in evals if r["metric"] == "greedy"}):
        steps, values = _series(evals, task, "greedy")
        if steps:
            out[task] = (values[0], values[-1])
    return dict(sorted(out.items(), key=lambda kv: kv[0] != "all"))


def headline(summary: dict, evals: list[dict]) -> list[str]:
    """The comparison a reader looks for first: accuracy before and after RL per task, what
    selection spent its rollouts on, and the loop's latency."""
    pct = lambda v: "-" if v is None else f"{100 * v:.1f}%"  # noqa: E731
    lines = ["## Before and after RL (held-out greedy accuracy)", "",
             "| task | pre-trained | final | change |", "|---|---|---|---|"]  # fmt: skip
    by_task = accuracy_by_task(evals)
    if not by_task and summary.get("final_accuracy") is not None:
        by_task = {"all": (summary.get("pretrain_accuracy"), summary["final_accuracy"])}
    for task, (before, after) in by_task.items():
        change = "-" if before is None else f"{100 * (after - before):+.1f} points"
        lines.append(f"| {task} | {pct(before)} | {pct(after)} | {change} |")
    lines += ["", "## Selection and latency", "", "| figure | value |", "|---|---|"]
    rows = [
        ("sampler", summary.get("sampler")),
        ("RL steps, pre-training steps", f"{summary.get('rl_steps')}, "
                                         f"{summary.get('pretrain_steps')}"),
        ("groups with no learning signal (all right or all wrong)",
         pct(summary.get("zero_variance_share"))),
        ("groups filtered before training (DAPO)", summary.get("filtered_groups")),
        ("groups dropped: an environment failed", summary.get("env_failed_groups")),
        ("request -> experience, median / p99 (ms)",
         f"{summary.get('request_to_experience_p50_ms')} / "
         f"{summary.get('request_to_experience_p99_ms')}"),
        ("trainer idle share", summary.get("trainer_idle_share")),
        ("wall clock (s)", summary.get("wall_s")),
    ]  # fmt: skip
    lines += [f"| {k} | {v} |" for k, v in rows if v is not None]
    lines += ["", "A uniform baseline on the same data is `rlstream bench selection` "
              "(docs/selection-benchmark.md)."]  # fmt: skip
    return lines


def write_report(out: Path, summary: dict, view: RunView) -> Path:
    """report.md: the headline comparison, the curves, then every figure (collapsed)."""
    plot = plot_run(view, out / "curves.png", summary.get("policy_lag_histogram"))
    lines = [f"# rlstream run {summary.get('run_id')}", "", *headline(summary, view.evals)]
    lines += ["", "## Curves", "", "![curves](curves.png)"]
    memory, slopes = summary.get("rss_mb_end") or {}, summary.get("rss_mb_slope_per_1k_steps") or {}
    if memory:
        pss = summary.get("pss_mb_end") or {}
        lines += ["", "## Processes", "",
                  "| process | resident (RSS, MiB) | proportional (PSS, MiB) | RSS MiB per 1,000 "
                  "RL steps |", "|---|---|---|---|"]  # fmt: skip
        lines += [f"| {k} | {v} | {pss.get(k, '-')} | {slopes.get(k)} |" for k, v in memory.items()]
        if pss:
            together = summary.get("pss_mb_loop_total_end")
            lines.append(f"| the loop's processes together | | {together} | |")
    disks = summary.get("disk_mb_end") or {}
    if disks:
        disk_slopes = summary.get("disk_mb_slope_per_1k_steps") or {}
        lines += ["", "| data directory | MiB at the end | MiB per 1,000 RL steps |",
                  "|---|---|---|"]  # fmt: skip
        lines += [f"| {k} | {v} | {disk_slopes.get(k)} |" for k, v in disks.items()]
    refused = summary.get("bad_rows") or {}
    if refused:
        lines += ["", "## Rows refused at publish", ""]
        for source, rows in refused.items():
            lines += [f"- `{source}` {where}: {reason}" for where, reason in rows]
    lines += ["", "<details><summary>Every figure of the run</summary>", "",
              "| figure | value |", "|---|---|"]  # fmt: skip
    lines += [f"| {k} | {v} |" for k, v in summary.items()
              if not isinstance(v, dict) and not (isinstance(v, list) and len(v) > 12)]  # fmt: skip
    lines += ["", "</details>", "", f"Plots: `{plot.name}`. Logs of every process: `logs/`."]
    path = out / "report.md"
    path.write_text("\n".join(lines) + "\n")
    return path
