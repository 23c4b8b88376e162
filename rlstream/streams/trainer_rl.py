"""The stream trainer's RL phase: experience groups read from rl.experience.v2 (what cannot be
trained dead-lettered), a batch of `rl.prompts_per_step` groups per update, the policy
announced, evaluations and checkpoints when due. The trainer itself (state, checkpoints,
intake, the update) is `streams/trainer.py`."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time

from rlstream import metrics as prom
from rlstream.connectors.deadletter import DeadLetters
from rlstream.connectors.kafka import EventProducer, consumer
from rlstream.schemas import DecodeError, decode, get
from rlstream.streams.experience_checks import UntrainableRow, due, untrainable
from rlstream.streams.trainer_data import feed_corpus, follow_fed_back
from rlstream.trainers.experience import keep_rows_of_run

log = logging.getLogger(__name__)
EXPERIENCE = get("experience")
EXPECTED = (EXPERIENCE.name,)  # what rl.experience.v2 carries
POLL_MS = 100  # experience fetch wait while a batch fills
DEMAND_REFRESH_S = 2.0  # re-announce the groups consumed so the scheduler's pacing stays fresh
REFILL_SIGNAL_S = 0.2  # after filtered groups, tell the scheduler at most this often


async def rl(trainer, producer: EventProducer) -> None:
    """Train `trainer` (the StreamTrainer) on experience until rl.steps: fill a batch of
    groups, update, publish the policy, evaluate and checkpoint when due (offsets committed
    only after the checkpoint that covers them)."""
    cfg, st, counters = trainer.cfg, trainer.state, trainer.counters
    dead = DeadLetters(producer, consumer_name=cfg.group("trainer"), run_id=cfg.run_id)
    c = consumer(trainer.endpoints, EXPERIENCE.topic, group_id=cfg.group("trainer"))
    # the announcement starts the rollouts; joining the group takes ~3 s on this broker, and
    # experience that arrives meanwhile waits in the topic (the group starts at the earliest)
    await asyncio.gather(c.start(), trainer.announce(producer))
    fed_back = asyncio.create_task(follow_fed_back(trainer)) if cfg.rl.hybrid else None
    try:
        started = last_signal = time.monotonic()
        filtered_announced = counters["refill_groups"]
        while st.rl_step < cfg.rl.steps:
            waited = time.monotonic()
            while len(trainer.ready) < cfg.rl.prompts_per_step:
                for records in (await c.getmany(timeout_ms=POLL_MS)).values():
                    for record in records:
                        try:
                            decoded = decode(record.value, record.headers, expect=EXPECTED)
                            rows = decoded.to_pylist()
                        except DecodeError as error:
                            await dead.send(record, error)
                            continue
                        trainer.take(await trainable(trainer, rows, record, dead))
                refill = counters["refill_groups"] > filtered_announced
                if refill and time.monotonic() - last_signal > REFILL_SIGNAL_S:
                    filtered_announced = counters["refill_groups"]
                    await trainer.announce(producer, upload=False)
                    last_signal = time.monotonic()
                if time.monotonic() - last_signal > DEMAND_REFRESH_S:
                    await trainer.announce(producer, upload=False)
                    last_signal = time.monotonic()
            counters["idle_s"] += time.monotonic() - waited
            prom.TRAINER_IDLE_SECONDS.inc(time.monotonic() - waited)
            batch, trainer.ready = (
                trainer.ready[: cfg.rl.prompts_per_step],
                trainer.ready[cfg.rl.prompts_per_step :],
            )
            before = st.rl_step
            metrics = await asyncio.to_thread(trainer.update, batch)
            await trainer.emit_metrics(producer, "rl", st.rl_step, metrics)
            await feed_corpus(trainer, producer, batch)
            if st.rl_step % cfg.loop.publish_every == 0 or metrics["dropped_groups"]:
                await trainer.announce(producer)
                last_signal = time.monotonic()
            if due(st.rl_step, before, cfg.eval.interval, cfg.rl.steps):
                result = await trainer.emit_eval(producer, "rl")
                log.info("rl step %d greedy %.3f", st.rl_step, result["greedy"])
            if due(st.rl_step, before, cfg.checkpoint.every, cfg.rl.steps):
                await asyncio.to_thread(trainer.checkpoint, st.rl_step == cfg.rl.steps)
                await c.commit()  # offsets only after the checkpoint that covers them
    finally:
        counters["wall_rl_s"] += time.monotonic() - started
        if fed_back is not None:
            fed_back.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await fed_back
        await c.stop()


async def trainable(trainer, rows: list[dict], record, dead) -> list[dict]:
    """This run's rows of a message, less those that cannot be trained on (dead-lettered)."""
    cfg = trainer.cfg
    limits = (trainer.state.tok.vocab_size, cfg.model.block_size, cfg.rl.group_size)

    async def refuse(i: int, row: dict, problem: str) -> None:
        trainer.counters["untrainable_rows"] += 1
        await dead.send(record, UntrainableRow(f"{row['event_id']}: {problem}"), part=i)

    return await keep_rows_of_run(rows, cfg.run_id, lambda row: untrainable(row, *limits), refuse)
