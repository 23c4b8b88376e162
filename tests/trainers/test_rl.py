import copy

import pytest
import torch

from rlstream.config import ModelConfig, RLConfig
from rlstream.trainers.algos import compute_gae
from rlstream.trainers.backend import make_adamw, make_backend
from rlstream.trainers.lm import Tokenizer, build_model
from rlstream.trainers.rl import ADVANTAGES, Experience, Learner, collate, register_advantage
from rlstream.trainers.sampling import sample

TOK = Tokenizer.char()


def _setup(algo="grpo", **kw):
    torch.manual_seed(0)
    cfg = ModelConfig(block_size=24, n_layer=2, n_head=2, n_embd=32)
    model = build_model(cfg, TOK, value_head=algo == "ppo")
    backend = make_backend(model, make_adamw(model, 1e-3), "torch")
    ref = copy.deepcopy(model).requires_grad_(False)
    return model, Learner(backend, ref, RLConfig(algo=algo, **kw), TOK.pad_id)


def _experience(model, version=0, prompts=("12+34=", "5-3=")):
    s = sample(
        model, TOK, list(prompts), n=4, max_new_tokens=5, generator=torch.Generator().manual_seed(0)
    )
    rewards = [float(i % 2) for i in range(len(s.texts))]  # every group has variance
    groups = [prompts[i] for i in s.prompt_index]
    return Experience(
        s.prompt_tokens, s.tokens, s.logprobs, rewards, groups, [version] * len(groups)
    )


def test_collate_masks_completion_tokens_only():
    exp = Experience(
        [[5, 6, 7], [5]],
        [[8, 1], [9, 9, 1]],
        [[-0.1, -0.2], [-1, -2, -3]],
        [1.0, 0.0],
        ["a", "b"],
        [0, 0],
    )
    b = collate(exp, TOK.pad_id)
    assert b["tokens"].tolist() == [[5, 6, 7, 8, 1], [5, 9, 9, 1, 0]]
    assert b["mask"].tolist() == [[0, 0, 1, 1], [1, 1, 1, 0]]
    expected = torch.tensor([[0, 0, -0.1, -0.2], [-1, -2, -3, 0]])
    assert torch.allclose(b["old_logp"], expected)


@pytest.mark.parametrize("algo", ["grpo", "ppo"])
def test_step_changes_parameters_and_reports(algo):
    model, learner = _setup(algo, update_epochs=2, num_minibatches=2, kl_coef=0.1)
    before = [p.detach().clone() for p in model.parameters()]
    m = learner.step(_experience(model))
    assert learner.version == 1 and m["version"] == 0
    assert all(k in m for k in ("loss", "pg_loss", "kl", "entropy", "clipfrac", "reward"))
    assert any(not torch.equal(a, b) for a, b in zip(before, model.parameters(), strict=True))
    if algo == "ppo":
        assert "value_loss" in m


def test_on_policy_first_update_has_unit_ratio_and_zero_kl():
    model, learner = _setup("grpo")
    m = learner.step(_experience(model))
    assert m["clipfrac"] == 0.0 and m["kl"] == pytest.approx(0.0, abs=1e-6)


def test_stale_groups_are_split_off_and_counted():
    model, learner = _setup("grpo", max_policy_lag=2)
    learner.version = 5
    fresh, stale = _experience(model, version=4), _experience(model, 2, prompts=("7+7=", "9-1="))
    kept, n_stale = learner.split_stale(fresh.concat(stale))
    assert n_stale == 2 and set(kept.group_ids) == set(fresh.group_ids)
    assert kept.completion_tokens == fresh.completion_tokens
    m = learner.step(kept)
    assert learner.version == 6 and "dropped_groups" not in m
    assert m["tokens"] == sum(len(t) for t in fresh.completion_tokens)
    left, n_stale = learner.split_stale(stale)
    assert n_stale == 2 and len(left) == 0
    m = learner.step(left)  # nothing left: no update, version unchanged
    assert learner.version == 6 and m["loss"] != m["loss"]  # nan


def test_step_does_not_filter_stale_rows_itself():
    model, learner = _setup("grpo", max_policy_lag=0)
    learner.version = 3
    exp = _experience(model, version=0)
    m = learner.step(exp)  # the caller (core.rl_update) decides what is stale
    assert learner.version == 4 and m["tokens"] == sum(len(t) for t in exp.completion_tokens)


def test_advantage_registry_rejects_a_duplicate_name():
    assert {"grpo", "ppo"} <= set(ADVANTAGES)
    before = ADVANTAGES["grpo"]
    with pytest.raises(ValueError, match="grpo"):
        register_advantage("grpo")(lambda b, values, cfg: (b["rewards"], None))
    assert ADVANTAGES["grpo"] is before


def test_a_registered_advantage_is_used_by_the_learner():
    def constant(b, values, cfg):
        return torch.full_like(b["rewards"], 2.0), None

    register_advantage("constant_test")(constant)
    try:
        model, learner = _setup("grpo")
        learner.args.algo = "constant_test"  # after RLConfig's own check of the name
        m = learner.step(_experience(model))
        # on-policy the ratio is 1, so the surrogate is -A = -2 (grpo's group-normalised ~0)
        assert m["pg_loss"] == pytest.approx(-2.0, abs=1e-4) and learner.version == 1
    finally:
        del ADVANTAGES["constant_test"]


def test_hybrid_lm_loss_is_mixed_in():
    from rlstream.trainers.pretrain import Corpus

    model, learner = _setup("grpo")
    corpus = Corpus(["12+34=64\n", "5-3=2\n"], TOK, 24)
    lm = corpus.batch(4, torch.Generator().manual_seed(0))
    m = learner.step(_experience(model), lm_batch=lm)
    assert m["lm_loss"] > 0
    corpus.extend(["1+1=2\n"] * 2000)  # grows past its initial capacity
    assert len(corpus) == 2002


def test_ppo_credits_an_episodes_reward_at_the_end_of_the_turn_that_earned_it():
    """Two policy turns around an environment's answer (loss mask 0): the reward the first
    turn earned sits on its last token, so with discounting its tokens get more credit than
    when the same reward comes only at the end; a row without turn rewards keeps the whole
    reward at its last token."""
    prompt, completion = [5, 6], [8, 9, 1, 30, 31, 10, 1]  # turn, answer (masked), turn
    mask = [1, 1, 1, 0, 0, 1, 1]
    rows = [
        Experience([prompt], [completion], [[-0.5] * 7], [1.0], ["g"], [0], [mask], [turns])
        for turns in ([1.0, 0.0], [0.0, 1.0], None)
    ]
    batches = [collate(r, TOK.pad_id) for r in rows]
    first, last, plain = (b["token_rewards"][0].tolist() for b in batches)
    assert first == [0, 0, 0, 1.0, 0, 0, 0, 0] and last == plain == [0, 0, 0, 0, 0, 0, 0, 1.0]
    args = RLConfig(algo="ppo", gamma=0.5, lam=1.0)
    advantages = []
    for b in batches:
        mask_t = b["mask"]
        adv, _ = compute_gae(b["token_rewards"], torch.zeros_like(mask_t), mask_t, 0.5, 1.0)
        advantages.append(adv[0, 1].item())  # the first turn's first token
    assert advantages[0] > advantages[1] == advantages[2] > 0
    assert ADVANTAGES["ppo"](batches[0], torch.zeros_like(batches[0]["mask"]), args)[0].shape == (
        1,
        8,
    )


def test_experience_rows_carry_their_turn_rewards():
    row = {"prompt_tokens": [1], "completion_tokens": [2], "logprobs": [-1.0], "reward": 1.0}
    row |= {"request_id": "r", "policy_version": 0, "loss_mask": [1], "turn_rewards": [1.0]}
    assert Experience.from_rows([row]).turn_rewards == [[1.0]]
