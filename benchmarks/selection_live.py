"""The main job (`rlstream run`, every default) with the PPM sampler against uniform, back to
back on this machine for each seed: what predictive selection buys in the live loop, where
the scheduler's scoring competes with the rollout workers and the trainer for the same cores.

    python benchmarks/selection_live.py --seeds 0,1,2 [--set NAME=VALUE ...] [--out DIR]

Per run: RL wall clock to the run's own 90% mark (from the evaluation that opened RL until
held-out greedy accuracy first reached the start plus 90% of the run's gain), the whole run's
wall clock, accuracy before and after RL, the trainer's idle share, scoring's compute against
the rollouts' (`selection_compute_share`) and the scheduler's share of the cores. Each run's
summary goes to OUT/<sampler>-<seed>.json; the table and the medians to
benchmarks/results/selection-live.json.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks/results/selection-live.json"
FIGURES = ("rl_s_to_90pct_mark", "wall_s", "pretrain_accuracy", "final_accuracy",
           "trainer_idle_share", "selection_compute_share", "scheduler_cpu_share")  # fmt: skip


def run(sampler: str, seed: int, out: Path, sets: list[str]) -> dict:
    summary = out / f"{sampler}-{seed}.json"
    args = [
        sys.executable,
        "-m",
        "rlstream.cli",
        "run",
        "--seed",
        str(seed),
        "--sampler",
        sampler,
        "--run-id",
        f"live-{sampler}-{seed}",
        "--out",
        str(out),
        "--summary",
        str(summary),
    ]
    for s in sets:
        args += ["--set", s]
    env = os.environ | {"CI": "true", "RLSTREAM_HOME": str(out / "home")}
    with open(out / f"{sampler}-{seed}.log", "w") as log:
        subprocess.run(args, cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT, check=True)
    s = json.loads(summary.read_text())
    s["scheduler_cpu_share"] = s.get("cpu_share_of_cores_rl", {}).get("scheduler")
    return {k: s.get(k) for k in FIGURES}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", default="0,1,2")
    parser.add_argument("--samplers", default="uniform,ppm")
    parser.add_argument("--set", action="append", default=[], dest="sets")
    parser.add_argument("--out", type=Path, default=None)
    parser.add_argument("--results", type=Path, default=RESULTS)
    a = parser.parse_args()
    out = a.out or Path(tempfile.mkdtemp(prefix="selection-live-"))
    out.mkdir(parents=True, exist_ok=True)
    samplers, rows = a.samplers.split(","), []
    for seed in (int(s) for s in a.seeds.split(",")):
        for sampler in samplers:  # back to back: the same machine state for both
            rows.append({"sampler": sampler, "seed": seed, **run(sampler, seed, out, a.sets)})
            print(json.dumps(rows[-1]), flush=True)
    print("\n| sampler | " + " | ".join(FIGURES) + " |")
    print("|---|" + "---|" * len(FIGURES))
    medians = {}
    for sampler in samplers:
        mine = [r for r in rows if r["sampler"] == sampler]
        medians[sampler] = {}
        cells = []
        for k in FIGURES:
            v = [r[k] for r in mine if r[k] is not None]
            med = float(np.median(v)) if v else None
            medians[sampler][k] = med
            cells.append("-" if med is None else f"{med:.3g} [{min(v):.3g}, {max(v):.3g}]")
        print(f"| {sampler} (median [min, max], {len(mine)} seeds) | " + " | ".join(cells) + " |")
    a.results.write_text(json.dumps({"runs": rows, "medians": medians, "sets": a.sets}, indent=2))
    print(f"\nruns and medians: {a.results}; logs and summaries: {out}")


if __name__ == "__main__":
    main()
