"""The scheduler's reward groups: each completed group reaches the sampler once, also when the
processors re-score and publish a group again; the memory of completed groups is bounded and
survives the snapshot. No servers: rows are handed to `RewardGroups.add`."""

from __future__ import annotations

from rlstream.streams.selection_stats import RewardGroups
from rlstream.trainers.checkpoint import from_bytes, to_bytes


def rows(request: str, rewards=(1.0, 0.0, 1.0)) -> list[dict]:
    return [{"request_id": request, "prompt_id": f"p-{request}", "sample_idx": i, "reward": r,
             "group_size": len(rewards), "policy_version": 1}
            for i, r in enumerate(rewards)]  # fmt: skip


def test_a_group_completes_once_in_sample_order_whatever_the_arrival_order():
    groups = RewardGroups()
    first, second = rows("a")[2:], rows("a")[:2][::-1]
    assert groups.add(first) == []
    assert groups.add(first) == []  # the same sample again does not fill the group
    [(row, rewards)] = groups.add(second)
    assert row["request_id"] == "a" and rewards == [1.0, 0.0, 1.0]


def test_a_redelivered_group_is_skipped_in_a_later_message_too():
    groups = RewardGroups()
    assert len(groups.add(rows("a"))) == 1
    assert groups.add(rows("a")) == []  # re-scored after a processors restart
    assert groups.add(rows("a")[:1]) == [] and "a" not in groups.partial


def test_the_memory_of_completed_groups_is_bounded_and_oldest_first():
    groups = RewardGroups(kept=3)
    for request in "abcd":
        groups.add(rows(request))
    assert list(groups.completed) == ["b", "c", "d"]
    assert len(groups.add(rows("a"))) == 1  # beyond the window: counted as a new group


def test_partial_and_completed_groups_survive_the_snapshot():
    groups = RewardGroups()
    groups.add(rows("a"))
    groups.add(rows("b")[:1])
    restored = RewardGroups()
    restored.load_state_dict(from_bytes(to_bytes(groups.state_dict())))
    assert restored.add(rows("a")) == []
    [(_, rewards)] = restored.add(rows("b")[1:])
    assert rewards == [1.0, 0.0, 1.0]


def test_an_older_snapshot_of_reward_lists_still_loads():
    restored = RewardGroups()
    restored.load_state_dict({"rewards": {"b": [1.0]}})
    [(_, rewards)] = restored.add(rows("b")[1:])
    assert rewards == [1.0, 0.0, 1.0]
