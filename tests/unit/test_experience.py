"""The processors' pure functions: scoring rollouts and assembling experience groups."""

from __future__ import annotations

import random

import pytest

from rlstream.ops.launcher.figures import latency
from rlstream.trainers.envs import get_task
from rlstream.trainers.experience import assemble_experience, complete_groups, score_rollouts


def _rollouts(completions: list[str], request_id: str = "r1") -> list[dict]:
    prompt = get_task("add").generate(random.Random(3), 2)
    return [
        {
            "run_id": "t",
            "policy_version": 5,
            "request_id": request_id,
            "prompt_id": prompt.prompt_id,
            "sample_idx": i,
            "group_size": len(completions),
            "task": "add",
            "prompt_text": prompt.text,
            "difficulty": 2,
            "answer": prompt.answer,
            "prompt_tokens": [1],
            "completion": c,
            "completion_tokens": [2, 3],
            "logprobs": [-0.1, -0.2],
        }
        for i, c in enumerate(c.replace("ANSWER", prompt.answer) for c in completions)
    ]


def test_score_rollouts_verifies_and_keeps_the_producing_version():
    rows = _rollouts(["ANSWER", "0", "ANSWER", "12"])
    rewards = score_rollouts(rows)
    assert [r["reward"] for r in rewards] == [1.0, 0.0, 1.0, 0.0]
    assert [r["correct"] for r in rewards] == [True, False, True, False]
    assert {r["policy_version"] for r in rewards} == {5}
    again = score_rollouts(rows)
    assert [r["event_id"] for r in again] == [r["event_id"] for r in rewards]
    other = score_rollouts(rows, verifier="v2")
    assert not {r["event_id"] for r in other} & {r["event_id"] for r in rewards}


def test_score_rollouts_with_a_reward_function():
    rows = _rollouts(["ANSWER", "0"])
    rewards = score_rollouts(rows, reward_fn=lambda completions, **kw: [0.25] * len(completions))
    assert [r["reward"] for r in rewards] == [0.25, 0.25]
    assert [r["correct"] for r in rewards] == [True, False]  # correctness is the verifier's


def test_complete_groups_deduplicates_and_waits_for_all_samples():
    rows = _rollouts(["ANSWER", "0", "1"])
    complete, partial = complete_groups(rows[:2] + rows[:1])
    assert complete == {} and [r["sample_idx"] for r in partial["r1"]] == [0, 1]
    complete, _ = complete_groups(rows + rows[1:2])
    assert [r["sample_idx"] for r in complete["r1"]] == [0, 1, 2]


def test_assemble_experience_joins_rewards_in_sample_order():
    rows = _rollouts(["ANSWER", "0", "0", "0"])
    exp = assemble_experience(rows[::-1], score_rollouts(rows))
    assert [r["sample_idx"] for r in exp] == [0, 1, 2, 3]
    assert [r["reward"] for r in exp] == [1.0, 0.0, 0.0, 0.0]
    assert [r["correct"] for r in exp] == [True, False, False, False]
    assert all("advantage" not in r for r in exp)  # advantages are the trainer's (rl.experience.v2)
    assert {r["policy_version"] for r in exp} == {5} and exp[0]["logprobs"] == [-0.1, -0.2]
    flat = assemble_experience(rows, score_rollouts(_rollouts(["0", "0", "0", "0"])))
    assert [r["reward"] for r in flat] == [0.0] * 4
    with pytest.raises(ValueError, match="no reward for samples \\[3\\]"):
        assemble_experience(rows, score_rollouts(rows)[:3])


def test_latency_percentiles():
    from datetime import UTC, datetime, timedelta

    t0 = datetime(2026, 1, 1, tzinfo=UTC)
    requests = [{"request_id": f"r{i}", "produced_at": t0} for i in range(100)]
    experience = [
        {"request_id": f"r{i}", "produced_at": t0 + timedelta(milliseconds=i + 1)}
        for i in range(100)
    ] + [{"request_id": "r0", "produced_at": t0}]
    figures = latency(requests, experience)
    assert figures["request_to_experience_p50_ms"] == pytest.approx(50.5, abs=0.6)
    assert figures["request_to_experience_p99_ms"] == pytest.approx(99.0, abs=1.1)


def test_a_redelivered_copy_of_a_group_never_mixes_with_the_first():
    """A worker killed before its commit rolls the request again: the assembler may see both
    copies' rollouts before either's rewards. The first copy wins on both sides, so every
    completion keeps its own reward, and once done the request drops all later rows."""
    from rlstream.streams.processors import _complete, _load, absorb

    first, second = _rollouts(["ANSWER", "0"]), _rollouts(["0", "ANSWER"])
    for row in second:
        row["completion_tokens"] = [9, 9, 9]
    held = _load(None)
    assert absorb(held, "rollouts", first) == 0
    assert absorb(held, "rollouts", second) == 2
    assert _complete(held) is None
    assert absorb(held, "rewards", score_rollouts(first)) == 0
    group = _complete(held)
    assert [(r["completion_tokens"], r["reward"]) for r in group] == [([2, 3], 1.0), ([2, 3], 0.0)]
    assert absorb(held, "rewards", score_rollouts(second)) == 2
    done = {"done_at": 1.0, "partition": 0}
    assert absorb(done, "rollouts", second) == 2 and "rollouts" not in done


def test_a_failing_verifier_gives_its_group_reward_zero_and_a_reason():
    """One group per failure mode, scored with the others: the good groups keep their
    rewards; a raising, hanging or garbage-returning function zeroes only its own group."""
    import time

    from rlstream.trainers.experience import Scorer

    def fn(completions, prompt_id, **kwargs):
        if "hang" in prompt_id[0]:
            time.sleep(3)
        if "raise" in prompt_id[0]:
            raise RuntimeError("no network")
        if "garbage" in prompt_id[0]:
            return ["x"] * len(completions)
        return [1.0] * len(completions)

    rows = []
    for name in ("ok", "raise", "hang", "garbage", "ok2"):
        for row in _rollouts(["ANSWER", "0"], request_id=name):
            rows.append(row | {"prompt_id": name})
    scorer = Scorer(fn, "v", timeout_s=0.5)
    started = time.monotonic()
    rewards, failures = scorer.score(rows)
    assert time.monotonic() - started < 2.5  # the hung call was abandoned at the timeout
    by_request = {r["request_id"]: r["reward"] for r in rewards}
    assert len(rewards) == len(rows) and by_request == {
        "ok": 1.0, "raise": 0.0, "hang": 0.0, "garbage": 0.0, "ok2": 1.0
    }  # fmt: skip
    reasons = {request: reason for _, request, reason in failures}
    assert "no network" in reasons["raise"] and "timed out after 0.5 s" in reasons["hang"]
    assert "not numbers" in reasons["garbage"]
    assert [start for start, _, _ in failures] == [2, 4, 6]  # first row of each failed group
    failed = [r for r in rewards if r["request_id"] == "raise"]
    assert all(r["details"].startswith("verifier failed") and not r["correct"] for r in failed)
