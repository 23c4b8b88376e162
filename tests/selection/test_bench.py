"""The selection bench end to end on a tiny model, pool and budget: correctness, not speed."""

from __future__ import annotations

import io
import json
import subprocess
import sys
import tarfile

import pyarrow.parquet as pq
import pytest

from rlstream.config import with_values
from rlstream.trainers.selection.bench import (
    BenchArgs,
    bench_config,
    check_one_start,
    run_bench,
    summarize_saved,
)
from rlstream.trainers.selection.bench_figures import floors
from rlstream.trainers.selection.loop import ArmArgs, ArmResult, policy_fingerprint
from rlstream.trainers.selection.report import load_ppm_state

TINY_TRAIN = with_values(
    bench_config(),
    **{
        "pretrain.max_steps": 20,
        "data.corpus_docs": 2000,
        "model.n_layer": 1,
        "model.n_head": 2,
        "model.n_embd": 32,
        "rl.prompts_per_step": 8,
        "rl.group_size": 4,
    },
)
TINY_ARM = ArmArgs(eval_every=1, pass1_every=2)
HEADLINE = (
    "step_speedup_vs_uniform",
    "rollout_reduction_vs_dapo",
    "ppm_pearson_r",
    "final_accuracy",
    "wasted_rollout_share",
)


@pytest.fixture(scope="module")
def cache_dir(tmp_path_factory):
    return tmp_path_factory.mktemp("selection-cache")


def tiny(out, cache_dir, **kw) -> BenchArgs:
    base = dict(
        seeds=1,
        steps=3,
        pool_size=200,
        eval_prompts=32,
        late_warmup=2,
        train=TINY_TRAIN,
        arm=TINY_ARM,
        cache_dir=str(cache_dir),
        out=str(out),
        summary=str(out / "summary.json"),
        progress=False,
    )
    return BenchArgs(**(base | kw))


def test_bench_records_invariants(tmp_path, cache_dir):
    s = run_bench(tiny(tmp_path, cache_dir, samplers="uniform,dapo,ppm,ppm@warm", pool="default"))
    t = pq.read_table(tmp_path / "records.parquet").to_pylist()
    assert {r["sampler"] for r in t} == {"uniform", "dapo", "ppm", "ppm@warm"}
    for sampler in ("uniform", "dapo", "ppm"):
        rows = [r for r in t if r["sampler"] == sampler]
        assert [r["step"] for r in rows] == [0, 1, 2, 3]
        rollouts = [r["rollouts"] for r in rows]
        assert rollouts == sorted(rollouts) and rollouts[-1] > 0
        assert all(r["wasted"] <= r["rollouts"] for r in rows)
        assert all(r["trained_rollouts"] <= r["rollouts"] for r in rows)
        assert all(r["greedy"] is not None for r in rows)  # eval_every=1
        for r in rows:  # per-family accuracy is one dict column, not greedy_<family> keys
            assert set(r["greedy_by_task"]) == {"add", "sub"}
            assert all(0 <= v <= 1 for v in r["greedy_by_task"].values())
            assert not any(k.startswith("greedy_") and k != "greedy_by_task" for k in r)
    for r in (r for r in t if r["sampler"] == "dapo" and r["step"] > 0):
        assert r["trained_zero_var_share"] == 0.0  # DAPO never trains a zero-variance group
    for r in (r for r in t if r["sampler"] == "uniform"):
        assert r["trained_rollouts"] == r["rollouts"]  # nothing discarded
    pool = s["pools"]["default"]
    for sampler in ("uniform", "dapo", "ppm"):
        assert set(HEADLINE) <= set(pool["samplers"][sampler])
    assert pool["samplers"]["ppm"]["ppm_calibration_prompts"] > 0
    assert "compute_saved" in pool["samplers"]["ppm"]["allocation"]
    assert pool["samplers"]["ppm"]["score_records"] > 0
    # candidates the PPM scored a step: 128, more only with selection.ppm_candidates_max (the
    # pool's 200 at most); the other samplers score none
    screened = [r["screened"] for r in t if r["sampler"] == "ppm" and r["step"] > 0]
    assert all(128 <= n <= 200 for n in screened), screened
    per_step = pool["samplers"]["ppm"]["candidates_per_step"]["mean"]
    assert per_step == pytest.approx(sum(screened) / len(screened))
    assert pool["samplers"]["uniform"]["candidates_per_step"]["mean"] == 0
    # compute: every rollout's tokens, and scoring's (the PPM's policy features) charged to it
    for sampler in ("uniform", "dapo", "ppm"):
        rows = [r for r in t if r["sampler"] == sampler and r["step"] > 0]
        decoded = [r["rollout_decoded"] for r in rows]
        assert decoded == sorted(decoded) and decoded[0] > 0
        assert all(r["rollout_prefilled"] >= r["rollouts"] for r in rows)  # a token a prompt
        scored = [r["select_decoded"] + r["select_prefilled"] for r in rows]
        assert (scored[-1] > 0) == (sampler == "ppm"), (sampler, scored)
        f = pool["samplers"][sampler]
        assert (f["selection_compute_share"]["mean"] > 0) == (sampler == "ppm")
    assert 0 < pool["prefill_ratio"]["median"] < 10  # a prefilled token, in decoded tokens
    if "target_note" not in pool:  # uniform gained enough over the start for targets
        assert pool["samplers"]["uniform"]["compute_speedup_vs_uniform"]["mean"] == 1.0
    assert set(pool["samplers"]["ppm"]["final_by_family"]) == {"add", "sub"}
    q = pool["samplers"]["ppm"]["int8_scoring"]  # INT8 scoring's cost, on the same prompts
    assert 0 <= q["mean_abs_change"]["mean"] <= q["max_abs_change"]["mean"] < 0.1
    assert set(pool["floors"]) >= {"wasted_share_vs_uniform", "ppm_pearson_r"}
    assert pool["uniform_final_target"] == pool["samplers"]["uniform"]["final_accuracy"]["mean"]
    if "target_note" not in pool:  # uniform gained enough over the start for targets
        fin = pool["samplers"]["ppm"]["to_uniform_final"]
        assert set(fin) >= {"steps", "rollouts", "reached", "step_speedup_vs_uniform"}
        assert fin["reached"].endswith("/1")
    # the warm arm started from the ppm arm's final PPM (one seed: its own), kept beside it
    source = load_ppm_state(tiny(tmp_path, cache_dir), "default", "ppm", 0)
    warm = pool["warm_start"]["ppm@warm"]
    (started,) = warm["sources"]
    assert started["source"] == "ppm seed 0" and started["fits"] == source["ppm"]["version"]
    assert started["observations"] == len(source["ppm"]["s"]) == 3 * 8  # 3 steps of 8 groups
    assert started["prior_strength"] > 0 and source["strength_fit"]  # its trust came too
    e = warm["early_wasted_rollouts"]
    assert e["saved"]["mean"] == e["cold"]["mean"] - e["warm"]["mean"]
    assert warm["steps_to_target"]["cold"] == pool["samplers"]["ppm"]["steps_to_target"]
    assert "warm_start" not in pool["samplers"]["ppm"]  # floors stay the cold arm's
    assert (tmp_path / "accuracy_default.png").stat().st_size > 0
    assert json.loads((tmp_path / "summary.json").read_text())["pools"]["default"]
    again = summarize_saved(tiny(tmp_path, cache_dir, samplers="uniform,dapo,ppm"), [tmp_path])
    assert (
        again["pools"]["default"]["samplers"]["ppm"]["final_accuracy"]
        == (pool["samplers"]["ppm"]["final_accuracy"])
    )  # the per-arm JSON holds everything the figures need


def test_floors_are_the_issues_bars_and_compare_against_greso():
    ms = lambda v: {"mean": v, "std": 0.01, "n": 3}  # noqa: E731

    def arm(speedup, steps, rollouts, wasted, acc, fam, r=None, saved=None):
        return {
            "step_speedup_vs_uniform": ms(speedup), "steps_to_target": ms(steps),
            "rollouts_to_target": ms(rollouts), "wasted_rollout_share": ms(wasted),
            "final_accuracy": ms(acc), "family_change_vs_uniform": fam,
            "rollout_reduction_vs_dapo": ms(0.45), "ppm_pearson_r": ms(r),
        } | ({"allocation": {"compute_saved": ms(saved)}} if saved is not None else {})  # fmt: skip

    pool = {
        "samplers": {
            "uniform": arm(1.0, 20, 5000, 0.4, 0.80, {"add": 0.0}),
            "greso": arm(1.5, 13.3, 3400, 0.3, 0.80, {"add": 0.0}),
            "ppm": arm(1.4, 14.3, 3200, 0.19, 0.795, {"add": -0.031}, r=0.72, saved=0.2),
        }
    }
    f = floors(pool)
    met = {k: v["met"] for k, v in f.items()}
    assert met == {
        "step_speedup_vs_uniform": True,  # 1.4 >= 1.3
        "rollout_reduction_vs_dapo": True,  # 0.45 >= 0.40
        "wasted_share_vs_uniform": True,  # 0.475 <= 0.5
        "ppm_pearson_r": True,
        "final_accuracy_vs_uniform": True,  # -0.005 within the pooled std 0.01
        "worst_family_vs_uniform": False,  # 3.1 points below
        "allocation_compute_saved": False,  # 20% < 25%
        "step_speedup_vs_greso": False,  # 13.3 / 14.3 steps
        "rollout_reduction_vs_greso": True,  # 3,200 vs 3,400 rollouts
    }
    assert abs(f["step_speedup_vs_greso"]["value"] - 13.3 / 14.3) < 1e-9
    # the same bars at uniform's final accuracy, when the pool has that second target
    pool["samplers"]["ppm"]["to_uniform_final"] = {
        "step_speedup_vs_uniform": ms(1.2),
        "rollout_reduction_vs_dapo": ms(0.5),
    }
    f = floors(pool)
    assert f["step_speedup_vs_uniform_to_uniform_final"]["met"] is False  # 1.2 < 1.3
    assert f["rollout_reduction_vs_dapo_to_uniform_final"]["met"] is True
    pool["samplers"]["ppm"]["steps_to_target"] = ms(None)  # never reached the target
    pool["samplers"]["ppm"]["step_speedup_vs_uniform"] = ms(None)
    f = floors(pool)
    assert f["step_speedup_vs_greso"]["met"] is None and f["step_speedup_vs_uniform"]["met"] is None


@pytest.mark.slow  # the whole bench command, small (~25 s)
def test_cli_bench_selection_writes_summary(tmp_path, cache_dir):
    summary = tmp_path / "s.json"
    cmd = [
        sys.executable,
        "-m",
        "rlstream.cli",
        "bench",
        "selection",
        "--samplers",
        "uniform,ppm",
        "--seeds",
        "1",
        "--steps",
        "2",
        "--pool",
        "both",
        "--late-warmup",
        "2",
        "--pool-size",
        "200",
        "--eval-prompts",
        "32",
        "--pretrain-steps",
        "20",
        "--corpus-docs",
        "2000",
        "--n-layer",
        "1",
        "--n-embd",
        "32",
        "--prompts-per-step",
        "8",
        "--group-size",
        "4",
        "--eval-every",
        "1",
        "--pass1-every",
        "1",
        "--cache-dir",
        str(cache_dir),
        "--out",
        str(tmp_path / "out"),
        "--summary",
        str(summary),
        "--no-progress",
    ]
    subprocess.run(cmd, check=True, timeout=240)
    s = json.loads(summary.read_text())
    assert set(s["pools"]) == {"default", "late"}
    for pool in s["pools"].values():
        for name in ("uniform", "ppm"):
            assert set(HEADLINE) <= set(pool["samplers"][name])
        assert 0 <= pool["uniform_zero_variance_share"]["mean"] <= 1
        ppm = pool["samplers"]["ppm"]
        # test-time allocation under the sampler's posterior, the point rule beside it
        assert ppm["allocation"]["compute_saved"]["n"] == 1
        assert ppm["allocation_point"]["compute_saved"]["n"] == 1
        assert ppm["ppm_pearson_r_within_family"]["n"] <= 1  # undefined if predictions are flat
    assert (tmp_path / "out" / "records.parquet").exists()
    arm = json.loads((tmp_path / "out" / "arms" / "default_ppm_0.json").read_text())
    # the predictions' worth per held-out prompt (its family's fitted prior strength)
    assert min(arm["allocation"]["strength"]) > 0
    assert len(arm["allocation"]["strength"]) == len(arm["allocation"]["pred"]) == 32
    assert len(arm["allocation"]["task"]) == 32
    # the saved arms, merged into another directory without running anything
    merged = tmp_path / "merged.json"
    args = ["--samplers", "uniform,ppm", "--seeds", "1", "--out", str(tmp_path / "merged")]
    done = subprocess.run([*cmd[:5], *args, "--merge", str(tmp_path / "out"), "--summary",
                           str(merged), "--no-progress"], capture_output=True, text=True,
                          timeout=120)  # fmt: skip
    assert done.returncode == 0, done.stderr[-2000:]
    again = json.loads(merged.read_text())
    assert again["merged_from"] == [str(tmp_path / "out")]
    for name, pool in s["pools"].items():
        for sampler in ("uniform", "ppm"):
            expected = pool["samplers"][sampler]["final_accuracy"]
            assert again["pools"][name]["samplers"][sampler]["final_accuracy"] == expected
    assert (tmp_path / "merged" / "accuracy_late.png").stat().st_size > 0
    nothing = subprocess.run([*cmd[:5], "--merge", str(tmp_path / "nowhere")],
                             capture_output=True, text=True, timeout=60)  # fmt: skip
    assert nothing.returncode == 2 and "no saved arms in" in nothing.stderr
    assert "Traceback" not in nothing.stderr
    # arms of another starting policy must not pass for more seeds of this one
    saved = (tmp_path / "out/arms").glob("*.json")
    fps = {json.loads(f.read_text())["start_policy"] for f in saved}
    assert len(fps) == 2 and all(len(fp) == 12 for fp in fps)  # the default and late policies
    other = tmp_path / "other" / "arms"
    other.mkdir(parents=True)
    arm = json.loads((tmp_path / "out" / "arms" / "default_uniform_0.json").read_text())
    arm |= {"seed": 1, "start_policy": "0123456789ab"}
    (other / "default_uniform_1.json").write_text(json.dumps(arm))
    mixed = subprocess.run([*cmd[:5], *args, "--seeds", "2", "--merge", str(tmp_path / "out"),
                            "--merge", str(tmp_path / "other")], capture_output=True, text=True,
                           timeout=120)  # fmt: skip
    assert mixed.returncode == 2 and "started from different policies" in mixed.stderr
    assert "Traceback" not in mixed.stderr


def test_reasoning_gym_task_spec_resolves_to_a_verifiable_family():
    pytest.importorskip("reasoning_gym")
    from rlstream.trainers.envs import TaskMix, sample_prompts, verify

    mix = TaskMix.parse("add,rg:gcd:0.5")
    assert mix.weights == {"add": 1.0, "rg:gcd": 0.5}
    prompts = [p for p in sample_prompts(mix, 40, "train", 0) if p.task == "rg:gcd"]
    assert prompts and all(verify(p.answer, p) for p in prompts)
    assert not verify("not a number", prompts[0])


def test_cot_pools_are_drawn_in_the_chain_of_thought_format(tmp_path, cache_dir):
    from rlstream.trainers.envs import verify
    from rlstream.trainers.envs.cot import cot_family
    from rlstream.trainers.selection.bench import build_pools

    cot = with_values(TINY_TRAIN, **{"data.format": "cot", "model.block_size": 96,
                                     "rl.max_new_tokens": 48})  # fmt: skip
    pools = build_pools(tiny(tmp_path, cache_dir, train=cot, pool="both"), lambda _: None)
    for pool in pools.values():
        prompts = pool["pool"] + pool["eval"]
        assert {p.verifier for p in prompts} >= {"cot:add", "cot:sub"}
        for p in prompts[:50]:  # the final answer in its tag is what the verifier reads
            assert verify(cot_family(p.verifier).solution(p), p) and not verify(p.answer, p)


def test_arms_from_different_starting_policies_are_refused():
    def arm(seed, fingerprint, greedy, add=0.5):
        row = {"step": 0, "greedy": greedy, "greedy_by_task": {"add": add, "sub": 0.25}}
        return ArmResult("uniform", seed, [row], start_policy=fingerprint)

    check_one_start("default", [arm(0, "aa", 0.4), arm(1, "aa", 0.4), arm(2, "", 0.4)])
    with pytest.raises(ValueError, match="different policies"):  # fingerprints differ
        check_one_start("default", [arm(0, "aa", 0.4), arm(1, "bb", 0.4)])
    with pytest.raises(ValueError, match="seed 1"):  # saved before fingerprints: step 0 differs
        check_one_start("default", [arm(0, "", 0.4), arm(1, "", 0.4, add=0.75)])


def test_a_policy_pre_trained_again_keeps_its_fingerprint():
    """The fingerprint reads the policy's files, not the tar's headers: the same files written
    at another time (a checkpoint pre-trained again on a new machine) match, other bytes not."""

    def tar(files: dict[str, bytes], mtime: int) -> bytes:
        buf = io.BytesIO()
        with tarfile.open(fileobj=buf, mode="w") as t:
            for name, data in files.items():
                info = tarfile.TarInfo(name)
                info.size, info.mtime = len(data), mtime
                t.addfile(info, io.BytesIO(data))
        return buf.getvalue()

    files = {"model.safetensors": b"weights", "config.json": b"{}"}
    first, again = tar(files, 1_000), tar(dict(reversed(files.items())), 2_000)
    assert first != again and policy_fingerprint(first) == policy_fingerprint(again)
    other = tar({**files, "model.safetensors": b"weightz"}, 1_000)
    assert policy_fingerprint(other) != policy_fingerprint(first)


def test_smoothed_crossings_ignore_one_noisy_evaluation():
    from rlstream.trainers.selection import metrics as M

    # one evaluation spikes over the target at step 4; the curve itself gets there after 12
    greedy = [0.30, 0.50, 0.58, 0.50, 0.52, 0.55, 0.58, 0.60]
    rows = [{"step": 2 * i, "rollouts": 512 * i, "greedy": g} for i, g in enumerate(greedy)]
    assert M.to_target(rows, 0.56) < 4  # the raw first crossing: the spike
    smooth = M.smoothed(rows, 3)
    assert [r["step"] for r in smooth] == [r["step"] for r in rows]
    assert smooth[2]["greedy"] == pytest.approx((0.30 + 0.50 + 0.58) / 3)
    assert 12 < M.to_target(smooth, 0.56) < 14  # the trailing mean crosses between 12 and 14
    assert M.cost_to_target(smooth, 0.9, "step") == (14.0, False)  # a miss costs the budget


def test_a_warm_arm_needs_its_cold_ppm_arm(tmp_path, cache_dir):
    for samplers in ("uniform,ppm@warm", "uniform,greso,greso@warm"):
        with pytest.raises(ValueError, match="starts from the final PPM"):
            tiny(tmp_path, cache_dir, samplers=samplers)
    assert tiny(tmp_path, cache_dir, samplers="uniform,ppm:text,ppm:text@warm").seeds == 1
