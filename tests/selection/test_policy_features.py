"""The PPM's policy featurizers and the bench's arm names (`ppm:<featurizers>`)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from rlstream.config import Config, ConfigError, ModelConfig, load_config
from rlstream.trainers.envs.base import make_prompt
from rlstream.trainers.policy import build_policy
from rlstream.trainers.selection.bench import BenchArgs
from rlstream.trainers.selection.loop import arm_spec
from rlstream.trainers.selection.policy_features import reference_likelihood


def _naive_probability(policy, text: str, answer: str, temperature: float) -> float:
    """Token by token on the unpadded sequence: prod_t softmax(logits / T)[next token]."""
    tok, p = policy.tok, 1.0
    seq = tok.encode(text)
    for nxt in tok.encode(answer + "\n"):
        logits = policy.model(torch.tensor([seq]))[0, -1] / temperature
        p *= float(torch.softmax(logits, -1)[nxt])
        seq.append(nxt)
    return p


@torch.no_grad()
def test_reference_likelihood_is_the_probability_of_sampling_the_answer():
    torch.manual_seed(0)
    policy = build_policy(ModelConfig(n_layer=2, n_head=2, n_embd=32, block_size=32))
    # prompts and answers of several lengths: the batched pass groups them by total length
    rows = [("1+2=", "3"), ("12+30=", "42"), ("7-5=", "2"), ("99+1=", "100"), ("3+4=", "07")]
    prompts = [make_prompt("add", t, a, 1) for t, a in rows]
    for temperature in (1.0, 0.5):
        got = reference_likelihood(policy, prompts, temperature, max_new_tokens=8)
        want = [_naive_probability(policy, t, a, temperature) for t, a in rows]
        np.testing.assert_allclose(got[:, 0], want, rtol=1e-4)
        np.testing.assert_allclose(got[:, 1] * 8, np.log(want), rtol=1e-4)
        n_tokens = np.array([len(a) + 1 for _, a in rows])
        assert (got[:, 2] * 4 <= got[:, 1] * 8 / n_tokens + 1e-5).all()  # min token <= mean
    # an answer longer than the completion budget can never be sampled
    long = reference_likelihood(policy, prompts[3:4], 1.0, max_new_tokens=3)
    assert long[0, 0] == 0.0 and long[0, 1] == pytest.approx(-30 / 8)


def test_arm_names_pick_the_ppm_featurizers():
    a = load_config(None, ["selection.ppm_features=reference"])
    assert arm_spec("ppm", a) == ("ppm", ["reference"])
    assert arm_spec("ppm:confidence,text", a) == ("ppm", ["confidence", "text"])
    assert arm_spec("uniform", a)[0] == "uniform"
    with pytest.raises(ValueError, match="only ppm takes featurizers"):
        arm_spec("greso:text", a)
    with pytest.raises(ValueError, match="ppm_features"):
        arm_spec("ppm:pixels", a)
    assert arm_spec("ppm", load_config(None, ["ppm_features=hidden,text"])) == (
        "ppm",
        ["hidden", "text"],
    )  # a plain `ppm` takes the config's featurizers
    with pytest.raises(ValueError, match="unknown 'gps'"):
        BenchArgs(samplers="uniform,gps")
    with pytest.raises(ConfigError, match="selection.ppm_features"):
        load_config(None, ["selection.ppm_features=pixels"])


def test_auto_features_follow_the_answer_format():
    # `auto` stays in the config (a later --format changes what it means) and resolves at use
    direct = load_config(None, [])
    cot = load_config(None, ["data.format=cot", "model.block_size=96"])
    assert direct.selection.ppm_features == cot.selection.ppm_features == "auto"
    assert arm_spec("ppm", direct) == ("ppm", ["confidence"])
    assert arm_spec("ppm", cot) == ("ppm", ["confidence"])
    assert arm_spec("ppm:hidden", cot) == ("ppm", ["hidden"])  # a named arm keeps its own
    pinned = load_config(None, ["selection.ppm_features=minilm,hidden"])
    assert arm_spec("ppm", pinned) == ("ppm", ["minilm", "hidden"])


def test_bench_args_write_steps_and_task_into_the_shared_config():
    b = BenchArgs(samplers="uniform,ppm", steps=7, task="add")
    assert b.train.rl.steps == 7 and b.train.data.tasks == "add"
    assert b.train.pretrain.max_steps == 1000 and isinstance(b.train, Config)


@torch.no_grad()
def test_scoring_counts_the_policy_tokens_it_reads_and_keeps_them_refresh_every_versions():
    from rlstream.trainers.selection.compute import Compute, measure_prefill_ratio
    from rlstream.trainers.selection.policy_features import greedy_confidence, last_token_hidden
    from rlstream.trainers.selection.registry import build_sampler, policy_moved

    torch.manual_seed(0)
    policy = build_policy(ModelConfig(n_layer=2, n_head=2, n_embd=32, block_size=32))
    prompts = [make_prompt("add", f"{a}+{b}=", str(a + b), 1) for a in range(4) for b in (7, 12)]
    lengths = [len(e) for e in policy.tok.encode_prompts([p.text for p in prompts])]
    cost = Compute()
    last_token_hidden(policy, prompts, cost)
    assert cost.as_dict() == {"decoded": 0, "prefilled": sum(lengths)}  # one pass, no decode
    greedy_confidence(policy, prompts, 6, cost)
    assert cost.prefilled == 2 * sum(lengths) and 0 < cost.decoded <= 6 * len(prompts)
    ratio, detail = measure_prefill_ratio(policy, [p.text for p in prompts], 4, repeats=1)
    assert ratio > 0 and detail["prompts"] == len(prompts)
    # through the sampler: the hidden PPM reads the policy again only every 3 versions
    cfg = load_config(None, ["selection.ppm_features=hidden", "selection.ppm_refresh_every=3",
                             "selection.ppm_candidates=8"])  # fmt: skip
    sampler = build_sampler(cfg, prompts, lambda: policy)
    spent = []
    for step in range(6):
        sampler.select(step, 4)
        spent.append(sampler.compute.prefilled)
        policy_moved(sampler)
    new = [b - a for a, b in zip([0, *spent], spent, strict=False)]
    # every step scores all 8 prompts: read at versions 0 and 3, from the cache in between
    assert new == [sum(lengths), 0, 0, sum(lengths), 0, 0]
    # the confidence decode stops where selection.ppm_confidence_tokens says
    cfg = load_config(None, ["selection.ppm_features=confidence", "selection.ppm_candidates=8",
                             "selection.ppm_confidence_tokens=2"])  # fmt: skip
    sampler = build_sampler(cfg, prompts, lambda: policy)
    sampler.select(0, 4)
    assert 0 < sampler.compute.decoded <= 2 * len(prompts)
    with pytest.raises(ConfigError, match="ppm_refresh_every"):
        load_config(None, ["selection.ppm_refresh_every=-1"])


@torch.no_grad()
def test_a_short_list_scores_only_the_candidates_that_picks_and_expiries_freed():
    from rlstream.trainers.selection.registry import build_sampler, policy_moved

    torch.manual_seed(0)
    policy = build_policy(ModelConfig(n_layer=2, n_head=2, n_embd=32, block_size=32))
    prompts = [make_prompt("add", f"{a}+{b}=", str(a + b), 1) for a in range(32) for b in (7, 12)]
    spent = {}
    for shortlist in ("false", "true"):
        cfg = load_config(None, ["selection.ppm_features=hidden", "selection.ppm_refresh_every=3",
                                 "selection.ppm_candidates=8", "selection.sampler=ppm",
                                 f"selection.ppm_shortlist={shortlist}"])  # fmt: skip
        sampler = build_sampler(cfg, prompts, lambda: policy)
        for step in range(6):
            picked = {p.prompt_id for p in sampler.select(step, 2)}
            listed = {sampler.pool[p].prompt_id for p in sampler.shortlist}
            assert sampler.screened == 8 and not picked & listed
            # a pick off the list (the uniform share) leaves the list one longer
            if shortlist == "true":
                assert 8 - len(picked) <= len(listed) <= 8
            else:
                assert not listed
            policy_moved(sampler)
        spent[shortlist] = sampler.compute.prefilled
    # 8 candidates a round either way; with the list, only the freed places are read anew
    assert 0 < spent["true"] < 0.75 * spent["false"]


@torch.no_grad()
def test_prefill_features_are_the_first_answer_tokens_distribution_from_one_pass():
    from rlstream.trainers.selection.compute import Compute
    from rlstream.trainers.selection.policy_features import last_token_hidden, prefill_features

    torch.manual_seed(0)
    policy = build_policy(ModelConfig(n_layer=2, n_head=2, n_embd=32, block_size=32))
    pairs = [(a, b) for a in (1, 22, 333) for b in (4, 55)]
    prompts = [make_prompt("add", f"{a}+{b}=", str(a + b), 1) for a, b in pairs]
    cost = Compute()
    got = prefill_features(policy, prompts, cost)
    assert got.shape == (6, 2 + 32) and cost.decoded == 0  # one pass, nothing decoded
    np.testing.assert_allclose(got[:, 2:], last_token_hidden(policy, prompts), rtol=1e-5)
    for i, p in enumerate(prompts):  # each prompt alone, unbatched
        x = torch.tensor([policy.tok.encode_prompts([p.text])[0]])
        probs = policy.model.lm(input_ids=x).logits[0, -1].softmax(-1)
        assert got[i, 0] == pytest.approx(float(probs.max()), rel=1e-4)
        entropy = float(-(probs * probs.log()).sum() / np.log(len(probs)))
        assert got[i, 1] == pytest.approx(entropy, rel=1e-4)
