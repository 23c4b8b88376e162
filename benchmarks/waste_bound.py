"""How low can the wasted-rollout share go, and what keeps the PPM sampler above it?

Reads the PPM arms a `rlstream bench selection` run saved (`OUT/arms/*ppm*.json`): at the last
step each holds the predictor's pass-rate predictions for the held-out prompts (never rolled
out) and their observed pass rates from k samples of the final policy. On those prompts it
replays one step's choice many times — B picks from C random candidates — and measures the
expected zero-variance share of a group of G, P(all G rewards equal) = p^G + (1-p)^G, with the
unbiased estimate from s successes in k samples, [C(s, G) + C(k - s, G)] / C(k, G):

- uniform: B random prompts;
- oracle: the B candidates with the lowest estimate. Choosing on the same noisy estimate it is
  scored on makes it optimistic (E[min] <= min E), so it is a lower bound for any selection
  rule from C candidates: if it sat above 0.5x of uniform, no predictor could meet issue 13's
  wasted-share floor on that pool;
- the predictor's picks, ranked as the PPM sampler ranks them: P(informative | theta) x
  (1 - theta)^tilt with theta the prediction (greedy), one draw from its Beta of the
  sampler's prior strength (Thompson, `selection.ppm_acquisition=thompson`) or its
  expectation under that Beta (E, the default `expected`), for tilt 0 and 2
  (`selection.ppm_hard_tilt`). The strength is the one the arm saved: per prompt (its
  family's fitted strength) in arms run with `selection.ppm_prior=fit`.

    python benchmarks/waste_bound.py benchmarks/results/arms/selection-cot-late/arms/late_ppm_?.json

The final policy's held-out prompts stand for the pool late in the arm; the live sampler also
has each prompt's own outcomes, which this replay does not.
"""

from __future__ import annotations

import argparse
import json
from math import comb
from pathlib import Path

import numpy as np

from rlstream.trainers.selection.predictive import expected_informativeness, informativeness


def zero_variance(successes: np.ndarray, k: int, g: int) -> np.ndarray:
    """Unbiased estimates of p^g + (1-p)^g from `successes` of k samples (k >= g)."""
    return np.array([(comb(int(s), g) + comb(k - int(s), g)) / comb(k, g) for s in successes])


def replay(pred, z, strength, rng, g, b, c, tilt=None, mode="greedy", trials=1000) -> float:
    """Mean zero-variance share of the B picks (groups of g) over `trials` random candidate
    pools of C; tilt None: the oracle (lowest z), else the predictor's ranking (mode greedy,
    thompson or expected)."""
    shares = []
    for _ in range(trials):
        cand = rng.choice(len(z), min(c, len(z)), replace=False)
        if tilt is None:
            pick = cand[np.argsort(z[cand])[:b]]
        else:
            mu = pred[cand]
            k = strength[cand] if np.ndim(strength) else strength  # per prompt, or one for all
            alpha, beta = k * mu + 1e-3, k * (1 - mu) + 1e-3
            if mode == "expected":
                value = expected_informativeness(alpha, beta, g, tilt)
            else:
                theta = rng.beta(alpha, beta) if mode == "thompson" else mu
                value = informativeness(theta, g) * (1 - theta) ** tilt  # the sampler's ranking
            pick = cand[np.argsort(-value)[:b]]
        shares.append(z[pick].mean())
    return float(np.mean(shares))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("arms", nargs="+", type=Path, help="PPM arm JSON files (OUT/arms/...)")
    ap.add_argument("--group", type=int, default=8, help="G, completions per prompt")
    ap.add_argument("--batch", type=int, default=32, help="B, prompts per step")
    ap.add_argument("--candidates", type=int, default=128, help="C, candidates per pick")
    ap.add_argument("--out", type=Path, help="write the figures as JSON here")
    a = ap.parse_args()
    modes = {"greedy": "", "thompson": " TS", "expected": " E"}
    cols = ["uniform", "oracle"] + [f"tilt {t}{m}" for t in (0, 2) for m in modes.values()]
    print(f"zero-variance share of a group of {a.group}, {a.batch} picks from {a.candidates} "
          "candidates, as a ratio of uniform's")  # fmt: skip
    print(f"{'arm':34}" + "".join(f"{c:>11}" for c in cols))
    figures = {}
    for path in a.arms:
        alloc = json.loads(path.read_text())["allocation"]
        k = alloc["k"]
        pred = np.clip(np.array(alloc["pred"]), 0, 1)
        z = zero_variance(np.rint(np.array(alloc["observed"]) * k), k, a.group)
        rng = np.random.default_rng(0)
        row = {"uniform": float(z.mean())}
        row["oracle"] = replay(pred, z, 0, rng, a.group, a.batch, a.candidates)
        strength = np.asarray(alloc["strength"])
        for tilt in (0, 2):
            for mode, tag in modes.items():
                row[f"tilt {tilt}{tag}"] = replay(
                    pred, z, strength, rng, a.group, a.batch, a.candidates, tilt, mode
                )
        figures[path.stem] = row
        ratios = [row[c] / row["uniform"] for c in cols]
        print(
            f"{path.stem:34}{row['uniform']:>11.3f}" + "".join(f"{r:>10.2f}x" for r in ratios[1:])
        )
    if a.out:
        a.out.write_text(json.dumps(figures, indent=1))


if __name__ == "__main__":
    main()
