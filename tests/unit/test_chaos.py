"""`rlstream chaos`'s pure parts: the fault schedule, the verdict, the figures over runs and
the MTBF bound. The loop under faults is tests/integration/test_chaos.py."""

from __future__ import annotations

from collections import Counter

import pytest

from rlstream.config import Config, with_values
from rlstream.ops.reliability.chaos import (
    FAULT_KINDS,
    ChaosArgs,
    ChaosError,
    check_cluster,
    default_kinds,
    environment_of,
    schedule,
)
from rlstream.ops.reliability.chaos_figures import combine, mtbf, survived


def test_the_schedule_cycles_every_kind_evenly_and_is_seeded():
    faults = schedule(ChaosArgs(faults=20, seed=3), workers=2)
    counts = Counter(f.kind for f in faults)
    assert set(counts) == set(FAULT_KINDS) and max(counts.values()) - min(counts.values()) <= 1
    assert [f.kind for f in faults] == [f.kind for f in schedule(ChaosArgs(faults=20, seed=3), 2)]
    assert [f.kind for f in faults] != [f.kind for f in schedule(ChaosArgs(faults=20, seed=4), 2)]
    targets = {f.kind: set() for f in faults}
    for f in faults:
        targets[f.kind].add(f.target)
    assert targets["kill:rollouts"] | targets["stop:rollouts"] == {"rollouts-1", "rollouts-2"}
    assert targets["kill:trainer@checkpoint"] == {"trainer"}
    assert targets["s3-down"] == {"s3"} and targets["qdrant-down"] == {"qdrant"}
    assert targets["kill:env"] == {"env"}


def test_kill_env_applies_where_the_runs_tasks_play_an_environment():
    plain = Config()  # add,sub: single-turn tasks, no environment to kill
    assert "kill:env" not in default_kinds(plain)
    with pytest.raises(ChaosError, match="data.tasks=add,sub,calc"):
        environment_of(plain)
    mixed = with_values(Config(), **{"data.tasks": "add,guess@1,calc"})
    assert environment_of(mixed) == "user" and "kill:env" in default_kinds(mixed)


def test_kill_leader_applies_on_a_three_node_kafka_cluster_only(monkeypatch):
    monkeypatch.delenv("RLSTREAM_STACK_BROKER", raising=False)
    monkeypatch.delenv("RLSTREAM_STACK_NODES", raising=False)
    mixed = with_values(Config(), **{"data.tasks": "add,guess@1,calc"})
    assert set(default_kinds(mixed, "kafka", 3)) == set(FAULT_KINDS) - {"kill:trainer-1"}
    ranked = with_values(mixed, **{"loop.trainer_ranks": 2})  # a rank besides rank 0 to kill
    assert set(default_kinds(ranked, "kafka", 3)) == set(FAULT_KINDS)
    for broker, nodes in (("kafka", 1), ("tansu", None), (None, None)):
        assert "kill:leader" not in default_kinds(mixed, broker, nodes)
        with pytest.raises(ChaosError, match="--broker kafka --nodes 3"):
            check_cluster(broker, nodes)


def _run(**over) -> dict:
    r = {"faults": 12, "fault_kinds": ["kill:trainer"], "unrecovered_faults": 0,
         "experience_lost": 0, "trained_twice": 0, "archive_matches_published": True,
         "completed": True, "fault_log": [{"recovery_s": 10.0}, {"recovery_s": 30.0}]}  # fmt: skip
    r |= over
    return r | {"survived": survived(r)}


@pytest.mark.parametrize(
    "change",
    [
        {"experience_lost": 1},
        {"trained_twice": 2},
        {"completed": False},
        {"archive_matches_published": False},
        {"unrecovered_faults": 1},
    ],  # fmt: skip
)
def test_any_loss_duplicate_or_unrecovered_fault_fails_the_run(change):
    assert _run()["survived"] and not _run(**change)["survived"]


def test_combined_figures_sum_counts_and_take_percentiles_over_every_fault():
    both = combine([_run(), _run(fault_kinds=["s3-down"], experience_lost=1)])
    assert both["faults"] == 24 and both["fault_kinds"] == ["kill:trainer", "s3-down"]
    assert both["experience_lost"] == 1 and not both["survived"]
    assert both["recovery_p50_s"] == 20.0 and both["recovery_p99_s"] == 30.0


def test_mtbf_bound_is_the_rule_of_three_without_failures():
    bound = mtbf([_run(faults=30), _run(faults=30)], fault_rate_per_h=1.0)
    assert bound["p_not_survived_95"] == pytest.approx(1 - 0.05 ** (1 / 60), abs=1e-4)
    assert bound["p_not_survived_95"] == pytest.approx(3 / 60, rel=0.05)  # the rule of three
    assert bound["mtbf_lower_bound_h"] == pytest.approx(20.5, abs=0.1)
    assert mtbf([_run(faults=30)], fault_rate_per_h=0.1)["mtbf_lower_bound_h"] > 72
    failed = mtbf([_run(faults=30), _run(faults=30, experience_lost=2)], fault_rate_per_h=1.0)
    assert failed["faults_not_survived"] == 1 and failed["mtbf_lower_bound_h"] < 20.0


def test_a_fault_the_run_finished_during_is_not_counted_unrecovered():
    from rlstream.ops.reliability.chaos import Fault
    from rlstream.ops.reliability.chaos_figures import unrecovered

    assert unrecovered(Fault("s3-down", "s3", injected=1.0))
    assert not unrecovered(Fault("s3-down", "s3", injected=1.0, recovered=9.0))
    assert not unrecovered(Fault("s3-down", "s3", injected=1.0, detail={"run_ended_first": True}))
    assert not unrecovered(Fault("kill:trainer", "trainer"))  # never injected
