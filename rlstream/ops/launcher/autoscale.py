"""Rollout workers scaled on the request backlog (`loop.rollout_workers=auto:MIN-MAX`).

The backlog is the consumer lag of the rollout workers' group on rl.rollout_requests.v1:
messages not yet committed past, summed over the partitions (`connectors.kafka.group_lag`), as
KEDA's Kafka scaler reads it for the cluster manifests (`deploy/`). As KEDA does, the wanted
number of workers is the backlog over what one worker is meant to carry
(`loop.autoscale_lag`), between MIN and MAX; a worker is added once that has called for more
for `loop.autoscale_up_s`, and retired once it has called for fewer for `loop.autoscale_down_s`,
one at a time. Each change is a consumer-group rebalance: a retired worker gets SIGTERM, leaves
the group with its acked offsets committed, and its partitions' requests go to the others.
"""

from __future__ import annotations

import asyncio
import logging
import math
import threading
import time
from dataclasses import dataclass, field

from rlstream.config import Config
from rlstream.connectors.endpoints import Endpoints
from rlstream.schemas import get

log = logging.getLogger(__name__)

SAMPLE_EVERY_S = 2.0


@dataclass
class Autoscaler:
    """The scaling decision, from backlog samples (pure: the time is given)."""

    low: int
    high: int
    lag_per_worker: int
    up_after_s: float
    down_after_s: float
    _since: tuple[int, float] | None = None  # (direction, when the backlog began calling for it)

    def wanted(self, lag: int) -> int:
        return min(self.high, max(self.low, math.ceil(lag / self.lag_per_worker)))

    def decide(self, workers: int, lag: int, now: float) -> int:
        """+1 (add a worker), -1 (retire one) or 0."""
        direction = (self.wanted(lag) > workers) - (self.wanted(lag) < workers)
        if direction == 0:
            self._since = None
            return 0
        if self._since is None or self._since[0] != direction:
            self._since = (direction, now)
        held = now - self._since[1]
        if held >= (self.up_after_s if direction > 0 else self.down_after_s):
            self._since = None  # the next change waits its own hold from now
            return direction
        return 0


@dataclass
class BacklogSampler:
    """The request backlog, sampled on a thread every SAMPLE_EVERY_S (a broker that is slow to
    answer never holds up the launcher's loop); `lag` is the last sample (None before one)."""

    endpoints: Endpoints
    group: str
    topic: str = field(default_factory=lambda: get("rollout_requests").topic)
    lag: int | None = None
    _stop: threading.Event = field(default_factory=threading.Event)

    def start(self) -> BacklogSampler:
        threading.Thread(target=self._run, name="backlog", daemon=True).start()
        return self

    def _run(self) -> None:
        from rlstream.connectors.kafka import group_lag

        while not self._stop.is_set():
            try:
                self.lag = asyncio.run(group_lag(self.endpoints, self.group, self.topic))
            except Exception as exc:  # noqa: BLE001  (a broker outage: keep the last sample)
                log.debug("backlog sample failed: %s", exc)
            self._stop.wait(SAMPLE_EVERY_S)

    def stop(self) -> None:
        self._stop.set()


class WorkerScaling:
    """Drives a Supervisor's rollout workers from the backlog; keeps every decision."""

    def __init__(self, cfg: Config, endpoints: Endpoints, sup) -> None:
        low, high = cfg.loop.worker_range
        loop = cfg.loop
        self.scaler = Autoscaler(low, high, loop.autoscale_lag, loop.autoscale_up_s,
                                 loop.autoscale_down_s)  # fmt: skip
        self.sampler = BacklogSampler(endpoints, cfg.group("rollout-workers")).start()
        self.sup, self.started = sup, time.monotonic()
        self.decisions: list[dict] = []
        self.lag_max = 0

    def tick(self, rl_step: int) -> str | None:
        """One look at the backlog; a line for the user when the workers changed."""
        lag = self.sampler.lag
        if lag is None or not self.sup.started_all():
            return None
        self.lag_max = max(self.lag_max, lag)
        workers = self.sup.live_workers()
        change = self.scaler.decide(workers, lag, time.monotonic())
        if change == 0:
            return None
        name = self.sup.add_worker() if change > 0 else self.sup.retire_worker()
        self.decisions.append({"at_s": round(time.monotonic() - self.started, 1),
                               "rl_step": rl_step, "lag": lag, "workers": workers + change,
                               "worker": name})  # fmt: skip
        verb = "added" if change > 0 else "retired"
        return f"rollout workers {workers} -> {workers + change} ({verb} {name}; backlog {lag})"

    def figures(self) -> dict:
        low, high = self.scaler.low, self.scaler.high
        counts = [d["workers"] for d in self.decisions]
        return {
            "autoscale": {
                "range": f"{low}-{high}",
                "lag_per_worker": self.scaler.lag_per_worker,
                "decisions": self.decisions,
                "workers_max": max([low, *counts]),
                "workers_end": self.sup.live_workers(),
                "backlog_max": self.lag_max,
            }
        }

    def stop(self) -> None:
        self.sampler.stop()
