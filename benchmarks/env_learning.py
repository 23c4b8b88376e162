"""Does each built-in environment (and the code family) learn in `rlstream run` on the default
preset? One live run per arm on the embedded stack, back to back on this machine: held-out
greedy success before RL (the pre-trained start) and after, and pass@1. The calculator arm runs
twice, with the tool and without it (`env.options={"tool": false}`: the same model, task and
budget, every call answered `no tool`).

    .venv/bin/python benchmarks/env_learning.py [--rl-steps 30] [--arms calc,calc-no-tool,...]

Writes benchmarks/results/env-learning.json (an arm run again replaces its row, the others
are kept) and prints a table. Each arm is one seed (0); the
runs take ~5-8 minutes each on 2 cores.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ARMS = {
    "calc": ["--set", "data.tasks=calc"],
    "calc-no-tool": ["--set", "data.tasks=calc", "--set", 'env.options={"tool": false}'],
    "guess": ["--set", "data.tasks=guess@1", "--set", "env.max_turns=6"],
    "walk": [
        "--set",
        "data.tasks=walk",
        "--set",
        "selection.curriculum=0.6",
        "--set",
        "model.block_size=48",
        "--set",
        "env.max_turns=9",
    ],
    "python": [
        "--set",
        "data.tasks=pymul",
        "--set",
        "model.block_size=48",
        "--set",
        "rl.max_new_tokens=16",
    ],  # a turn as long as !print(123*45)
    "fn": ["--set", "data.tasks=fn"],
}
COMMON = ["--sampler", "uniform", "--set", "eval.prompts=64", "--set", "eval.interval=10"]
RESULTS = Path(__file__).parent / "results" / "env-learning.json"


def run_arm(name: str, rl_steps: int, out: Path) -> dict:
    summary = out / f"{name}.json"
    argv = [sys.executable, "-m", "rlstream.cli", "run", "--run-id", f"learn-{name}",
            "--rl-steps", str(rl_steps), "--out", str(out), "--summary", str(summary),
            *COMMON, *ARMS[name]]  # fmt: skip
    started = time.monotonic()
    done = subprocess.run(argv, capture_output=True, text=True)
    if done.returncode != 0:
        tail = done.stdout[-2000:] + done.stderr[-2000:]
        raise SystemExit(f"{name}: rlstream run failed:\n{tail}")
    s = json.loads(summary.read_text())
    return {
        "arm": name,
        "pretrain_greedy": s["pretrain_accuracy"],
        "final_greedy": s["final_accuracy"],
        "gain_points": round(100 * (s["final_accuracy"] - s["pretrain_accuracy"]), 1),
        "pretrain_pass1": s["pretrain_pass1"],
        "final_pass1": s["final_pass1"],
        "pretrain_steps": s["pretrain_steps"],
        "rl_steps": s["rl_steps"],
        "env_failed_groups": s.get("env_failed_groups", 0),
        "wall_s": round(time.monotonic() - started, 1),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rl-steps", type=int, default=30)
    parser.add_argument("--arms", default=",".join(ARMS))
    args = parser.parse_args()
    rows = []
    with tempfile.TemporaryDirectory(prefix="env-learning-") as tmp:
        for name in args.arms.split(","):
            rows.append(run_arm(name, args.rl_steps, Path(tmp)))
            print(json.dumps(rows[-1]), flush=True)
    kept = json.loads(RESULTS.read_text())["arms"] if RESULTS.exists() else []
    ran = {r["arm"] for r in rows}
    rows = [r for r in kept if r["arm"] not in ran and r.get("rl_steps") == args.rl_steps] + rows
    RESULTS.write_text(json.dumps({"rl_steps": args.rl_steps, "seed": 0, "arms": rows},
                                  indent=2) + "\n")  # fmt: skip
    print("\n| arm | held-out greedy: start -> after RL | gain | pass@1 | wall |")
    print("|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['arm']} | {r['pretrain_greedy']:.1%} -> {r['final_greedy']:.1%} | "
              f"{r['gain_points']:+.1f} points | {r['pretrain_pass1']:.1%} -> "
              f"{r['final_pass1']:.1%} | {r['wall_s']:.0f} s |")  # fmt: skip


if __name__ == "__main__":
    main()
