"""The benchmark's figures as pure functions of the per-step records (RESEARCH.md's table).

Records are dicts with at least step, rollouts, wasted, and `greedy` on evaluation rows.
- steps/rollouts to target: the first evaluation at or above the target, linearly interpolated
  with the evaluation before it (None when never reached);
- step speedup: uniform's mean steps to target / the sampler's mean (a ratio of means over
  seeds, spread by bootstrap);
- rollout cost reduction: 1 - the sampler's mean rollouts to target / DAPO's mean;
- wasted-rollout share: wasted / rollouts at the end of the run;
- latency per step and per trained prompt (selection + sampling + update seconds).
A seed that never reaches the target is scored at the run's end (the most optimistic bound for
it, on either side of a ratio) and counted in `reached`, so a miss is visible, not dropped.
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


def smoothed(rows: list[dict], k: int = 3) -> list[dict]:
    """The evaluation rows with `greedy` replaced by its trailing mean over the last k
    evaluations (fewer at the start): a first crossing of a target the curve approaches
    slowly is otherwise decided by one evaluation's noise.

    >>> [r["greedy"] for r in smoothed([{"greedy": g} for g in (0.0, 0.3, 0.6, 0.9)])]
    [0.0, 0.15, 0.3, 0.6]
    """
    ev = evals(rows)
    g = [r["greedy"] for r in ev]
    return [r | {"greedy": float(np.mean(g[max(0, i - k + 1) : i + 1]))} for i, r in enumerate(ev)]


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


def cost_to_target(rows: list[dict], target: float, key: str) -> tuple[float, bool]:
    """(`key` at the target, reached); a run that misses is scored at its end."""
    x = to_target(rows, target, key)
    return (x, True) if x is not None else (float(rows[-1][key]), False)


def with_compute(rows: list[dict], prefill_ratio: float) -> list[dict]:
    """The rows with cumulative `compute` (the rollouts' and scoring's tokens, in decoded-token
    units: a prefilled token costs `prefill_ratio`), `rollout_compute` and `selection_compute`
    (selection/compute.py). Rows of an arm saved before tokens were counted stay as they are.

    >>> r = with_compute([{"step": 1, "rollout_decoded": 100, "rollout_prefilled": 50,
    ...                    "select_decoded": 0, "select_prefilled": 40}], 0.25)[0]
    >>> r["rollout_compute"], r["selection_compute"], r["compute"]
    (112.5, 10.0, 122.5)
    """
    if not rows or "rollout_decoded" not in rows[-1]:
        return rows
    out = []
    for r in rows:
        roll = r.get("rollout_decoded", 0) + prefill_ratio * r.get("rollout_prefilled", 0)
        sel = r.get("select_decoded", 0) + prefill_ratio * r.get("select_prefilled", 0)
        out.append(r | {"rollout_compute": roll, "selection_compute": sel, "compute": roll + sel})
    return out


def selection_share(rows: list[dict]) -> float | None:
    """Scoring's compute over the rollouts' by the end of the run (None: not counted)."""
    last = rows[-1]
    if "compute" not in last or not last["rollout_compute"]:
        return None
    return last["selection_compute"] / last["rollout_compute"]


def ratio_of_means(num: list[float], den: list[float], boots: int = 2000, seed: int = 0) -> dict:
    """mean(num) / mean(den) as {'mean', 'std', 'n'}; std from a bootstrap that resamples the
    seeds of each side independently (a ratio of means, not a mean of per-seed ratios, which
    is biased upwards: uniform against itself would score above 1).

    >>> ratio_of_means([4.0, 6.0], [2.0, 3.0])["mean"]
    2.0
    """
    num, den = np.asarray(num, float), np.asarray(den, float)
    if not len(num) or not len(den) or den.mean() <= 0:
        return {"mean": None, "std": None, "n": 0}
    rng = np.random.default_rng(seed)
    bn = num[rng.integers(0, len(num), (boots, len(num)))].mean(1)
    bd = den[rng.integers(0, len(den), (boots, len(den)))].mean(1)
    ok = bd > 0
    return {
        "mean": float(num.mean() / den.mean()),
        "std": float(np.std(bn[ok] / bd[ok], ddof=1)),
        "n": int(len(num)),
    }


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


def spent_by(rows: list[dict], step: int) -> dict:
    """The row of `step` (the last one, for a shorter run): cumulative rollouts and waste."""
    steps = [r for r in rows if r["step"] > 0]
    return next((r for r in steps if r["step"] == step), steps[-1])


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
    return sorted(final(rows)["greedy_by_task"])
