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

from rlstream.config import Config, with_values
from rlstream.trainers.envs import TaskMix, sample_prompts
from rlstream.trainers.envs.cot import in_format
from rlstream.trainers.selection.bench_figures import (
    WARM,
    pool_figures,
    warm_source,
)
from rlstream.trainers.selection.loop import ArmArgs, arm_spec, policy_fingerprint, run_arm
from rlstream.trainers.selection.policies import late_policy, pretrained_policy
from rlstream.trainers.selection.registry import SELECTION_SAMPLERS

BENCH_PRETRAIN_STEPS = 1000  # the published results' pre-training budget (cached checkpoints)
BENCH_RL_LR = 1e-4  # the published results' RL learning rate (the main job's default is higher)


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
