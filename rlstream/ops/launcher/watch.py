"""A live view of a run from its events: phase, step, accuracy, reward, policy lag, events/s.

`RunWatcher` follows rl.policy_versions, rl.eval_results and rl.rollouts of one run in a
background thread (its own event loop and consumer, no group), and samples every topic's
highwater for events/s. Everything it learns is also kept for the report's plots.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
import time
from collections import defaultdict
from dataclasses import dataclass, field

from aiokafka import TopicPartition

from rlstream.connectors.endpoints import Endpoints
from rlstream.connectors.kafka import highwaters
from rlstream.connectors.reading import follow_run
from rlstream.schemas import all_events, get

log = logging.getLogger(__name__)

FOLLOWED = ("policy_versions", "eval_results", "rollouts")


@dataclass
class RunView:
    phase: str = "starting"
    rl_step: int = 0
    pretrain_step: int = 0
    val_loss: float | None = None
    policy_version: int = 0
    accuracy: float | None = None
    pass1: float | None = None
    reward: float | None = None
    policy_lag: float | None = None
    evals: list[dict] = field(default_factory=list)  # eval_results rows
    lags: list[int] = field(default_factory=list)  # per rollout group: trainer version - producer
    completions: dict[str, int] = field(default_factory=dict)  # task -> rollouts (interactions)
    rates: dict[str, float] = field(default_factory=dict)  # topic -> messages/s
    throughput: list[tuple[float, dict[str, int]]] = field(default_factory=list)


class RunWatcher:
    SAMPLE_EVERY_S = 2.0  # topics' highwaters, for events/s

    def __init__(self, endpoints: Endpoints, run_id: str):
        self.endpoints, self.run_id = endpoints, run_id
        self.view = RunView()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=lambda: asyncio.run(self._main()), daemon=True)

    def start(self) -> RunWatcher:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=10)

    async def _main(self) -> None:
        try:
            await asyncio.gather(self._follow(), self._sample_rates())
        except Exception:  # the view would freeze without a word: say why, loudly
            log.exception("the live view of run %s stopped", self.run_id)
            raise

    async def _follow(self) -> None:
        topics = [get(name).topic for name in FOLLOWED]
        async with contextlib.aclosing(follow_run(self.endpoints, topics, self.run_id)) as polls:
            async for found in polls:
                for event, rows in found.items():
                    self._apply(event, rows)
                if self._stop.is_set():
                    return

    def _apply(self, event: str, rows: list[dict]) -> None:
        v = self.view
        if event == "policy_versions":
            for r in rows:
                v.phase = "done" if r["phase"] == "done" else "rl"
                v.rl_step = max(v.rl_step, r["step"])
                v.policy_version = max(v.policy_version, r["version"])
        elif event == "eval_results":
            v.evals += rows
            for r in rows:
                if r["task"] == "pretrain":
                    v.phase = "pretrain" if v.phase == "starting" else v.phase
                    v.pretrain_step = max(v.pretrain_step, r["step"])
                    if r["metric"] == "val_loss":
                        v.val_loss = r["value"]
                if r["task"] == "all" and r["metric"] == "greedy":
                    v.accuracy = r["value"]
                if r["task"] == "all" and r["metric"] == "pass1":
                    v.pass1 = r["value"]
                if r["task"] == "rl" and r["metric"] == "reward":
                    v.reward = r["value"]
        elif event == "rollouts" and rows:
            for r in rows:
                v.completions[r["task"]] = v.completions.get(r["task"], 0) + 1
            groups = {r["request_id"]: r["policy_version"] for r in rows}
            lags = [max(0, v.policy_version - pv) for pv in groups.values()]
            v.lags += lags
            recent = v.lags[-200:]
            v.policy_lag = sum(recent) / len(recent)

    async def _sample_rates(self) -> None:
        tps = [TopicPartition(e.topic, p) for e in all_events() for p in range(e.partitions)]
        last: tuple[float, dict[str, int]] | None = None
        while not self._stop.is_set():
            try:
                hw = await highwaters(self.endpoints, tps)
            except Exception:  # noqa: BLE001  (a missed sample only thins the plot)
                await self._pause(1.0)
                continue
            now, counts = time.time(), defaultdict(int)
            for tp, end in hw.items():
                counts[tp.topic] += end
            if last:
                dt = max(1e-3, now - last[0])
                self.view.rates = {t: (counts[t] - last[1].get(t, 0)) / dt for t in counts}
            self.view.throughput.append((now, dict(counts)))
            last = (now, dict(counts))
            await self._pause(self.SAMPLE_EVERY_S)

    async def _pause(self, seconds: float) -> None:
        """Sleep, waking early when the watcher is stopped."""
        deadline = time.monotonic() + seconds
        while not self._stop.is_set() and time.monotonic() < deadline:
            await asyncio.sleep(0.1)
