"""The selection benchmark's figures from its arms: per pool and sampler, against uniform; warm
starts against cold ones; the PPM's calibration and ranking; the floors a sampler must hold."""

from __future__ import annotations

import numpy as np

from rlstream.trainers.selection import metrics as M
from rlstream.trainers.selection.allocation import compare_allocations
from rlstream.trainers.selection.ppm import calibration, pearson_r

WARM = "@warm"


EARLY_STEPS = 5
"""the first steps, where a cold PPM knows nothing yet: the warm start's saving is measured here"""


def warm_source(name: str) -> str | None:
    """The cold arm a `<arm>@warm` arm starts from ('ppm@warm' -> 'ppm'), None for others."""
    return name[: -len(WARM)] if name.endswith(WARM) else None


# Issue 13's floors for the reference-free PPM (the GPS paper's figures are the bar to beat)
FLOORS = {
    "step_speedup_vs_uniform": 1.3,  # GPS: 2.0x
    "rollout_reduction_vs_dapo": 0.40,  # GPS: 69%
    "wasted_share_vs_uniform": 0.5,  # at most this share of uniform's
    "ppm_pearson_r": 0.7,  # on held-out prompts never rolled out
    "worst_family_vs_uniform": -0.03,
    "allocation_compute_saved": 0.25,  # GPS: 36.4%
}


def pool_figures(runs: dict[str, list], a) -> dict:
    """Every figure of one pool from its arms: runs[sampler] = [ArmResult per seed]; `a` the
    bench's BenchArgs."""
    ratios = [r.prefill_ratio["prefill_ratio"] for rs in runs.values() for r in rs
              if r.prefill_ratio]  # fmt: skip
    ratio = float(np.median(ratios)) if ratios else 0.0
    rows = {s: [M.with_compute(r.rows, ratio) for r in rs] for s, rs in runs.items()}
    counted = all("compute" in r[-1] for rs in rows.values() for r in rs)
    uni = rows["uniform"]
    start = float(np.mean([r[0]["greedy"] for r in uni]))
    uni_final = M.mean_std([M.final(r)["greedy"] for r in uni])
    target = a.target_accuracy
    if target is None:
        target = start + a.target_fraction * (uni_final["mean"] - start)
    uni_lat = M.mean_std([M.latency(r)["per_step_s"] for r in uni])["mean"]
    uni_lat_p = M.mean_std([M.latency(r)["per_prompt_s"] for r in uni])["mean"]
    fams = M.families(uni[0])
    uni_fam = {f: np.mean([M.final(r)["greedy_by_task"][f] for r in uni]) for f in fams}
    out = {"start_accuracy": start, "target_accuracy": target, "samplers": {}}
    if counted:
        out["prefill_ratio"] = {"median": ratio, "min": min(ratios), "max": max(ratios)}
    if uni_final["mean"] - start < 0.02 and a.target_accuracy is None:
        out["target_note"] = (
            f"uniform gained {uni_final['mean'] - start:+.3f} over the start within the budget: "
            "steps/rollouts to a target are not measurable on this pool (speedups left empty)"
        )
    out["uniform_zero_variance_share"] = M.mean_std([M.wasted_share(r) for r in uni])
    out["uniform_zero_variance_share_first_quarter"] = M.mean_std(
        [M.phase_wasted_share(r, 0, 0.25) for r in uni]
    )
    out["uniform_zero_variance_share_last_quarter"] = M.mean_std(
        [M.phase_wasted_share(r, 0.75, 1) for r in uni]
    )

    def cost(rs: list, key: str, at: float = target) -> list[float]:
        return [M.cost_to_target(r, at, key)[0] for r in rs]

    # A second target: uniform's own final accuracy. Where every sampler jumps to the first
    # target in a few steps and the curves then climb slowly (the CoT pools), how much sooner
    # a sampler gets to where uniform ends is what separates them. Crossings of the curves'
    # trailing means over 3 evaluations: a slow approach is otherwise crossed by noise.
    final_target = uni_final["mean"]
    out["uniform_final_target"] = final_target

    def to_final(rs: list) -> dict:
        rs = [M.smoothed(r, 3) for r in rs]
        uni = [M.smoothed(r, 3) for r in rows["uniform"]]
        reached = sum(M.cost_to_target(r, final_target, "step")[1] for r in rs)
        f = {
            "steps": M.mean_std([M.to_target(r, final_target, "step") for r in rs]),
            "rollouts": M.mean_std([M.to_target(r, final_target, "rollouts") for r in rs]),
            "reached": f"{reached}/{len(rs)}",
            "step_speedup_vs_uniform": M.ratio_of_means(
                cost(uni, "step", final_target), cost(rs, "step", final_target)
            ),
            "rollout_reduction_vs_dapo": M.mean_std([]),
        }
        if counted:
            f["compute"] = M.mean_std([M.to_target(r, final_target, "compute") for r in rs])
            f["compute_speedup_vs_uniform"] = M.ratio_of_means(
                cost(uni, "compute", final_target), cost(rs, "compute", final_target)
            )
        if "dapo" in rows:
            dapo = [M.smoothed(r, 3) for r in rows["dapo"]]
            r = M.ratio_of_means(
                cost(rs, "rollouts", final_target), cost(dapo, "rollouts", final_target)
            )
            f["rollout_reduction_vs_dapo"] = r | {"mean": 1 - r["mean"]} if r["n"] else r
        return f

    for s, rs in rows.items():
        reached = sum(M.cost_to_target(r, target, "step")[1] for r in rs)
        f = {
            "final_accuracy": M.mean_std([M.final(r)["greedy"] for r in rs]),
            "final_pass1": M.mean_std([M.final(r).get("pass1") for r in rs]),
            "accuracy_change_vs_uniform": M.mean_std(
                [M.final(r)["greedy"] - uni_final["mean"] for r in rs]
            ),
            "steps_to_target": M.mean_std([M.to_target(r, target, "step") for r in rs]),
            "rollouts_to_target": M.mean_std([M.to_target(r, target, "rollouts") for r in rs]),
            "reached_target": f"{reached}/{len(rs)}",
            "step_speedup_vs_uniform": M.ratio_of_means(cost(uni, "step"), cost(rs, "step")),
            "wasted_rollout_share": M.mean_std([M.wasted_share(r) for r in rs]),
            "early_wasted_share": M.mean_std(
                [M.wasted_share([M.spent_by(r, EARLY_STEPS)]) for r in rs]
            ),
            "rollouts_total": M.mean_std([r[-1]["rollouts"] for r in rs]),
            "trained_rollouts_total": M.mean_std([r[-1]["trained_rollouts"] for r in rs]),
            "latency_per_step_s": M.mean_std([M.latency(r)["per_step_s"] for r in rs]),
            "latency_change_per_step": M.mean_std(
                [M.latency(r)["per_step_s"] / uni_lat - 1 for r in rs]
            ),
            "latency_change_per_prompt": M.mean_std(
                [M.latency(r)["per_prompt_s"] / uni_lat_p - 1 for r in rs]
            ),
            "selection_s_per_step": M.mean_std([M.latency(r)["selection_s_per_step"] for r in rs]),
            "candidates_per_step": M.mean_std(
                [float(np.mean([x.get("screened", 0) for x in r[1:]])) for r in rs]
            ),
            "final_by_family": {
                fam: float(np.mean([M.final(r)["greedy_by_task"][fam] for r in rs])) for fam in fams
            },
            "score_records": int(sum(r.score_records for r in runs[s])),
        }
        f["family_change_vs_uniform"] = {k: v - uni_fam[k] for k, v in f["final_by_family"].items()}
        if counted:  # compute: the rollouts' tokens and scoring's (selection/compute.py)
            f["compute_to_target"] = M.mean_std([M.to_target(r, target, "compute") for r in rs])
            f["compute_speedup_vs_uniform"] = M.ratio_of_means(
                cost(uni, "compute"), cost(rs, "compute")
            )
            f["selection_compute_share"] = M.mean_std([M.selection_share(r) for r in rs])
        f["rollout_reduction_vs_dapo"] = M.mean_std([])
        if "dapo" in rows:
            r = M.ratio_of_means(cost(rs, "rollouts"), cost(rows["dapo"], "rollouts"))
            f["rollout_reduction_vs_dapo"] = r | {"mean": 1 - r["mean"]} if r["n"] else r
        f["to_uniform_final"] = to_final(rs)
        if out.get("target_note"):
            for k in ("steps_to_target", "rollouts_to_target", "step_speedup_vs_uniform",
                      "compute_to_target", "compute_speedup_vs_uniform"):  # fmt: skip
                f[k] = M.mean_std([])
            f["rollout_reduction_vs_dapo"] = M.mean_std([])
            f["to_uniform_final"] = {}
        f |= ppm_figures(runs[s], a)
        out["samplers"][s] = f
    out["floors"] = floors(out)
    warm = {s: warm_figures(runs[warm_source(s)], runs[s], out) for s in runs if warm_source(s)}
    if warm:
        out["warm_start"] = warm
    return out


def warm_figures(cold: list, warm: list, pool: dict) -> dict:
    """What a warm start saves: its arms against the cold PPM arm's of the same seeds, over the
    first EARLY_STEPS steps (where the cold PPM is still learning what the warm one knows) and
    to the target."""
    by_seed = {r.seed: r for r in cold}
    pairs = [(by_seed[w.seed].rows, w.rows) for w in warm if w.seed in by_seed]
    early = [(M.spent_by(c, EARLY_STEPS), M.spent_by(w, EARLY_STEPS)) for c, w in pairs]
    fc, fw = pool["samplers"][cold[0].sampler], pool["samplers"][warm[0].sampler]
    compared = ("early_wasted_share", "wasted_rollout_share", "steps_to_target",
                "rollouts_to_target", "final_accuracy", "ppm_pearson_r")  # fmt: skip
    return {
        "source": cold[0].sampler,
        "sources": [w.warm_start for w in warm],
        "early_steps": EARLY_STEPS,
        "early_wasted_rollouts": {
            "cold": M.mean_std([c["wasted"] for c, _ in early]),
            "warm": M.mean_std([w["wasted"] for _, w in early]),
            "saved": M.mean_std([c["wasted"] - w["wasted"] for c, w in early]),
        },
    } | {k: {"cold": fc[k], "warm": fw[k]} for k in compared}


def ppm_figures(results: list, a) -> dict:
    """Calibration on unseen held-out prompts and test-time allocation (PPM arms only)."""
    cal = [calibration(*np.array(r.calibration).T) for r in results if r.calibration]
    if not cal:
        return {"ppm_pearson_r": M.mean_std([]), "ppm_brier": M.mean_std([])}
    allocs, point, int8 = [], [], []
    for r in results:
        pred, obs = np.array(r.allocation["pred"]), np.array(r.allocation["observed"])
        budget = a.alloc_samples * len(pred)
        # the sampler's own uncertainty (arms saved before it was kept: the point rule)
        allocs.append(compare_allocations(pred, obs, budget, r.allocation.get("strength")))
        point.append(compare_allocations(pred, obs, budget))
        if "pred_int8" in r.allocation:  # arms saved before INT8 was measured have none
            q = np.array(r.allocation["pred_int8"])
            int8.append(
                {
                    "mean_abs_change": float(np.abs(q - pred).mean()),
                    "max_abs_change": float(np.abs(q - pred).max()),
                    "pearson_r_float": pearson_r(pred, obs),
                    "pearson_r_int8": pearson_r(q, obs),
                }
            )
    out = {
        "ppm_pearson_r": M.mean_std([c["pearson_r"] for c in cal]),
        "ppm_brier": M.mean_std([c["brier"] for c in cal]),
        "ppm_calibration_prompts": int(sum(c["n_prompts"] for c in cal)),
        "allocation": {k: M.mean_std([x[k] for x in allocs]) for k in allocs[0]},
        "allocation_point": {k: M.mean_std([x[k] for x in point]) for k in point[0]},
        "ppm_pearson_r_within_family": M.mean_std(
            [within_family_r(r.allocation) for r in results if "task" in r.allocation]
        ),
    }
    if int8:
        out["int8_scoring"] = {k: M.mean_std([x[k] for x in int8]) for k in int8[0]}
    return out


def within_family_r(alloc: dict) -> float:
    """Pearson r of the final held-out predictions within each task family (the families'
    means removed from both), the discrimination family labels alone cannot give."""
    pred, obs = np.array(alloc["pred"]), np.array(alloc["observed"])
    task = np.array(alloc["task"])
    for t in np.unique(task):
        m = task == t
        pred[m] -= pred[m].mean()
        obs[m] -= obs[m].mean()
    return pearson_r(pred, obs)


def floors(pool: dict) -> dict:
    """The issue's floors for the PPM sampler, and whether it beats GRESO (the strongest cheap
    baseline: per-prompt history only): {name: {value, bar, met}}; met is None when the figure
    does not exist (no target reached, no DAPO or GRESO arm)."""
    s = pool["samplers"]
    if "ppm" not in s:
        return {}
    p, u = s["ppm"], s["uniform"]
    m = lambda d: d["mean"]  # noqa: E731
    out = {}

    def check(name: str, value, bar: str, ok) -> None:
        out[name] = {"value": value, "bar": bar, "met": None if value is None else bool(ok(value))}

    def at_least(name: str, value) -> None:
        check(name, value, f">= {FLOORS[name]:g}", lambda v: v >= FLOORS[name])

    at_least("step_speedup_vs_uniform", m(p["step_speedup_vs_uniform"]))
    at_least("rollout_reduction_vs_dapo", m(p["rollout_reduction_vs_dapo"]))
    if p.get("to_uniform_final"):  # the same bars, the target being uniform's final accuracy
        fin = p["to_uniform_final"]
        for k in ("step_speedup_vs_uniform", "rollout_reduction_vs_dapo"):
            v = m(fin[k])
            check(f"{k}_to_uniform_final", v, f">= {FLOORS[k]:g}", lambda v, k=k: v >= FLOORS[k])
    if m(u["wasted_rollout_share"]):
        ratio = m(p["wasted_rollout_share"]) / m(u["wasted_rollout_share"])
        bar = FLOORS["wasted_share_vs_uniform"]
        check("wasted_share_vs_uniform", ratio, f"<= {bar:g}", lambda v: v <= bar)
    at_least("ppm_pearson_r", m(p["ppm_pearson_r"]))
    sd = float(np.hypot(p["final_accuracy"]["std"], u["final_accuracy"]["std"]) / np.sqrt(2))
    d = m(p["final_accuracy"]) - m(u["final_accuracy"])
    check("final_accuracy_vs_uniform", d, f">= -{sd:.3f} (pooled std)", lambda v: v >= -sd)
    at_least("worst_family_vs_uniform", min(p["family_change_vs_uniform"].values()))
    at_least(
        "allocation_compute_saved", p.get("allocation", {}).get("compute_saved", {}).get("mean")
    )
    if "greso" in s:
        g = s["greso"]
        steps, rollouts = (m(g["steps_to_target"]), m(p["steps_to_target"])), (
            m(g["rollouts_to_target"]), m(p["rollouts_to_target"])
        )  # fmt: skip
        faster = steps[0] / steps[1] if None not in steps else None
        cheaper = 1 - rollouts[1] / rollouts[0] if None not in rollouts else None
        check("step_speedup_vs_greso", faster, "> 1 (beats GRESO)", lambda v: v > 1)
        check("rollout_reduction_vs_greso", cheaper, "> 0 (beats GRESO)", lambda v: v > 0)
    return out
