"""Trainer ranks: one against two, on this machine.

    python benchmarks/trainer_ranks.py [--seeds 3] [--steps 40] [--repeats 3] [--updates 12]
        [--set NAME=VALUE ...] [--loop-only] [--out FILE]

1. Update throughput: the same RL batches (8 groups of 4) trained by 1 process and by 2 gloo
   ranks (`loop.trainer_ranks`' update path), `--repeats` times each: seconds per update,
   response tokens per second, and per rank. On 2 cores two ranks share the cores the one used.
2. The live loop: `rlstream run` with trainer_ranks 1 and 2 at the same global batch, seeds
   0..N-1 (run-to-run spread): final greedy accuracy and pass@1, wall time, trainer idle share.

Prints tables; writes benchmarks/results/trainer-ranks.json.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch
import torch.multiprocessing as mp

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from rlstream.config import load_config  # noqa: E402
from rlstream.trainers.core import TrainState, follow, rl_update  # noqa: E402
from rlstream.trainers.ranks import INIT_ENV, WORLD_ENV, Ranks  # noqa: E402
from rlstream.trainers.rl import Experience  # noqa: E402

SETTINGS = ["model.backend=torch", "model.threads=1"]
SMALL = ["pretrain.max_steps=60", "pretrain.batch=32", "pretrain.warmup_steps=20",
         "corpus_docs=3000", "pool_size=500", "eval.prompts=32", "eval.interval=4",
         "prompts_per_step=8", "group_size=4"]  # fmt: skip


def _batches(state: TrainState, n: int) -> list[Experience]:
    import random

    rng, vocab = random.Random(0), state.tok.vocab_size
    out = []
    for step in range(n):
        prompts = [[rng.randrange(vocab) for _ in range(12)] for _ in range(32)]
        completions = [[rng.randrange(vocab) for _ in range(8)] for _ in prompts]
        out.append(Experience(prompts, completions, [[-2.0] * 8 for _ in prompts],
                              [float(rng.random() < 0.5) for _ in prompts],
                              [f"g{step}-{i // 4}" for i in range(32)], [step] * 32))  # fmt: skip
    return out


def _lead(state: TrainState, updates: int) -> tuple[float, int]:
    state.start_rl()
    batches = _batches(state, updates + 2)
    for exp in batches[:2]:  # warm-up
        rl_update(state, exp)
    started, tokens = time.perf_counter(), 0
    for exp in batches[2:]:
        tokens += rl_update(state, exp)["tokens"]
    return time.perf_counter() - started, tokens


def _rank(rank: int, world: int, init: str, updates: int, out: str) -> None:
    os.environ.update({WORLD_ENV: str(world), INIT_ENV: init})
    state = TrainState(load_config(None, SETTINGS), threads=1)
    ranks = Ranks.from_env(rank)
    state.join(ranks)
    if ranks.leader:
        seconds, tokens = _lead(state, updates)
        ranks.send(("stop",))
        Path(out).write_text(json.dumps({"seconds": seconds, "tokens": tokens}))
    else:
        follow(state, ranks)
    ranks.close()


def update_throughput(repeats: int, updates: int) -> list[dict]:
    rows = []
    for world in (1, 2):
        runs = []
        for _ in range(repeats):
            with tempfile.TemporaryDirectory() as tmp:
                out = f"{tmp}/lead.json"
                if world == 1:
                    seconds, tokens = _lead(TrainState(load_config(None, SETTINGS), 1), updates)
                else:
                    init = f"file://{tmp}/rendezvous"
                    mp.spawn(_rank, args=(world, init, updates, out), nprocs=world, join=True)
                    figures = json.loads(Path(out).read_text())
                    seconds, tokens = figures["seconds"], figures["tokens"]
            runs.append((seconds / updates, tokens / seconds))
        per_update = [r[0] for r in runs]
        rate = [r[1] for r in runs]
        rows.append({"ranks": world, "s_per_update_median": statistics.median(per_update),
                     "s_per_update_spread": max(per_update) - min(per_update),
                     "tokens_per_s": statistics.median(rate),
                     "tokens_per_s_per_rank": statistics.median(rate) / world})  # fmt: skip
    return rows


def live_loop(seeds: int, steps: int, extra: list[str]) -> list[dict]:
    rows = []
    for seed in range(seeds):
        for world in (1, 2):
            with tempfile.TemporaryDirectory() as tmp:
                summary = Path(tmp) / "summary.json"
                sets = [*SMALL, *extra, f"seed={seed}", f"loop.trainer_ranks={world}"]
                cmd = [sys.executable, "-m", "rlstream.cli", "run", "--rl-steps", str(steps),
                       "--run-id", f"ranks-{world}-s{seed}", "--out", tmp, "--summary",
                       str(summary), *[a for s in sets for a in ("--set", s)]]  # fmt: skip
                print(f"  seed {seed}, {world} rank(s) ...", flush=True)
                subprocess.run(cmd, cwd=ROOT, check=True, stdout=subprocess.DEVNULL)
                f = json.loads(summary.read_text())
            rows.append({"seed": seed, "ranks": world, "final_accuracy": f["final_accuracy"],
                         "final_pass1": f["final_pass1"], "wall_s": f["wall_s"],
                         "trainer_idle_share": f["trainer_idle_share"],
                         "stale_dropped": f["stale_dropped"]})  # fmt: skip
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--seeds", type=int, default=3)
    ap.add_argument("--steps", type=int, default=40)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--updates", type=int, default=12)
    ap.add_argument("--set", action="append", default=[], dest="sets",
                    help="a setting of the live-loop runs, over the small defaults")  # fmt: skip
    ap.add_argument("--loop-only", action="store_true", help="skip the update throughput")
    ap.add_argument("--out", type=Path, default=ROOT / "benchmarks/results/trainer-ranks.json")
    args = ap.parse_args()
    torch.set_num_threads(1)
    print(f"update throughput ({args.repeats} repeats x {args.updates} updates, 8 groups of 4)")
    speed = [] if args.loop_only else update_throughput(args.repeats, args.updates)
    print("| ranks | s/update (median) | spread | tokens/s | tokens/s per rank |")
    print("|---|---|---|---|---|")
    for r in speed:
        print(f"| {r['ranks']} | {r['s_per_update_median']:.3f} | {r['s_per_update_spread']:.3f} "
              f"| {r['tokens_per_s']:.0f} | {r['tokens_per_s_per_rank']:.0f} |")  # fmt: skip
    if speed:
        ratio = speed[1]["tokens_per_s"] / speed[0]["tokens_per_s"]
        print(f"2 ranks / 1 rank, tokens/s: {ratio:.2f}x")
    print(f"live loop ({args.seeds} seeds x {args.steps} RL steps; {' '.join(args.sets)})")
    loop = live_loop(args.seeds, args.steps, args.sets)
    print("| seed | ranks | final greedy | final pass@1 | wall s | trainer idle | stale dropped |")
    print("|---|---|---|---|---|---|---|")
    for r in loop:
        print(f"| {r['seed']} | {r['ranks']} | {r['final_accuracy']:.3f} | "
              f"{r['final_pass1']:.3f} | {r['wall_s']:.1f} | {r['trainer_idle_share']:.2f} | "
              f"{r['stale_dropped']} |")  # fmt: skip
    for world in (1, 2):
        acc = [r["final_accuracy"] for r in loop if r["ranks"] == world]
        wall = [r["wall_s"] for r in loop if r["ranks"] == world]
        spread = f"[{min(acc):.3f}, {max(acc):.3f}]"
        print(f"{world} rank(s): greedy {statistics.median(acc):.3f} {spread}, "
              f"wall {statistics.median(wall):.1f} s")  # fmt: skip
    figures = {"update_throughput": speed, "live_loop": loop, "settings": SMALL + args.sets}
    args.out.write_text(json.dumps(figures, indent=2))
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
