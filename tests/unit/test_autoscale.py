"""The rollout workers' scaling decision (pure: backlog samples and times given) and the range
the config takes."""

from __future__ import annotations

from rlstream.config import Config, with_values
from rlstream.ops.launcher.autoscale import Autoscaler


def scaler(**over) -> Autoscaler:
    args = dict(low=1, high=4, lag_per_worker=8, up_after_s=10.0, down_after_s=30.0) | over
    return Autoscaler(**args)


def test_the_wanted_workers_are_the_backlog_over_a_workers_share_within_the_range():
    s = scaler()
    assert [s.wanted(lag) for lag in (0, 1, 8, 9, 24, 25, 1000)] == [1, 1, 1, 2, 3, 4, 4]


def test_a_worker_is_added_only_once_the_backlog_held_for_the_up_time():
    s = scaler()
    assert s.decide(1, 40, now=0.0) == 0
    assert s.decide(1, 40, now=9.9) == 0
    assert s.decide(1, 40, now=10.0) == 1
    # the next one waits its own hold, one worker at a time
    assert s.decide(2, 40, now=10.5) == 0
    assert s.decide(2, 40, now=20.5) == 1


def test_a_backlog_that_drops_back_resets_the_hold():
    s = scaler()
    assert s.decide(1, 40, now=0.0) == 0
    assert s.decide(1, 3, now=5.0) == 0  # met by one worker again
    assert s.decide(1, 40, now=12.0) == 0  # a new hold from 12
    assert s.decide(1, 40, now=22.0) == 1


def test_a_worker_is_retired_after_the_longer_down_time_and_never_below_the_minimum():
    s = scaler()
    assert s.decide(3, 0, now=0.0) == 0
    assert s.decide(3, 0, now=29.0) == 0
    assert s.decide(3, 0, now=30.0) == -1
    assert s.decide(1, 0, now=100.0) == 0  # at MIN
    assert scaler(low=2).decide(2, 0, now=1e6) == 0


def test_the_config_takes_a_fixed_count_or_an_auto_range():
    fixed = with_values(Config(), **{"loop.rollout_workers": 3})
    assert fixed.loop.worker_range == (3, 3) and not fixed.loop.autoscaled
    auto = with_values(Config(), **{"loop.rollout_workers": "auto:1-4"})
    assert auto.loop.worker_range == (1, 4) and auto.loop.autoscaled
