"""`rlstream bench selection`: every sampler x several seeds on the same pool(s) and budget.

Read top to bottom: BenchArgs -> shared policies (pre-trained once, cached; the late pool's
uniform warm-up, cached) -> pools -> arms (run_arm per sampler and seed) -> figures per pool
(metrics.py) -> table, Parquet, plots, summary JSON (report.py).

Pools: `default` is the task mix from the pre-trained checkpoint. `late` starts from the
checkpoint after `late_warmup` uniform GRPO steps (most prompts already solved) and adds an
out-of-reach family (`late_extra`, default multiplication, which the corpus never showed), so
most groups are all-correct or all-wrong, as late in a real RLVR run.
Target accuracy (per pool, unless `target_accuracy` is given): the starting accuracy plus
`target_fraction` (0.9) of uniform's mean gain by the last step.
Warm start: an arm named `<ppm arm>@warm` (`ppm@warm`) starts its PPM sampler from the final
state of that PPM arm's run with the next seed (the last seed's from the first's; with one seed, its
own), as `rlstream run --ppm-from` starts from an earlier run: these arms run after every other
arm of the pool, and the summary's `warm_start` compares them with the cold arm.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field, replace
from pathlib import Path

import numpy as np

from rlstream.config import Config, with_values
from rlstream.trainers.envs import TaskMix, sample_prompts
from rlstream.trainers.envs.cot import in_format
from rlstream.trainers.selection import metrics as M
from rlstream.trainers.selection.allocation import compare_allocations
from rlstream.trainers.selection.loop import ArmArgs, arm_spec, policy_fingerprint, run_arm
from rlstream.trainers.selection.policies import late_policy, pretrained_policy
from rlstream.trainers.selection.ppm import calibration, pearson_r
from rlstream.trainers.selection.registry import SELECTION_SAMPLERS

BENCH_PRETRAIN_STEPS = 1000  # the published results' pre-training budget (cached checkpoints)
BENCH_RL_LR = 1e-4  # the published results' RL learning rate (the main job's default is higher)
WARM = "@warm"
EARLY_STEPS = 5
"""the first steps, where a cold PPM knows nothing yet: the warm start's saving is measured here"""


def warm_source(name: str) -> str | None:
    """The cold arm a `<arm>@warm` arm starts from ('ppm@warm' -> 'ppm'), None for others."""
    return name[: -len(WARM)] if name.endswith(WARM) else None


def bench_config() -> Config:
    """The run settings the benchmark's arms share: the defaults, with its pre-training budget
    and learning rate (40-step arms from a 1,000-step checkpoint, not the main job's 200)."""
    return with_values(
        Config(), **{"pretrain.max_steps": BENCH_PRETRAIN_STEPS, "rl.lr": BENCH_RL_LR}
    )


@dataclass
class BenchArgs:
    samplers: str = "uniform,dapo,greso,mopps,ppm,ppm:reference"
    """comma-separated registered samplers (uniform and dapo are the baselines); `ppm:<f>`
    is the PPM sampler with featurizers f joined by '+' (ppm: the reference-free default;
    ppm:reference: the labelled variant that reads the reference answer)"""
    seeds: int = 3
    """seeds per sampler (seed s of every sampler starts from the same checkpoint)"""
    steps: int = 40
    """RL steps per arm"""
    pool: str = "both"
    """default, late or both"""
    task: str = "add,sub"
    """task mix spec (add,sub,mul,chain,countdown,word...) or rg:<reasoning-gym dataset>"""
    target_accuracy: float | None = None
    """held-out greedy accuracy target (default: start + target_fraction x uniform's gain)"""
    target_fraction: float = 0.9
    """share of uniform's mean accuracy gain that defines the default target"""
    pool_size: int = 4000
    """unique train prompts in each pool"""
    eval_prompts: int = 512
    """held-out prompts (never rolled out in training)"""
    late_warmup: int = 150
    """uniform GRPO steps that turn the pre-trained checkpoint into the late pool's start
    (150: about half of uniform's groups are zero-variance there)"""
    late_rl_lr: float = 3e-5
    """RL learning rate of the late pool's arms (late in a run the rate has decayed; at the
    default 1e-4 a fresh optimizer knocks the late policy back ~3 points before it learns)"""
    late_extra: str = "mul:0.5"
    """family added to the late pool, out of reach of the policy ('' for none)"""
    alloc_samples: int = 4
    """test-time allocation budget: samples per held-out prompt on average"""
    train: Config = field(default_factory=bench_config)
    """the run settings every arm shares: model, data, pre-training (its checkpoint is cached
    by them), RL (rl.steps and data.tasks come from `steps` and `task`)"""
    arm: ArmArgs = field(default_factory=ArmArgs)
    """what each arm measures besides training (evaluation cadence, threads, PPM settings)"""
    cache_dir: str = "~/.cache/rlstream/selection"
    """where pre-trained and warmed-up checkpoints are cached"""
    out: str = "bench-selection"
    """directory for records.parquet and the plots"""
    summary: str | None = None
    """path of the summary JSON"""
    progress: bool = True
    """rich progress bar and tables"""
    resume: bool = False
    """reuse arms already saved under out/arms/ (same pool, sampler and seed)"""

    def __post_init__(self):
        self.train = with_values(self.train, **{"rl.steps": self.steps, "data.tasks": self.task})
        if self.pool not in ("default", "late", "both"):
            raise ValueError(f"pool is default, late or both; got {self.pool!r}")
        if self.seeds < 1:
            raise ValueError("seeds must be >= 1")
        names = self.sampler_names
        if "uniform" not in names:
            raise ValueError("the benchmark measures against uniform: keep it in --samplers")
        for name in names:
            cold = warm_source(name)
            base, _ = arm_spec(cold or name, self.train)
            if base not in SELECTION_SAMPLERS:
                raise ValueError(
                    f"samplers: unknown {base!r}; known: {', '.join(sorted(SELECTION_SAMPLERS))}"
                )
            if cold is not None and (base != "ppm" or cold not in names):
                raise ValueError(
                    f"samplers: {name!r} starts from the final PPM of the {cold!r} arm: name a "
                    f"ppm arm and keep it in --samplers (ppm,ppm{WARM})"
                )

    @property
    def sampler_names(self) -> list[str]:
        return [s.strip() for s in self.samplers.split(",") if s.strip()]

    @property
    def pools(self) -> list[str]:
        return ["default", "late"] if self.pool == "both" else [self.pool]


def quick(args: BenchArgs) -> BenchArgs:
    """A preset that finishes in a few minutes: 2 seeds, 30 steps, 300 pre-training steps."""
    return replace(
        args,
        seeds=2,
        steps=30,
        eval_prompts=256,
        pool_size=2000,
        late_warmup=20,
        train=with_values(args.train, **{"pretrain.max_steps": 300, "data.corpus_docs": 30_000}),
        arm=replace(args.arm, eval_every=5, pass1_every=10),
    )


def build_pools(a: BenchArgs, status) -> dict[str, dict]:
    """name -> {blob, pool, eval, cached, loop}: each pool's shared starting policy, prompts and
    RL settings."""
    cache = Path(a.cache_dir).expanduser()
    cfg = a.train
    blob, cached = pretrained_policy(cfg, cache, a.arm.threads, status("pre-train"))
    mix, fmt = TaskMix.parse(a.task), cfg.data.format

    def draw(mix: TaskMix, n: int, split: str) -> list:  # in the run's answer format
        return [in_format(p, fmt) for p in sample_prompts(mix, n, split, cfg.seed)]

    pool = draw(mix, a.pool_size, "train")
    out = {}
    if "default" in a.pools:
        ev = draw(mix, a.eval_prompts, "heldout")
        out["default"] = {"blob": blob, "pool": pool, "eval": ev, "cached": cached, "cfg": cfg}
    if "late" in a.pools:
        late, lc = late_policy(blob, cfg, pool, a.late_warmup, cache, a.arm, status("late warm-up"))
        lmix = TaskMix.parse(f"{a.task},{a.late_extra}" if a.late_extra else a.task)
        lpool = draw(lmix, a.pool_size, "train")
        ev = draw(lmix, a.eval_prompts, "heldout")
        late_cfg = with_values(cfg, **{"rl.lr": a.late_rl_lr})
        out["late"] = {"blob": late, "pool": lpool, "eval": ev, "cached": lc, "cfg": late_cfg}
    return out


def check_one_start(pool: str, arms: list) -> None:
    """Refuse to compare arms that started from different policies. Pre-training the same
    settings again can give another policy (a new machine or library: the cache key covers
    settings only), and arms saved from it look like more seeds of the same pool. Two arms
    differ when both carry a policy fingerprint and they differ, or when their step-0
    evaluations (greedy accuracy per family, the same for every sampler and seed of one
    starting policy) differ: that also catches arms saved before fingerprints."""
    if not arms:
        return
    first = arms[0]

    def start(r) -> tuple:
        row = r.rows[0]
        return row.get("greedy"), sorted((row.get("greedy_by_task") or {}).items())

    for r in arms[1:]:
        fps = first.start_policy, r.start_policy
        if (all(fps) and fps[0] != fps[1]) or start(r) != start(first):
            raise ValueError(
                f"pool {pool!r}: the arms {first.sampler} seed {first.seed} and {r.sampler} "
                f"seed {r.seed} started from different policies (fingerprints "
                f"{fps[0] or '-'} / {fps[1] or '-'}, start accuracy {start(first)[0]} / "
                f"{start(r)[0]}): keep each checkpoint's arms in their own --out"
            )


def pool_figures(runs: dict[str, list], a: BenchArgs) -> dict:
    """Every figure of one pool from its arms: runs[sampler] = [ArmResult per seed]."""
    rows = {s: [r.rows for r in rs] for s, rs in runs.items()}
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
        f["rollout_reduction_vs_dapo"] = M.mean_std([])
        if "dapo" in rows:
            r = M.ratio_of_means(cost(rs, "rollouts"), cost(rows["dapo"], "rollouts"))
            f["rollout_reduction_vs_dapo"] = r | {"mean": 1 - r["mean"]} if r["n"] else r
        f["to_uniform_final"] = to_final(rs)
        if out.get("target_note"):
            for k in ("steps_to_target", "rollouts_to_target", "step_speedup_vs_uniform"):
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


def ppm_figures(results: list, a: BenchArgs) -> dict:
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


# Issue 13's floors for the reference-free PPM (the GPS paper's figures are the bar to beat)
FLOORS = {
    "step_speedup_vs_uniform": 1.3,  # GPS: 2.0x
    "rollout_reduction_vs_dapo": 0.40,  # GPS: 69%
    "wasted_share_vs_uniform": 0.5,  # at most this share of uniform's
    "ppm_pearson_r": 0.7,  # on held-out prompts never rolled out
    "worst_family_vs_uniform": -0.03,
    "allocation_compute_saved": 0.25,  # GPS: 36.4%
}


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


def run_bench(a: BenchArgs) -> dict:
    """Run every arm, print the tables, write Parquet, plots and the summary; returns it."""
    from rlstream.trainers.selection import report

    t0 = time.time()
    with report.Live(a) as live:
        pools = build_pools(a, live.status)
        results: dict[str, dict[str, list]] = {}
        for name, p in pools.items():
            results[name] = {s: [] for s in a.sampler_names}
            cold = [s for s in a.sampler_names if warm_source(s) is None]
            warm = [s for s in a.sampler_names if warm_source(s) is not None]
            # seed-major: a run cut short still has every sampler; warm arms last (their
            # sources are the cold arms' final PPMs)
            for samplers in (cold, warm):
                for seed in range(a.seeds):
                    for sampler in samplers:
                        res = saved_or_run(a, live, name, p, sampler, seed)
                        results[name][sampler].append(res)
                        live.done(name, res)
    summary = {"config": report.config_dict(a), "wall_s": time.time() - t0, "pools": {}}
    for name, runs in results.items():
        check_one_start(name, [r for rs in runs.values() for r in rs])
        summary["pools"][name] = pool_figures(runs, a)
        summary["pools"][name]["pretrained_checkpoint_cached"] = pools[name]["cached"]
    report.write(a, results, summary)
    return summary


def saved_or_run(a: BenchArgs, live, pool: str, p: dict, sampler: str, seed: int):
    """One arm: its saved result (--resume) if it started from this pool's policy, else run."""
    from rlstream.trainers.selection import report

    start = policy_fingerprint(p["blob"])
    res = report.load_arm(a, pool, sampler, seed) if a.resume else None
    if res is not None and res.start_policy not in ("", start):
        raise ValueError(
            f"{a.out}/arms: {pool} {sampler} seed {seed} was run from policy "
            f"{res.start_policy}, this pool starts from {start} (another checkpoint): resume "
            "into a new --out"
        )
    if res is None:
        res = run_arm(p["blob"], p["pool"], p["eval"], warm_source(sampler) or sampler, seed,
                      p["cfg"], a.arm, live.arm(pool, sampler, seed),
                      warm=warm_from(a, pool, sampler, seed))  # fmt: skip
        res.sampler = sampler
        report.save_arm(a, pool, res)
    return res


def warm_from(a: BenchArgs, pool: str, sampler: str, seed: int) -> tuple[str, dict] | None:
    """(source, `PredictiveSampler.warm_state`) a warm arm starts from: its cold arm's run with
    the next seed."""
    from rlstream.trainers.selection import report

    cold = warm_source(sampler)
    if cold is None:
        return None
    src = (seed + 1) % a.seeds
    state = report.load_ppm_state(a, pool, cold, src)
    if state is None:
        raise ValueError(
            f"{a.out}/arms: {sampler} seed {seed} starts from the final PPM of {cold} seed "
            f"{src}, which was not kept (an arm saved before PPM states were): delete "
            f"{pool}_{cold}_{src}.json to run it again"
        )
    return f"{cold} seed {src}", state


def summarize_saved(a: BenchArgs, dirs: list[str]) -> dict:
    """Rebuild the figures, tables and files from the per-arm JSON of earlier runs (out/arms/):
    merges pools benchmarked in separate processes, or finishes a run that was cut short."""
    import json

    from rlstream.trainers.selection import report
    from rlstream.trainers.selection.loop import ArmResult

    results: dict[str, dict[str, list]] = {}
    for d in dirs:
        for f in sorted((Path(d) / "arms").glob("*.json")):
            pool, sampler, _ = f.stem.rsplit("_", 2)
            res = ArmResult(**json.loads(f.read_text()))
            results.setdefault(pool, {}).setdefault(sampler, []).append(res)
    summary = {"config": report.config_dict(a), "merged_from": [str(d) for d in dirs], "pools": {}}
    for name, runs in results.items():
        runs = {s: sorted(runs[s], key=lambda r: r.seed) for s in a.sampler_names if s in runs}
        results[name] = runs
        check_one_start(name, [r for rs in runs.values() for r in rs])
        summary["pools"][name] = pool_figures(runs, a)
    report.write(a, results, summary)
    return summary
