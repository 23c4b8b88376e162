"""score_prompts + select_prompts: the scheduler process that spends rollouts.

    python -m rlstream.streams.scheduler --config config.json

The prompt pool is the run's dataset on rl.prompts.v1 (train split), followed for the whole
run: prompts published while it runs join the pool within a poll, prompts the run cannot train
on are dead-lettered with the reason (`PromptFeed`). Each round the
sampler scores candidates and picks `prompts_per_step`; every decision goes to
rl.prompt_scores.v1 (replayable, auditable) and the picks to rl.rollout_requests.v1. Pacing is
the trainer's demand: requests are issued only while fewer than `target_in_flight` are ahead of
what the trainer has consumed (read from its policy_versions announcements), so no queue grows
without bound and policy lag stays within about target_in_flight / prompts_per_step versions.
Rewards flow back into the sampler's statistics as groups complete.

Scoring and selection share one process because samplers score candidates from a pool that is
drawn from again and again; a stateless score_prompts over a one-shot stream would not see it.

With `sampler=ppm` the predictor reads, by default, no answer: a MiniLM embedding of each
prompt (computed once), the policy's last hidden state at the prompt, its history, and
neighbourhood pass rates read back from the run's Qdrant collection, which this process writes
(`EnvironmentState`: prompt vectors, in the MiniLM space, with outcome statistics). Its
calibration on prompts never rolled out before (Brier, Pearson r) goes to rl.eval_results.v1 as
task `ppm`. With policy featurizers (`ppm_features` hidden, the default's, confidence, or the
labelled variant reference) the scheduler follows rl.policy_versions.v1 like a rollout worker,
loads the newest weights, and re-featurizes candidates when they change.
Completed groups reach the sampler in batches (one update per poll) and the PPM is fitted once
per issued round, right before it scores that round's candidates, on whatever arrived since:
fitting per poll made the scheduler the loop's bottleneck (trainer idle share 0.35 vs 0.06).
`selection.ppm_from` starts a new run's PPM and collection from an earlier run's export.

Restarts (a crash the supervisor restarts, or `rlstream run --resume`) continue, not start over:
the round numbering and the pacing resume from what rl.rollout_requests.v1 already holds (a
fresh count would re-issue request ids and flood the workers), and the sampler's state (PPM,
history, Thompson RNG, partial groups) is snapshotted to the object store every
`checkpoint_every` rounds. Reward offsets are committed only right after a snapshot, so a
restarted scheduler replays exactly the rewards its restored state has not seen. The snapshot
lists the pool's event ids in order, so the restored sampler's per-prompt statistics line up
even though partitions interleave differently on the re-read; prompts that joined after the
snapshot are appended.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
import re
import signal
from pathlib import Path

from rlstream import metrics
from rlstream.config import Config
from rlstream.connectors.deadletter import DeadLetters
from rlstream.connectors.endpoints import Endpoints
from rlstream.connectors.kafka import EventProducer
from rlstream.connectors.objectstore import ObjectStore
from rlstream.connectors.reading import read_run_rows
from rlstream.schemas import get
from rlstream.streams.environment_state import state_object
from rlstream.streams.ppm_export import load_warm_start
from rlstream.streams.prompt_feed import (
    Demand,
    PromptFeed,
    export_backlog,
    follow_trainer,
)
from rlstream.streams.scheduler_rounds import Scheduler
from rlstream.trainers.checkpoint import from_bytes
from rlstream.trainers.selection.neighbours import QdrantNeighbourhood

log = logging.getLogger(__name__)
PROMPTS, REQUESTS = get("prompts"), get("rollout_requests")


def round_of(request_id: str) -> int:
    """The round a request id was issued in ('<run>-r000012-003' -> 12)."""
    return int(request_id.rsplit("-", 2)[1][1:])


async def issued_rounds_so_far(endpoints: Endpoints, run_id: str) -> int:
    """Rounds this run's scheduler already put on rl.rollout_requests.v1 (0 for a new run).
    Requests it did not write (another producer's ids) are not its rounds."""
    rows = await read_run_rows(endpoints, REQUESTS.topic, run_id)
    ours = re.compile(rf"{re.escape(run_id)}-r\d{{6}}-\d{{3}}")
    rounds = [round_of(r["request_id"]) for r in rows if ours.fullmatch(r["request_id"])]
    return max(rounds, default=-1) + 1


async def serve(cfg: Config, endpoints: Endpoints) -> None:
    feed = PromptFeed(cfg)
    pool = await feed.load(endpoints)
    waited = 0.0
    while not pool:
        if waited % 10 == 0:
            log.info("waiting for train prompts of %r on %s", cfg.data.dataset, PROMPTS.topic)
        await asyncio.sleep(0.5)
        waited += 0.5
        pool = await feed.load(endpoints)
    issued = await issued_rounds_so_far(endpoints, cfg.run_id)
    saved = None
    if issued:
        store = ObjectStore(endpoints)
        name = state_object(cfg.run_id)
        if await asyncio.to_thread(store.exists, name):
            saved = from_bytes(await asyncio.to_thread(store.get_bytes, name))
        found = "snapshot found" if saved else "no snapshot"
        log.info("continuing at round %d (%s)", issued, found)
    warm, points = None, []
    if saved is None and cfg.selection.ppm_from:  # a restart keeps its own state instead
        warm, points = load_warm_start(Path(cfg.selection.ppm_from))
    scheduler = Scheduler(cfg, endpoints, pool, issued, saved, warm)
    if points:
        scheduler.env_state.carry_over(points)
        log.info("%d prompt vectors of %s join this run's collection", len(points),
                 cfg.selection.ppm_from)  # fmt: skip
    metrics.SCHEDULER_POOL.set(len(scheduler.pool))
    log.info(
        "scheduler: %d prompts of dataset %r in the pool (%d held out), sampler %s",
        len(pool), cfg.data.dataset, len(feed.view.heldout), cfg.selection.sampler,
    )  # fmt: skip
    demand = Demand()
    follow = asyncio.create_task(scheduler.follower.run()) if scheduler.follower else None
    try:
        async with EventProducer(endpoints) as producer:
            dead = DeadLetters(producer, consumer_name=cfg.group("scheduler"), run_id=cfg.run_id)
            prompts = asyncio.create_task(feed.follow(endpoints, dead, scheduler.join))
            try:
                await asyncio.gather(
                    follow_trainer(endpoints, cfg.run_id, demand),
                    scheduler.issue(producer, demand),
                    scheduler.learn_from_rewards(demand, producer),
                    export_backlog(endpoints, cfg.group("rollout-workers"), demand),
                )
            finally:
                prompts.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await prompts
    finally:
        if follow is not None:
            follow.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await follow
        neighbours = getattr(getattr(scheduler.sampler, "ppm", None), "neighbours", None)
        if isinstance(neighbours, QdrantNeighbourhood):
            log.info("PPM neighbourhood: %d reads from Qdrant, %d from memory (Qdrant down)",
                     neighbours.queries - neighbours.fallbacks, neighbours.fallbacks)  # fmt: skip
        scheduler.env_state.close()


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--config", required=True, type=Path)
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s scheduler %(name)s %(message)s")
    metrics.serve_from_env()
    asyncio.run(_until_terminated(serve(Config.read(args.config), Endpoints.from_env())))


async def _until_terminated(coro) -> None:
    """Run coro; SIGTERM cancels it so its cleanup (the Qdrant flush) runs."""
    task = asyncio.ensure_future(coro)
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, task.cancel)
    with contextlib.suppress(asyncio.CancelledError):
        await task


if __name__ == "__main__":
    main()
