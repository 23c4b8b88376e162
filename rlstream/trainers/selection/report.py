"""What `bench selection` shows and writes: a live progress bar, tables, Parquet, plots, JSON."""

from __future__ import annotations

import json
import math
import sys
import time
from dataclasses import asdict
from pathlib import Path

from rich.console import Console
from rich.table import Table

from rlstream.trainers.checkpoint import from_bytes, to_bytes
from rlstream.trainers.selection import metrics as M


class Live:
    """Rich progress with one bar per phase and live figures of the running arm."""

    def __init__(self, a):
        from rich.progress import (
            BarColumn,
            MofNCompleteColumn,
            Progress,
            TextColumn,
            TimeElapsedColumn,
        )

        self.a = a
        self.progress = Progress(
            TextColumn("{task.description:<22}"),
            BarColumn(),
            MofNCompleteColumn(),
            TimeElapsedColumn(),
            TextColumn("{task.fields[info]}"),
            disable=not a.progress,
        )
        self.bars: dict[str, int] = {}
        self.t0 = time.time()
        # without a terminal (a log file, CI, --no-progress) a plain line every PLAIN_EVERY_S
        self.plain = not (a.progress and self.progress.console.is_terminal)
        self.printed_at = 0.0

    PLAIN_EVERY_S = 10.0

    def line(self, text: str) -> None:
        """A plain progress line, at most every PLAIN_EVERY_S, when there is no live bar."""
        if self.plain and time.time() - self.printed_at >= self.PLAIN_EVERY_S:
            self.printed_at = time.time()
            print(f"[{time.time() - self.t0:6.0f} s] {text}", flush=True)

    def __enter__(self):
        self.progress.__enter__()
        return self

    def __exit__(self, *exc):
        return self.progress.__exit__(*exc)

    def status(self, phase: str):
        def cb(step, total=None):
            if isinstance(step, dict):  # a loop row (late warm-up)
                step, total = step["step"], self.a.late_warmup
            if phase not in self.bars:
                self.bars[phase] = self.progress.add_task(phase, total=total, info="")
            self.progress.update(self.bars[phase], completed=step)
            self.line(f"{phase}: step {step}" + (f"/{total}" if total else ""))

        return cb

    def done(self, pool: str, res) -> None:
        """One line per finished arm (what a log file of a non-terminal run shows)."""
        r = res.rows[-1]
        self.progress.console.print(
            f"[{time.time() - self.t0:6.0f} s] {pool} {res.sampler} seed {res.seed}: "
            f"greedy {r.get('greedy', float('nan')):.3f}, rollouts {r['rollouts']}, "
            f"wasted {r['wasted'] / max(1, r['rollouts']):.2f}",
            soft_wrap=True,  # a log file keeps the whole line (a pipe's console is 80 wide)
        )

    def arm(self, pool: str, sampler: str, seed: int):
        a = self.a
        total = len(a.sampler_names) * a.seeds * a.steps
        if pool not in self.bars:
            self.bars[pool] = self.progress.add_task(f"RL {pool} pool", total=total, info="")
        bar, last = self.bars[pool], {}

        def cb(row: dict) -> None:
            last.update({k: v for k, v in row.items() if k in ("greedy", "pass1")})
            waste = row["wasted"] / max(1, row["rollouts"])
            acc = f"greedy {last['greedy']:.3f}" if "greedy" in last else ""
            info = (
                f"{sampler} s{seed} step {row['step']}  reward {row['reward']:.2f}  "
                f"wasted {waste:.2f}  rollouts {row['rollouts']}  {acc}"
            )
            self.progress.update(bar, advance=1, info=info)
            self.line(f"{pool} pool: {info}")

        return cb


def arm_path(a, pool: str, sampler: str, seed: int) -> Path:
    """Where one arm's JSON lives: out/arms/<pool>_<sampler>_<seed>.json."""
    return Path(a.out) / "arms" / f"{pool}_{sampler}_{seed}.json"


def save_arm(a, pool: str, res) -> Path:
    """One finished arm as JSON (rows, calibration, allocation) under out/arms/: a crash later
    in the run loses nothing measured."""
    path = arm_path(a, pool, res.sampler, res.seed)
    path.parent.mkdir(parents=True, exist_ok=True)
    keep = {k: v for k, v in res.__dict__.items() if k not in ("policy", "ppm_state")}
    path.write_text(json.dumps(keep, default=float))
    if res.ppm_state is not None:  # what a warm arm (`ppm@warm`) starts from
        path.with_suffix(".ppm.pt").write_bytes(to_bytes(res.ppm_state))
    return path


def load_ppm_state(a, pool: str, sampler: str, seed: int) -> dict | None:
    """A saved PPM arm's final PPM state, or None."""
    path = arm_path(a, pool, sampler, seed).with_suffix(".ppm.pt")
    return from_bytes(path.read_bytes()) if path.exists() else None


def load_arm(a, pool: str, sampler: str, seed: int):
    """A saved arm, or None."""
    from rlstream.trainers.selection.loop import ArmResult

    path = arm_path(a, pool, sampler, seed)
    return ArmResult(**json.loads(path.read_text())) if path.exists() else None


def config_dict(a) -> dict:
    """The bench's arguments, and the PPM settings its answer format resolves to (the arms'
    `ppm` arguments are replaced by them: registry.format_tuning)."""
    from rlstream.trainers.selection.registry import format_tuning

    return asdict(a) | {"ppm_format_tuning": format_tuning(a.train)}


def _ms(d: dict, pct: bool = False, sign: bool = False, digits: int = 2) -> str:
    if d is None or d.get("mean") is None:
        return "-"
    m, s = d["mean"], d["std"]
    if pct:
        return f"{m:+.1%} ± {s:.1%}" if sign else f"{m:.1%} ± {s:.1%}"
    if math.isinf(m):
        return "inf"
    return f"{m:+.{digits}f} ± {s:.{digits}f}" if sign else f"{m:.{digits}f} ± {s:.{digits}f}"


def pool_table(name: str, fig: dict, seeds: int) -> Table:
    t = Table(
        title=f"selection bench, pool '{name}': start {fig['start_accuracy']:.1%}, target "
        f"{fig['target_accuracy']:.1%}, uniform zero-variance share "
        f"{fig['uniform_zero_variance_share']['mean']:.2f} "
        f"(first quarter {fig['uniform_zero_variance_share_first_quarter']['mean']:.2f}, "
        f"last {fig['uniform_zero_variance_share_last_quarter']['mean']:.2f}); "
        f"mean ± std over {seeds} seeds"
    )
    cols = [
        "sampler",
        "final acc",
        "Δacc vs uniform",
        "steps→target (reached)",
        "step speedup",
        "rollouts→target",
        "rollout cut vs DAPO",
        "wasted share",
        "Δlatency/step",
        "Δlatency/prompt",
        "selection ms/step",
        "candidates/step",
        "PPM Brier",
        "PPM r",
    ]
    for c in cols:
        t.add_column(c, justify="left" if c == "sampler" else "right")
    for s, f in fig["samplers"].items():
        sel = f["selection_s_per_step"]
        cand = (f.get("candidates_per_step") or {}).get("mean")  # PPM arms, newer runs
        t.add_row(
            s,
            _ms(f["final_accuracy"], pct=True),
            _ms(f["accuracy_change_vs_uniform"], pct=True, sign=True),
            f"{_ms(f['steps_to_target'], digits=1)} ({f['reached_target']})",
            _ms(f["step_speedup_vs_uniform"]),
            _ms(f["rollouts_to_target"], digits=0),
            _ms(f["rollout_reduction_vs_dapo"], pct=True, sign=True),
            _ms(f["wasted_rollout_share"]),
            _ms(f["latency_change_per_step"], pct=True, sign=True),
            _ms(f["latency_change_per_prompt"], pct=True, sign=True),
            "-" if sel["mean"] is None else f"{1000 * sel['mean']:.0f}",
            _ms(f.get("candidates_per_step"), digits=0) if cand else "-",
            _ms(f.get("ppm_brier"), digits=3),
            _ms(f.get("ppm_pearson_r")),
        )
    return t


def final_target_table(name: str, fig: dict) -> Table:
    """Steps and rollouts to uniform's final accuracy (where slow late gains separate)."""
    t = Table(
        title=f"pool '{name}': to uniform's final accuracy "
        f"{fig['uniform_final_target']:.1%} (steps and rollouts: the runs that got there; "
        "speedup and cut: a run that never got there counts its whole budget)"
    )
    for c in ("sampler", "steps (reached)", "step speedup", "rollouts", "rollout cut vs DAPO"):
        t.add_column(c, justify="left" if c == "sampler" else "right")
    for s, f in fig["samplers"].items():
        g = f["to_uniform_final"]
        t.add_row(
            s,
            f"{_ms(g['steps'], digits=1)} ({g['reached']})",
            _ms(g["step_speedup_vs_uniform"]),
            _ms(g["rollouts"], digits=0),
            _ms(g["rollout_reduction_vs_dapo"], pct=True, sign=True),
        )
    return t


def compute_table(name: str, fig: dict) -> Table:
    """Compute to each target, scoring's generations counted with the rollouts'
    (selection/compute.py): what a sampler's predictor costs is charged to it."""
    r = fig["prefill_ratio"]
    t = Table(
        title=f"pool '{name}': compute to target, in decoded-token units (a prefilled token "
        f"= {r['median']:.3f}, measured {r['min']:.3f}-{r['max']:.3f}); thousands"
    )
    cols = ("sampler", "selection / rollout compute", "to target", "speedup vs uniform",
            "to uniform's final", "speedup vs uniform ")  # fmt: skip
    for c in cols:
        t.add_column(c, justify="left" if c == "sampler" else "right")
    for s, f in fig["samplers"].items():
        g = f.get("to_uniform_final") or {}
        t.add_row(
            s,
            _ms(f["selection_compute_share"], pct=True),
            _ms(_scaled(f["compute_to_target"], 1e-3), digits=0),
            _ms(f["compute_speedup_vs_uniform"]),
            _ms(_scaled(g.get("compute"), 1e-3), digits=0),
            _ms(g.get("compute_speedup_vs_uniform")),
        )
    return t


def _scaled(d: dict | None, k: float) -> dict | None:
    if d is None or d.get("mean") is None:
        return d
    return d | {"mean": d["mean"] * k, "std": d["std"] * k}


def family_table(name: str, fig: dict) -> Table:
    fams = list(fig["samplers"]["uniform"]["final_by_family"])
    t = Table(title=f"pool '{name}': final greedy accuracy per family (Δ vs uniform)")
    t.add_column("sampler")
    for f in fams:
        t.add_column(f, justify="right")
    for s, f in fig["samplers"].items():
        t.add_row(
            s,
            *[
                f"{f['final_by_family'][k]:.1%} ({f['family_change_vs_uniform'][k]:+.1%})"
                for k in fams
            ],
        )
    return t


def floors_table(name: str, fig: dict) -> Table:
    t = Table(title=f"pool '{name}': the issue's floors for the PPM sampler")
    for c in ("floor", "value", "bar", "met"):
        t.add_column(c)
    for k, v in fig["floors"].items():
        val = "-" if v["value"] is None else f"{v['value']:.3f}"
        met = "not measurable" if v["met"] is None else "yes" if v["met"] else "[bold red]NO[/]"
        t.add_row(k, val, v["bar"], met)
    return t


def print_tables(summary: dict, seeds: int) -> None:
    con = Console(width=None if sys.stdout.isatty() else 220)  # a log file keeps whole rows
    for name, fig in summary["pools"].items():
        con.print(pool_table(name, fig, seeds))
        if fig.get("target_note"):
            con.print(f"[yellow]{name}: {fig['target_note']}[/]")
        else:
            con.print(final_target_table(name, fig))
        if "prefill_ratio" in fig:
            con.print(compute_table(name, fig))
        con.print(family_table(name, fig))
        if fig["floors"]:
            con.print(floors_table(name, fig))
        ppm = fig["samplers"].get("ppm", {})
        al, pt = ppm.get("allocation"), ppm.get("allocation_point")
        if al:
            con.print(
                f"test-time allocation ({name}, held-out prompts, real PPM, equal budget): "
                f"uniform {_ms(al['uniform_accuracy'], pct=True)}, PPM-guided (its posterior) "
                f"{_ms(al['guided_accuracy'], pct=True)}; compute saved at uniform's accuracy "
                f"{_ms(al['compute_saved'], pct=True)}"
                + (f" (point predictions: {_ms(pt['compute_saved'], pct=True)})" if pt else "")
            )
        wr = ppm.get("ppm_pearson_r_within_family")
        if wr and wr.get("n"):
            con.print(
                f"PPM Pearson r within task families ({name}, final held-out predictions, "
                f"families' means removed): {_ms(wr)}"
            )
        for arm, w in fig.get("warm_start", {}).items():
            e, k = w["early_wasted_rollouts"], w["early_steps"]
            con.print(
                f"warm start ({name}, {arm} from {w['source']}'s final PPM of another seed, "
                f"same seeds): wasted rollouts in the first {k} steps {_ms(e['warm'], digits=0)} "
                f"vs {_ms(e['cold'], digits=0)} cold (saved {_ms(e['saved'], digits=0)}); "
                f"steps to the target {_ms(w['steps_to_target']['warm'])} vs "
                f"{_ms(w['steps_to_target']['cold'])}, rollouts "
                f"{_ms(w['rollouts_to_target']['warm'], digits=0)} vs "
                f"{_ms(w['rollouts_to_target']['cold'], digits=0)}; wasted share "
                f"{_ms(w['wasted_rollout_share']['warm'])} vs "
                f"{_ms(w['wasted_rollout_share']['cold'])}; final "
                f"{_ms(w['final_accuracy']['warm'], pct=True)} vs "
                f"{_ms(w['final_accuracy']['cold'], pct=True)}"
            )
        q = fig["samplers"].get("ppm", {}).get("int8_scoring")
        if q:
            con.print(
                f"INT8 PPM scoring ({name}, final held-out predictions): mean |Δp| "
                f"{_ms(q['mean_abs_change'], digits=4)}, max {_ms(q['max_abs_change'], digits=3)}; "
                f"Pearson r float {_ms(q['pearson_r_float'])} vs INT8 {_ms(q['pearson_r_int8'])}"
            )


def write_parquet(results: dict, path: Path) -> Path:
    import pyarrow as pa
    import pyarrow.parquet as pq

    rows = []
    for pool, runs in results.items():
        for sampler, rs in runs.items():
            for r in rs:
                rows += [{"pool": pool, "sampler": sampler, "seed": r.seed} | x for x in r.rows]
    keys = list(dict.fromkeys(k for r in rows for k in r))
    table = pa.Table.from_pylist([{k: r.get(k) for k in keys} for r in rows])
    pq.write_table(table, path)
    return path


def plot_pool(name: str, runs: dict, fig: dict, path: Path) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    f, ax = plt.subplots(1, 2, figsize=(12, 4.5))
    for sampler, rs in runs.items():
        ev = [M.evals(r.rows) for r in rs]
        n = min(len(e) for e in ev)
        acc = np.array([[x["greedy"] for x in e[:n]] for e in ev])
        steps = [x["step"] for x in ev[0][:n]]
        roll = np.array([[x["rollouts"] for x in e[:n]] for e in ev]).mean(0)
        (line,) = ax[0].plot(steps, acc.mean(0), "o-", ms=3, label=sampler)
        ax[0].fill_between(steps, acc.min(0), acc.max(0), color=line.get_color(), alpha=0.15)
        ax[1].plot(roll, acc.mean(0), "o-", ms=3, label=sampler, color=line.get_color())
    for a_, xl in zip(ax, ("RL step", "rollouts spent (cumulative)"), strict=True):
        a_.axhline(fig["target_accuracy"], ls="--", c="grey", lw=0.8, label="target")
        a_.set_xlabel(xl), a_.set_ylabel("held-out greedy accuracy"), a_.legend(fontsize=8)
    ax[0].set_title(f"{name} pool: accuracy vs steps (mean, min-max band)")
    ax[1].set_title(f"{name} pool: accuracy vs rollouts")
    f.tight_layout()
    f.savefig(path, dpi=110)
    plt.close(f)
    return path


def write(a, results: dict, summary: dict) -> None:
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    write_parquet(results, out / "records.parquet")
    for name, runs in results.items():
        plot_pool(name, runs, summary["pools"][name], out / f"accuracy_{name}.png")
    text = json.dumps(summary, indent=2, default=float)
    (out / "summary.json").write_text(text)
    if a.summary:
        Path(a.summary).parent.mkdir(parents=True, exist_ok=True)
        Path(a.summary).write_text(text)
    print_tables(summary, a.seeds)  # --no-progress drops the live bar, never the results
    print(f"records, plots and summary.json: {out}")
