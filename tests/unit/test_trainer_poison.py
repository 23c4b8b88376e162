"""What the streaming trainer refuses to train on (a pure check; the live loop's
dead-lettering of such rows is in tests/integration/test_loop.py)."""

from __future__ import annotations

import pytest

from rlstream.schemas import decode, encode, get, rows_to_batch
from rlstream.streams.experience_checks import untrainable

ROW = {"event_id": "e", "request_id": "r", "prompt_id": "p", "sample_idx": 1, "task": "add",
       "prompt_tokens": [5, 6], "completion_tokens": [7, 1], "logprobs": [-0.5, -0.1],
       "reward": 1.0, "correct": True, "policy_version": 3}  # fmt: skip


@pytest.mark.parametrize(
    ("change", "reason"),
    [
        ({"reward": float("nan")}, "reward nan is not finite"),
        ({"reward": float("inf")}, "reward inf is not finite"),
        ({"sample_idx": 4}, "sample_idx 4 is outside a group of 4"),
        ({"sample_idx": -1}, "sample_idx -1 is outside a group of 4"),
        ({"policy_version": -2}, "policy_version -2 is not a version"),
        ({"prompt_tokens": []}, "no prompt tokens"),
        ({"completion_tokens": [7, 99]}, "token id 99 is outside the vocabulary (0..49)"),
        ({"prompt_tokens": [-3, 6]}, "token id -3 is outside the vocabulary"),
        ({"prompt_tokens": list(range(40))}, "42 tokens, more than the context (32)"),
        ({"logprobs": [-0.5]}, "1 logprobs for 2 completion tokens"),
        ({"logprobs": [-0.5, float("-inf")]}, "a logprob is not finite"),
    ],
)
def test_rows_that_would_poison_the_model_are_refused_with_the_reason(change, reason):
    assert untrainable(ROW, vocab_size=50, block_size=32, group_size=4) is None
    assert reason in untrainable(ROW | change, vocab_size=50, block_size=32, group_size=4)


def test_a_nan_reward_survives_the_codec_so_the_trainer_must_check_it():
    event = get("experience")
    row = {k: v for k, v in ROW.items() if k != "policy_version"} | {"reward": float("nan")}
    value, headers = encode(event, rows_to_batch(event, [row], run_id="x", policy_version=0))
    (back,) = decode(value, headers).to_pylist()
    assert back["reward"] != back["reward"]  # NaN


def test_requests_a_worker_cannot_sample_are_refused_with_the_reason():
    from rlstream.config import Config
    from rlstream.streams.rollout_worker import MAX_GROUP_SIZE, request_problem
    from rlstream.trainers.lm import load_tokenizer

    cfg = Config()
    tok = load_tokenizer(cfg.model)
    ok = {"request_id": "r", "text": "12+7=", "group_size": 8}
    assert request_problem(ok, tok, cfg) is None
    for g in (0, -3, MAX_GROUP_SIZE + 1, 2**31 - 1):
        assert f"group_size {g} is outside" in request_problem(ok | {"group_size": g}, tok, cfg)
    assert "alphabet" in request_problem(ok | {"text": "12+7=\u00e9"}, tok, cfg)
    room = cfg.model.block_size - cfg.rl.max_new_tokens
    assert request_problem(ok | {"text": "1" * (room + 5)}, tok, cfg)  # longer than the context
