"""The scheduler's rounds: each scores candidates from the pool, picks `prompts_per_step`,
and issues them as rollout requests, paced by the trainer's demand; completed reward groups
flow back into the sampler's statistics, the environment state (Qdrant) and the PPM's
calibration. The process around it is `streams/scheduler.py`."""

from __future__ import annotations

import asyncio
import logging
from dataclasses import replace
from functools import partial

from rlstream import metrics
from rlstream.config import Config
from rlstream.config.selection import check_features
from rlstream.connectors.deadletter import DeadLetters
from rlstream.connectors.endpoints import Endpoints
from rlstream.connectors.kafka import EventProducer, consumer
from rlstream.connectors.objectstore import ObjectStore
from rlstream.schemas import DecodeError, decode, get, make_event_id, rows_to_batch
from rlstream.streams.environment_state import EnvironmentState, state_object
from rlstream.streams.policystore import PolicyFollower
from rlstream.streams.prompt_feed import Demand, in_snapshot_order
from rlstream.streams.selection_stats import (
    Calibration,
    RewardGroups,
    SelectionClock,
    selection_rows,
)
from rlstream.trainers.checkpoint import to_bytes
from rlstream.trainers.envs import Prompt
from rlstream.trainers.experience import RowLimits, RowRefused, keep_rows_of_run, row_problem
from rlstream.trainers.selection import records_to_batch
from rlstream.trainers.selection.compute import measure_prefill_ratio
from rlstream.trainers.selection.neighbours import QdrantNeighbourhood
from rlstream.trainers.selection.policy_features import (
    reads_policy,
    static_featurizer,
    tuned_args,
)
from rlstream.trainers.selection.registry import build_sampler

log = logging.getLogger(__name__)
REWARDS, REQUESTS, EVAL = get("rewards"), get("rollout_requests"), get("eval_results")


class Scheduler:
    def __init__(
        self,
        cfg: Config,
        endpoints: Endpoints,
        pool: list[tuple[str, Prompt]],
        issued_rounds: int = 0,
        saved: dict | None = None,
        warm: dict | None = None,
    ):
        """`saved`: this run's own snapshot (a restart); `warm`: the PPM state of another run
        to start from (`selection.ppm_from`, a fresh run only)."""
        self.cfg, self.endpoints = cfg, endpoints
        if saved is not None:
            pool = in_snapshot_order(pool, saved.get("pool_keys", []))
        self.pool_keys = [key for key, _ in pool]
        self.pool = [prompt for _, prompt in pool]
        self.follower: PolicyFollower | None = None
        self.featured_version: int | None = None  # the policy the PPM's cached features read
        self.fitted_at = 0  # PPM observations (update calls) at its last fit
        self.saved = saved  # a snapshot to restore once the sampler exists
        self.sampler = None
        self.by_id = {p.prompt_id: p for p in self.pool}
        self.issued_rounds = self.saved_at = issued_rounds
        self.groups = RewardGroups()
        self.calibration = Calibration()
        self.clock = SelectionClock()
        self.warm = warm
        features = check_features(cfg.ppm_feature_spec())
        self.env_state = EnvironmentState(endpoints, cfg.run_id, static_featurizer(features))
        if cfg.selection.sampler == "ppm" and reads_policy(features):
            self.follower = PolicyFollower(endpoints, cfg.run_id, role="scheduler")
        else:
            self.set_sampler(self.make_sampler())

    def set_sampler(self, sampler) -> None:
        """Install the sampler, restoring the snapshot the scheduler started with, if any;
        prompts that joined after the snapshot (or before the sampler existed) follow."""
        self.sampler = sampler
        ppm = getattr(sampler, "ppm", None)
        if self.warm is not None and self.saved is None and ppm is not None:
            sampler.start_from(self.warm)
            log.info("the PPM starts from %s (%d observations, %d fits, its predictions worth "
                     "%.2f rollouts)", self.cfg.selection.ppm_from, len(ppm.s), ppm.version,
                     sampler.prior_strength())  # fmt: skip
        self.warm = None
        if self.saved is not None:
            sampler.load_state_dict(self.saved["sampler"])
            self.groups.load_state_dict(self.saved)
            self.clock.load_state_dict(self.saved.get("clock", {}))
            ppm = getattr(sampler, "ppm", None)
            self.fitted_at = ppm.policy_version if ppm is not None else 0
            log.info("restored the sampler state of round %d", self.saved["round"])
            self.saved = None
        if getattr(sampler, "compute", None) is not None:  # scoring's tokens, counted on
            sampler.compute.add(self.clock.compute.prefilled, self.clock.compute.decoded)
            self.clock.compute = sampler.compute
        sampler.extend(self.pool[len(sampler.pool) :])

    def join(self, entries: list[tuple[str, Prompt]]) -> None:
        """Prompts published while the run goes on join the pool (and the sampler's)."""
        prompts = [prompt for _, prompt in entries]
        self.pool_keys += [key for key, _ in entries]
        self.pool += prompts
        self.by_id.update((p.prompt_id, p) for p in prompts)
        if self.sampler is not None:
            self.sampler.extend(prompts)
        metrics.SCHEDULER_POOL.set(len(self.pool))
        log.info("%d prompts joined the pool (now %d)", len(prompts), len(self.pool))

    def snapshot(self) -> bytes:
        """The sampler's state and the partial reward groups, as of the rewards processed."""
        state = {
            "sampler": self.sampler.state_dict(),
            **self.groups.state_dict(),
            "round": self.issued_rounds,
            "pool_keys": self.pool_keys[: len(self.sampler.pool)],
            "clock": self.clock.state_dict(),
        }
        return to_bytes(state)

    def make_sampler(self):
        # fits happen in select(), once per round, not in every update (fit_every: never)
        args = replace(tuned_args(), fit_every=10**9)
        saved = self.saved["pool_keys"] if self.saved and "pool_keys" in self.saved else None
        pool = self.pool[:] if saved is None else self.pool[: len(saved)]  # join() appends
        # the PPM's neighbourhood pass rates are read from this run's Qdrant collection, in
        # the space its prompt vectors are written in
        space = self.env_state.featurize
        neighbours = QdrantNeighbourhood(space.dim, store=self.env_state.store, writes=False)
        return build_sampler(self.cfg, pool, lambda: self.follower.policy, ppm_args=args,
                             neighbourhood=neighbours, embedder=space)  # fmt: skip

    async def ready(self) -> None:
        """Wait for the first policy when the sampler reads one, then build the sampler. The
        first policy is published when pre-training ends, so the pool's static vectors (MiniLM:
        ~35 s of CPU for 20,000 prompts on 2 cores) are computed before, while the trainer
        pre-trains, into the featurizer's cache; both off the event loop."""
        if self.follower is not None and self.sampler is None:
            pool = self.pool[:]
            embedded = asyncio.create_task(asyncio.to_thread(self.env_state.featurize, pool))
            await self.follower.ready.wait()
            await embedded
            self.set_sampler(await asyncio.to_thread(self.make_sampler))
            if self.clock.prefill_ratio is None:  # what a prefilled token costs, decoded
                texts = [p.text for p in self.pool[: self.sampler.args.candidate_pool]]
                self.clock.prefill_ratio, detail = await asyncio.to_thread(
                    measure_prefill_ratio, self.follower.policy, texts, 16
                )
                log.info("a prefilled token costs %.3f decoded ones (%s)",
                         self.clock.prefill_ratio, detail)  # fmt: skip
            log.info("the sampler is ready: %d prompts, policy version %d, PPM features %s",
                     len(self.pool), self.follower.policy.version,
                     self.cfg.ppm_feature_spec())  # fmt: skip
            if hasattr(self.sampler, "describe"):
                log.info("selection: %s", self.sampler.describe())

    def select(self, round_: int) -> list[Prompt]:
        """The sampler's picks. The PPM sampler first re-featurizes if a newer policy arrived
        and fits on the groups completed since its last fit."""
        ppm = getattr(self.sampler, "ppm", None)
        if ppm is not None:
            if self.follower is not None and self.follower.policy.version != self.featured_version:
                with self.clock.part("features"):
                    ppm.refresh_features(self.follower.policy.version)
                self.featured_version = self.follower.policy.version
            if ppm.policy_version > self.fitted_at:
                with self.clock.part("fit"):
                    ppm.fit(self.sampler.args.fit_steps)
                self.fitted_at = ppm.policy_version
        with self.clock.part("pick"):
            picks = self.sampler.select(round_, self.cfg.rl.prompts_per_step)
        self.clock.rounds += 1
        self.clock.screened(getattr(self.sampler, "screened", 0))  # PPM sampler only
        if ppm is not None:  # predictions for prompts never rolled out, scored when they are
            self.calibration.predicted(getattr(self.sampler, "last_records", []), ppm.counts)
        return picks

    def request_rows(self, prompts: list[Prompt], round_: int) -> list[dict]:
        return [
            {
                "event_id": make_event_id("rollout_requests", self.cfg.run_id, round_, i),
                "request_id": f"{self.cfg.run_id}-r{round_:06d}-{i:03d}",
                "prompt_id": p.prompt_id,
                "text": p.text,
                "task": p.task,
                "difficulty": p.difficulty,
                "answer": p.answer,
                "group_size": self.cfg.rl.group_size,
                "sampler": self.cfg.selection.sampler,
                "verifier": p.verifier or None,
                "metadata": p.metadata or None,
                "environment": p.environment or None,
            }
            for i, p in enumerate(prompts)
        ]

    async def issue(self, producer: EventProducer, demand: Demand) -> None:
        """Issue rounds while fewer than target_in_flight groups are ahead of the trainer."""
        cfg = self.cfg
        await self.ready()
        while not demand.started and not demand.done:  # no requests before a policy exists
            await asyncio.sleep(0.1)
        while not demand.done:
            in_flight = self.issued_rounds * cfg.rl.prompts_per_step - demand.groups_consumed
            metrics.SCHEDULER_IN_FLIGHT.set(in_flight)
            if in_flight + cfg.rl.prompts_per_step > max(
                cfg.loop.target_in_flight, cfg.rl.prompts_per_step
            ):
                await asyncio.sleep(0.05)
                continue
            round_ = self.issued_rounds
            prompts = self.select(round_)
            records = getattr(self.sampler, "last_records", [])
            if records:
                batch = records_to_batch(records, cfg.run_id, demand.rl_step)
                ids = [
                    make_event_id("prompt_scores", cfg.run_id, round_, i)
                    for i in range(batch.num_rows)
                ]
                batch = batch.set_column(0, "event_id", _strings(ids))
                await producer.send(get("prompt_scores"), batch)
            batch = rows_to_batch(
                REQUESTS,
                self.request_rows(prompts, round_),
                run_id=cfg.run_id,
                policy_version=demand.rl_step,
            )
            await producer.send(REQUESTS, batch)
            metrics.SCHEDULER_REQUESTS.inc(len(prompts))
            self.issued_rounds += 1

    async def learn_from_rewards(self, demand: Demand, producer: EventProducer) -> None:
        """Feed completed groups' rewards back into the sampler; snapshot, then commit. A reward
        message that does not decode is dead-lettered with its reason."""
        group = self.cfg.group("scheduler")
        dead = DeadLetters(producer, consumer_name=group, run_id=self.cfg.run_id)
        c = consumer(self.endpoints, REWARDS.topic, group_id=group)
        store = ObjectStore(self.endpoints)
        await c.start()
        try:
            while not demand.done:
                for records in (await c.getmany(timeout_ms=200)).values():
                    for record in records:
                        try:
                            decoded = decode(record.value, record.headers, expect=("rewards",))
                            rows = decoded.to_pylist()
                        except DecodeError as error:
                            await dead.send(record, error)
                            continue
                        self._observe(await self._acceptable(rows, record, dead))
                if self.issued_rounds - self.saved_at >= self.cfg.checkpoint.every:
                    await self.checkpoint(c, store)
                    await self.report_calibration(producer, demand.rl_step)
            await self.checkpoint(c, store)
            await self.report_calibration(producer, demand.rl_step)
        finally:
            await c.stop()

    def curriculum_figures(self) -> dict[str, float]:
        """The curriculum's open level and how many times it rose ({} without one)."""
        figures = getattr(self.sampler, "figures", None)
        if not callable(figures) or "curriculum_level" not in (f := figures()):
            return {}
        return {"curriculum_level": f["curriculum_level"],
                "curriculum_raises": len(f["curriculum_raised_at"])}  # fmt: skip

    async def report_calibration(self, producer: EventProducer, step: int) -> None:
        """What selection measured of itself (`selection_rows`), as eval_results rows."""
        strengths = getattr(self.sampler, "family_strengths", dict)()  # PPM sampler only
        rows = selection_rows(self.cfg.run_id, self.issued_rounds, step, self.clock,
                              self.calibration, self.curriculum_figures(), strengths)  # fmt: skip
        if rows:
            await producer.send(EVAL, rows_to_batch(EVAL, rows, run_id=self.cfg.run_id))

    async def checkpoint(self, c, store: ObjectStore) -> None:
        """Snapshot to the object store, then commit the reward offsets it covers."""
        if self.sampler is None:  # nothing issued yet, nothing learnt
            return
        data = self.snapshot()
        await asyncio.to_thread(store.put_bytes, state_object(self.cfg.run_id), data)
        await c.commit()
        self.saved_at = self.issued_rounds

    async def _acceptable(self, rows: list[dict], record, dead: DeadLetters) -> list[dict]:
        """This run's reward rows that can be rows of it; each other one of this run is
        dead-lettered (a NaN reward would reach the sampler's statistics, a group size no
        request has would wait in `rewards` for good)."""
        limits = RowLimits(group_size=self.cfg.rl.group_size)

        async def refuse(i: int, row: dict, problem: str) -> None:
            await dead.send(record, RowRefused(f"row {i}: {problem}"), part=i)

        return await keep_rows_of_run(rows, self.cfg.run_id, partial(row_problem, limits=limits),
                                      refuse)  # fmt: skip

    def _observe(self, rows: list[dict]) -> None:
        """The groups these reward rows complete go to the sampler in one update."""
        done: list[tuple[Prompt, list[float]]] = []
        for row, rewards in self.groups.add(rows):
            prompt = self.by_id.get(row["prompt_id"])
            if prompt is not None:
                done.append((prompt, rewards))
                self.env_state.observe(prompt, rewards, row["policy_version"])
                self.calibration.observed(prompt.prompt_id, rewards)
        if done and self.sampler is not None:
            self.sampler.update([p for p, _ in done], [g for _, g in done])


def _strings(values: list[str]):
    import pyarrow as pa

    return pa.array(values, pa.string())
