"""The fuzzer's messages (pure): every defect class fails where its owners look — the codec, or
the row checks each owner applies — and another run's rows pass both (they are left alone).
The live loop's dead-lettering of them is in tests/integration/test_prometheus.py."""

from __future__ import annotations

import asyncio
from dataclasses import replace

import pytest

from rlstream.config import Config
from rlstream.ops.reliability import fuzz
from rlstream.ops.reliability import fuzz_messages as fm
from rlstream.schemas import DecodeError, decode
from rlstream.streams.rollout_worker import request_problem
from rlstream.trainers.experience import RowLimits, keep_rows_of_run, row_problem
from rlstream.trainers.lm import load_tokenizer

CFG = replace(Config(), run_id="fuzz-unit")


def test_the_plan_cycles_through_every_defect_and_topic_pair():
    pairs = set(fm.plan(1000, seed=3))
    assert len(pairs) == len(set(fm.plan(82, seed=3))) == 82
    assert fm.plan(50, seed=3) == fm.plan(50, seed=3) != fm.plan(50, seed=4)
    assert {e for _, e in pairs} == set(fm.OWNERS) | set(fm.FOLLOWED)
    assert {c for c, _ in pairs} == set(fm.ENCODING) | set(fm.ROWS) | {"other_run"}


@pytest.mark.parametrize("seed", [0, 1])
def test_every_message_is_refused_by_the_checks_its_owners_apply(seed):
    tok = load_tokenizer(CFG.model)
    full = RowLimits(tok.vocab_size, CFG.model.block_size, CFG.rl.group_size)
    scheduler = RowLimits(group_size=CFG.rl.group_size)
    for m in fm.messages(CFG, 400, seed):
        expect = (m.event,) if m.event in fm.OWNERS else None
        if m.cls in fm.ENCODING:
            with pytest.raises(DecodeError):
                decode(m.value, m.headers, expect=expect)
            continue
        (row,) = decode(m.value, m.headers, expect=expect).to_pylist()
        if m.cls == "other_run":
            assert row["run_id"] == fm.OTHER_RUN and not m.owners
        elif m.event == "rollout_requests":
            assert request_problem(row, tok, CFG), m.cls
        else:
            assert row_problem(row, full), (m.cls, m.event)
            if m.event == "rewards":  # the scheduler knows only the group size
                assert row_problem(row, scheduler), m.cls


def test_outcomes_are_judged_by_the_owners_dead_letters():
    owned = fm.FuzzMessage("nan_reward", "rewards", b"", [], ("processors", "scheduler"))
    assert fuzz._outcome(owned, {"processors", "scheduler"}) == "dead_lettered"
    assert fuzz._outcome(owned, {"processors"}) == "missed"  # the scheduler said nothing
    other = fm.FuzzMessage("other_run", "rewards", b"", [], ())
    assert fuzz._outcome(other, set()) == "left_alone"
    assert fuzz._outcome(other, {"scheduler"}) == "dead_lettered_wrongly"
    followed = fm.FuzzMessage("random_bytes", "corpus", b"", [], ())
    assert fuzz._outcome(followed, set()) == "skipped_by_readers"
    assert fuzz._kind_of("rlstream-r1-rollout-workers/rollouts-2", "r1") == "rollout-workers"
    assert fuzz._kind_of("rlstream-r1-scheduler", "r1") == "scheduler"


def test_rows_of_the_run_are_checked_against_its_limits():
    limits = RowLimits(vocab_size=50, block_size=32, group_size=4)
    reward = {"request_id": "r", "sample_idx": 1, "group_size": 4, "reward": 0.5}
    assert row_problem(reward, limits) is None
    assert "the run's requests ask for 4" in row_problem(reward | {"group_size": 8}, limits)
    assert "outside 1..1024" in row_problem(reward | {"group_size": 0}, limits)
    assert "sample_idx 4 is outside" in row_problem(reward | {"sample_idx": 4}, limits)
    rollout = reward | {"prompt_tokens": [1], "completion_tokens": [], "logprobs": []}
    assert "no completion tokens" in row_problem(rollout, limits)
    assert "token id -1 is outside the vocabulary" in row_problem(
        rollout | {"completion_tokens": [-1], "logprobs": [0.0]}, RowLimits()
    )  # no vocabulary known: negative ids are still refused


def test_only_the_runs_good_rows_are_kept_and_each_bad_one_is_refused_with_its_index():
    limits = RowLimits(group_size=4)
    rows = [{"run_id": "r1", "reward": 1.0}, {"run_id": "r2", "reward": float("nan")},
            {"run_id": "r1", "reward": float("inf")}, {"run_id": "r1", "reward": 0.0}]  # fmt: skip
    refused = []

    async def refuse(i, row, problem):
        refused.append((i, problem))

    def keep(run_id):
        check = lambda row: row_problem(row, limits)  # noqa: E731
        return asyncio.run(keep_rows_of_run(rows, run_id, check, refuse))

    assert keep("r1") == [rows[0], rows[3]]  # r2's NaN is another run's: dropped, not refused
    assert refused == [(2, "reward inf is not finite")]
    refused.clear()
    assert keep(None) == [rows[0], rows[3]] and [i for i, _ in refused] == [1, 2]


def test_readers_of_a_topic_take_only_its_event():
    """`rlstream run`'s own figures read the topics too: a rewards event on rl.prompts.v1 ended
    the fuzzed benchmark run with a KeyError in its summary (fixed: `carried_by`)."""
    from rlstream.connectors.reading import carried_by
    from rlstream.schemas import get

    assert carried_by(get("prompts").topic) == ("prompts",)
    assert carried_by("rl.rewards.v1.rescored") is None  # a derived topic: any kind
    rng = __import__("random").Random(0)
    wrong = fm.build("wrong_topic", "prompts", CFG, rng, 0)
    with pytest.raises(DecodeError, match="a 'rewards' event where this consumer takes"):
        decode(wrong.value, wrong.headers, expect=carried_by(get("prompts").topic))
