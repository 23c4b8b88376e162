"""MoPPS, GRESO, DAPO against hand-computed values and invariants; checkpoint round trips."""

from __future__ import annotations

import copy

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rlstream.schemas import get
from rlstream.trainers.selection import (
    SELECTION_SAMPLERS,
    DapoArgs,
    DynamicSamplingSampler,
    GresoSampler,
    MoppsArgs,
    MoppsSampler,
    PPMArgs,
    PredictiveArgs,
    PromptPredictiveModel,
    beta_decay_update,
    dapo_filter,
    fill_batch,
    greso_adapt,
    greso_skip_probability,
    make_selection_sampler,
    records_to_batch,
    register_sampler,
)
from tests.selection.helpers import bernoulli_rewards, synthetic_pool


def test_mopps_posterior_update_hand_computed():
    # alpha = 0.5*3 + 0.5*1 + 2 = 4.0 ; beta = 0.5*2 + 0.5*1 + 1 = 2.5
    a, b = beta_decay_update(
        np.array([3.0]),
        np.array([2.0]),
        np.array([2.0]),
        np.array([1.0]),
        decay=0.5,
        alpha0=1.0,
        beta0=1.0,
    )
    assert a[0] == pytest.approx(4.0) and b[0] == pytest.approx(2.5)
    pool = synthetic_pool(3)
    s = MoppsSampler(pool, 0, MoppsArgs(alpha0=1.0, beta0=1.0, decay=0.5))
    s.update([pool[0]], [[1.0, 1.0, 0.0]])  # alpha 0.5+0.5+2 = 3, beta 0.5+0.5+1 = 2
    assert (s.alpha[0], s.beta[0]) == pytest.approx((3.0, 2.0))
    s.update([pool[0]], [[1.0, 0.0, 0.0]])  # alpha 1.5+0.5+1 = 3, beta 1+0.5+2 = 3.5
    assert (s.alpha[0], s.beta[0]) == pytest.approx((3.0, 3.5))
    assert (s.alpha[1], s.beta[1]) == (1.0, 1.0)  # untouched prompts keep the prior


def test_mopps_picks_closest_to_half_from_a_larger_pool():
    pool = synthetic_pool(40)
    s = MoppsSampler(pool, 0, MoppsArgs(candidate_factor=4))
    s.alpha[:20], s.beta[:20] = 500.0, 500.0  # confidently p = 0.5
    s.alpha[20:], s.beta[20:] = 999.0, 1.0  # confidently solved
    sel = s.select_scored(0, 5)
    assert len(sel.records) == 20 and sum(r.selected for r in sel.records) == 5
    assert all(int(p.answer) < 20 for p in sel.prompts)


def test_greso_skip_probabilities_hand_computed():
    # 1 - p^k: k = 0, 1, 2, 3 at p = 0.5 -> 0, 0.5, 0.75, 0.875 ; p = 0.95, k = 2 -> 0.0975
    assert greso_skip_probability(np.array([0, 1, 2, 3]), 0.5) == pytest.approx(
        [0.0, 0.5, 0.75, 0.875]
    )
    assert greso_skip_probability(np.array([2]), 0.95)[0] == pytest.approx(0.0975)
    assert greso_adapt(0.5, 0.40, 0.125) == pytest.approx(0.49)  # too many zero-var: skip more
    assert greso_adapt(0.5, 0.05, 0.125) == pytest.approx(0.51)
    assert greso_adapt(0.05, 0.9, 0.125) == pytest.approx(0.05)  # clipped at p_min
    assert greso_adapt(0.95, 0.0, 0.125) == pytest.approx(0.95)  # clipped at p_max


def test_greso_sampler_history_and_adaptation():
    pool = synthetic_pool(4)
    s = GresoSampler(pool, 0)
    for _ in range(3):  # prompt 0 all correct three times, prompt 1 all wrong once then mixed
        s.update(pool[:1], [[1.0] * 4])
    s.update(pool[1:3], [[0.0] * 4, [1.0, 0.0, 1.0, 0.0]])
    assert s.stats.streak[:3].tolist() == [3, 1, 0]
    # p_easy: three steps with easy ratio 1 > 0.125 then one with 0 -> 0.5 - 0.03 + 0.01 = 0.48
    # p_hard: three steps at 0 < 0.125 (+0.03), then 0.5 > 0.125 (-0.01) -> 0.52
    assert (s.p_easy, s.p_hard) == pytest.approx((0.48, 0.52))
    skip = s.skip_probability(np.array([0, 1, 2]))
    assert skip == pytest.approx([1 - 0.48**3, 1 - 0.52, 0.0])


def test_greso_skips_at_the_predicted_rate():
    pool = synthetic_pool(2)
    s = GresoSampler(pool, 1)
    s.stats.streak[0], s.stats.kind[0] = 3, 1  # skip prob 1 - 0.5^3 = 0.875
    recs = [
        r
        for _ in range(200)
        for r in s.select_scored(0, 4).records
        if r.prompt_id == pool[0].prompt_id
    ]
    skipped = np.mean([not r.selected for r in recs])
    assert skipped == pytest.approx(0.875, abs=0.04)


@settings(max_examples=60, deadline=None)
@given(
    rates=st.lists(st.sampled_from([0.0, 0.0, 1.0, 0.05, 0.5, 0.95]), min_size=1, max_size=30),
    batch=st.integers(1, 12),
    group=st.integers(1, 6),
    max_rounds=st.integers(1, 5),
    seed=st.integers(0, 10_000),
)
def test_dapo_never_admits_zero_variance_and_honours_its_cap(rates, batch, group, max_rounds, seed):
    pool = synthetic_pool(len(rates))
    rate_of = {p.prompt_id: r for p, r in zip(pool, rates, strict=True)}
    rng = np.random.default_rng(seed)
    s = DynamicSamplingSampler(pool, seed, DapoArgs(max_rounds=max_rounds))
    calls = []

    def rollout(prompts):
        calls.append(len(prompts))
        return bernoulli_rewards([rate_of[p.prompt_id] for p in prompts], group, rng)

    b = fill_batch(s, rollout, batch)
    assert all(max(r) > min(r) for r in b.rewards)  # never a zero-variance group
    assert b.rounds == len(calls) <= max_rounds
    assert len(b.prompts) <= batch and b.full == (len(b.prompts) == batch)
    assert b.full or b.rounds == max_rounds  # short only when the cap stopped it
    assert (
        b.generated_groups == sum(calls) == b.discarded_groups + b.overflow_groups + len(b.prompts)
    )
    assert s.wasted_rollouts == b.discarded_groups * group


def test_dapo_filter_and_round_accounting():
    assert dapo_filter([[1, 1], [0, 1], [0, 0], [1, 0], [0.5, 0.5]], capacity=5) == [1, 3]
    assert dapo_filter([[1, 0], [0, 1]], capacity=1) == [0]
    assert dapo_filter([[1, 1]], capacity=3) == []
    pool = synthetic_pool(10)
    s = DynamicSamplingSampler(pool, 0, DapoArgs(max_rounds=3))
    b = fill_batch(s, lambda ps: [[1.0, 1.0]] * len(ps), 4)  # everything solved: all wasted
    assert (b.rounds, len(b.prompts), b.full) == (3, 0, False)
    assert s.wasted_rollouts == s.rollouts == 2 * b.generated_groups


def test_duplicate_sampler_name_is_an_error():
    with pytest.raises(ValueError, match="already registered"):
        register_sampler("mopps")(type("Other", (), {}))
    with pytest.raises(ValueError, match="unknown selection sampler"):
        make_selection_sampler("nope", synthetic_pool(2))


def _make(name: str, pool):
    if name == "ppm":  # a small PPM keeps the test fast
        ppm = PromptPredictiveModel(PPMArgs(hidden=32, fit_steps=3, batch_size=32, seed=0))
        return make_selection_sampler(
            name, pool, 3, args=PredictiveArgs(candidate_pool=16), ppm=ppm
        )
    return make_selection_sampler(name, pool, 3)


def _drive(s, steps: int, rng_seed: int):
    rng, picked = np.random.default_rng(rng_seed), []
    for step in range(steps):
        prompts = s.select(step, 6)
        picked.append([p.prompt_id for p in prompts])
        rates = [int(p.answer) / 40 for p in prompts]
        s.update(prompts, bernoulli_rewards(rates, 4, rng))
    return picked


@pytest.mark.parametrize("name", sorted(SELECTION_SAMPLERS))
def test_state_survives_a_checkpoint_round_trip(name):
    pool = synthetic_pool(40)
    s = _make(name, pool)
    _drive(s, 4, 0)
    state = copy.deepcopy(s.state_dict())
    expected = _drive(s, 4, 1)
    restored = _make(name, pool)
    restored.load_state_dict(state)
    assert _drive(restored, 4, 1) == expected


@pytest.mark.parametrize("name", sorted(SELECTION_SAMPLERS))
def test_a_pool_that_grows_mid_run_is_sampled_and_restores_like_an_uninterrupted_one(name):
    """Prompts published while the loop runs join the pool: the new ones get picked, and a
    sampler restored from a snapshot taken before they joined, then extended, continues
    exactly as the one that was never interrupted."""
    pool, late = synthetic_pool(20), synthetic_pool(40)[20:]
    s = _make(name, pool)
    _drive(s, 3, 0)
    state = copy.deepcopy(s.state_dict())
    s.extend(late)
    expected = _drive(s, 3, 1)
    restored = _make(name, pool)
    restored.load_state_dict(state)
    restored.extend(late)
    assert _drive(restored, 3, 1) == expected
    assert len(restored.stats) == 40 and len(restored.pool) == 40
    picked = {p.prompt_id for _ in range(30) for p in restored.select(0, 8)}
    assert picked & {p.prompt_id for p in late}


@pytest.mark.parametrize("name", sorted(SELECTION_SAMPLERS))
def test_selection_records_build_a_prompt_scores_batch(name):
    pool = synthetic_pool(40)
    s = _make(name, pool)
    _drive(s, 2, 0)
    prompts = s.select(2, 6)
    recs = s.last_records
    assert sum(r.selected for r in recs) == len(prompts) == 6
    assert {r.prompt_id for r in recs if r.selected} == {p.prompt_id for p in prompts}
    batch = records_to_batch(recs, run_id="t", policy_version=3)
    assert batch.schema == get("prompt_scores").schema and batch.num_rows == len(recs)
    assert set(batch.column("sampler").to_pylist()) == {name}


@pytest.mark.parametrize(
    "make, match",
    [
        (lambda: MoppsArgs(decay=1.5), "decay is a weight"),
        (lambda: DapoArgs(max_rounds=0), "at least one generation round"),
        (lambda: PredictiveArgs(ppm_threshold=2.0), "ppm_threshold"),
        (lambda: PredictiveArgs(fit_every=0), "fit_every"),
        (lambda: PPMArgs(featurizers=()), "at least one featurizer"),
    ],
)
def test_args_reject_bad_settings_and_say_why(make, match):
    with pytest.raises(ValueError, match=match):
        make()


def test_build_sampler_takes_the_candidate_pool_from_the_config():
    from rlstream.config import Config, ConfigError, with_values
    from rlstream.trainers.selection.policy_features import tuned_args
    from rlstream.trainers.selection.registry import build_sampler, format_tuning

    pool = synthetic_pool(20)
    cfg = with_values(Config(), **{"selection.ppm_features": "text"})
    assert build_sampler(cfg, pool, None).args.candidate_pool == 128
    # screening beyond them by answer format (auto), or as set
    cot = with_values(cfg, **{"data.format": "cot"})
    assert build_sampler(cot, pool, None).args.candidate_max == 0  # 128 scored, no screen
    assert format_tuning(cot)["confidence_tokens"] == 12  # the solution's first 12 tokens
    assert format_tuning(cfg)["confidence_tokens"] == 2  # the direct answer's first 2 tokens
    # direct answers keep unpicked candidates while their features are cached (4 versions)
    assert build_sampler(cfg, pool, None).args.shortlist_rounds == 4
    assert build_sampler(cot, pool, None).args.shortlist_rounds == 0
    off = with_values(cfg, **{"selection.ppm_shortlist": False})
    assert build_sampler(off, pool, None).args.shortlist_rounds == 0
    longer = with_values(cot, **{"selection.ppm_shortlist": True,
                                 "selection.ppm_refresh_every": 6})  # fmt: skip
    assert build_sampler(longer, pool, None).args.shortlist_rounds == 6
    assert format_tuning(with_values(cot, **{"selection.ppm_confidence_tokens": 48})) == (
        format_tuning(cot) | {"confidence_tokens": 48}
    )
    assert build_sampler(cot, pool, None).args.fill == "value"
    assert build_sampler(cfg, pool, None).args.candidate_max == 0  # direct answers
    assert build_sampler(cfg, pool, None).args.fill == "rank"
    ranked = with_values(cot, **{"selection.ppm_fill": "rank"})
    assert build_sampler(ranked, pool, None).args.fill == "rank"
    with pytest.raises(ConfigError, match="selection.ppm_fill"):
        with_values(Config(), **{"selection.ppm_fill": "hardest"})
    big = with_values(cot, **{"selection.ppm_candidates": 512,
                              "selection.ppm_candidates_max": 1024})  # fmt: skip
    # explicit sampler settings (the bench's, the scheduler's) keep their other fields
    s = build_sampler(big, pool, None, ppm_args=tuned_args())
    assert s.args.candidate_pool == 512 and s.args.hard_tilt == tuned_args().hard_tilt
    assert s.args.candidate_max == 1024
    with pytest.raises(ConfigError, match="selection.ppm_candidates"):
        with_values(Config(), **{"selection.ppm_candidates": 0})
    with pytest.raises(ConfigError, match="selection.ppm_candidates_max"):
        with_values(Config(), **{"selection.ppm_candidates_max": -1})
    # checking what it predicts out of reach, and the PPM fit's pseudo-counts, likewise
    assert build_sampler(cot, pool, None).args.explore_share == 0.05
    assert build_sampler(cot, pool, None).ppm.args.pseudo_count == 0.5
    assert build_sampler(cfg, pool, None).args.explore_share == 0.0
    assert build_sampler(cfg, pool, None).ppm.args.pseudo_count == 0.0
    set_ = with_values(cot, **{"selection.ppm_explore_share": 0, "selection.ppm_pseudo_count": 1})
    assert build_sampler(set_, pool, None).args.explore_share == 0.0
    assert build_sampler(set_, pool, None).ppm.args.pseudo_count == 1.0
    for key, bad in (("ppm_explore_share", 0.9), ("ppm_pseudo_count", -0.5)):
        with pytest.raises(ConfigError, match=f"selection.{key}"):
            with_values(Config(), **{f"selection.{key}": bad})


def test_build_sampler_takes_the_hard_tilt_from_the_config():
    from rlstream.config import Config, ConfigError, with_values
    from rlstream.trainers.selection.policy_features import tuned_args
    from rlstream.trainers.selection.registry import build_sampler

    pool = synthetic_pool(20)
    cfg = with_values(Config(), **{"selection.ppm_features": "text"})
    assert build_sampler(cfg, pool, None).args.hard_tilt == cfg.selection.ppm_hard_tilt
    flat = with_values(cfg, **{"selection.ppm_hard_tilt": 0})
    s = build_sampler(flat, pool, None, ppm_args=tuned_args())
    assert s.args.hard_tilt == 0 and s.args.prior_strength == tuned_args().prior_strength
    with pytest.raises(ConfigError, match="selection.ppm_hard_tilt"):
        with_values(Config(), **{"selection.ppm_hard_tilt": -1})


def test_build_sampler_takes_the_prior_strength_from_the_config():
    from rlstream.config import Config, ConfigError, with_values
    from rlstream.trainers.selection.policy_features import tuned_args
    from rlstream.trainers.selection.registry import build_sampler

    pool = synthetic_pool(20)
    cfg = with_values(
        Config(), **{"selection.ppm_features": "text", "selection.ppm_prior": "skill"}
    )
    assert build_sampler(cfg, pool, None).args.prior_strength == 16
    sharp = with_values(cfg, **{"selection.ppm_prior_strength": 64})
    s = build_sampler(sharp, pool, None, ppm_args=tuned_args())
    assert s.args.prior_strength == 64 and s.args.candidate_pool == tuned_args().candidate_pool
    # the skill gate scales what the config sets: full skill gives the whole strength
    s.trust.err_ppm, s.trust.err_base = 0.0, 1.0
    assert s.prior_strength() == 64
    with pytest.raises(ConfigError, match="selection.ppm_prior_strength"):
        with_values(Config(), **{"selection.ppm_prior_strength": 0})


def test_build_sampler_takes_the_acquisition_and_prior_from_the_config():
    from rlstream.config import Config, ConfigError, with_values
    from rlstream.trainers.selection.registry import build_sampler

    pool = synthetic_pool(20)
    cfg = with_values(Config(), **{"selection.ppm_features": "text"})
    s = build_sampler(cfg, pool, None)
    assert (s.args.acquisition, s.args.prior) == ("expected", "fit")  # the defaults
    assert s.prior_strength() == s.args.min_prior_strength  # fitted: nothing seen yet
    old = with_values(
        cfg, **{"selection.ppm_acquisition": "thompson", "selection.ppm_prior": "skill"}
    )
    s = build_sampler(old, pool, None)
    assert (s.args.acquisition, s.args.prior) == ("thompson", "skill")
    for field, value in (("ppm_acquisition", "greedy"), ("ppm_prior", "fixed")):
        with pytest.raises(ConfigError, match=f"selection.{field}: '{value}' is not one of"):
            with_values(Config(), **{f"selection.{field}": value})
