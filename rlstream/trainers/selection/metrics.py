"""The benchmark's figures as pure functions of the per-step records (RESEARCH.md's table).

Records are dicts with at least step, rollouts, wasted, and `greedy` on evaluation rows.
- steps/rollouts to target: the first evaluation at or above the target, linearly interpolated
  with the evaluation before it (None when never reached);
- step speedup of a seed: mean over the baseline's seeds of its steps to target / this seed's;
- rollout cost reduction of a seed: 1 - its rollouts to target / the baseline's mean;
- wasted-rollout share: wasted / rollouts at the end of the run;
- latency per step and per trained prompt (selection + sampling + update seconds).
A seed that never reaches the target is scored at the run's end (the most optimistic bound for
it) and counted in `reached`, so a miss is visible rather than dropped.
"""

from __future__ import annotations

import math

import numpy as np


def mean_std(xs) -> dict:
    """{'mean', 'std', 'n'} over the finite values (std: sample std, 0 for one value)."""
    v = [float(x) for x in xs if x is not None and math.isfinite(float(x))]
    if not v:
        return {"mean": None, "std": None, "n": 0}
    return {
        "mean": float(np.mean(v)),
        "std": float(np.std(v, ddof=1)) if len(v) > 1 else 0.0,
        "n": len(v),
    }


def evals(rows: list[dict]) -> list[dict]:
    return [r for r in rows if "greedy" in r]


def to_target(rows: list[dict], target: float, key: str = "step") -> float | None:
    """`key` (step or rollouts) at which held-out greedy accuracy first reaches target."""
    prev = None
    for r in evals(rows):
        if r["greedy"] >= target:
            if prev is None or r["greedy"] == prev["greedy"]:
                return float(r[key])
            f = (target - prev["greedy"]) / (r["greedy"] - prev["greedy"])
            return float(prev[key] + f * (r[key] - prev[key]))
        prev = r
    return None


def ratio_to_baseline(
    runs: list[list[dict]], base: list[list[dict]], target: float, key: str
) -> tuple[list[float], int, float | None]:
    """Per-seed (baseline mean `key` to target) / (this seed's); seeds that miss use their end.

    Returns (ratios, seeds that reached, the baseline's mean)."""
    b = [to_target(r, target, key) for r in base]
    b = [x for x in b if x is not None]
    if not b:
        return [], 0, None
    bm = float(np.mean(b))
    if bm <= 0:  # the baseline starts at the target: nothing to speed up
        return [], 0, None
    out, reached = [], 0
    for r in runs:
        x = to_target(r, target, key)
        reached += x is not None
        x = x if x is not None else float(r[-1][key])
        out.append(bm / x if x > 0 else math.inf)
    return out, reached, bm


def wasted_share(rows: list[dict]) -> float:
    last = rows[-1]
    return last["wasted"] / last["rollouts"] if last["rollouts"] else 0.0


def phase_wasted_share(rows: list[dict], lo: float, hi: float) -> float:
    """Wasted share of the rollouts spent between fractions lo and hi of the run's steps."""
    steps = [r for r in rows if r["step"] > 0]
    n = len(steps)
    a, b = int(lo * n), max(int(lo * n) + 1, int(hi * n))
    before = steps[a - 1] if a > 0 else {"rollouts": 0, "wasted": 0}
    end = steps[b - 1]
    spent = end["rollouts"] - before["rollouts"]
    return (end["wasted"] - before["wasted"]) / spent if spent else 0.0


def latency(rows: list[dict]) -> dict:
    """Mean seconds per step and per trained prompt; selection share of the step."""
    steps = [r for r in rows if r["step"] > 0]
    sel = sum(r["t_select"] for r in steps)
    tot = sel + sum(r["t_sample"] + r["t_update"] for r in steps)
    prompts = sum(r["n_trained"] for r in steps)
    return {
        "per_step_s": tot / len(steps),
        "per_prompt_s": tot / max(1, prompts),
        "selection_s_per_step": sel / len(steps),
    }


def final(rows: list[dict]) -> dict:
    return evals(rows)[-1]


def families(rows: list[dict]) -> list[str]:
    return sorted(k.removeprefix("greedy_") for k in final(rows) if k.startswith("greedy_"))
