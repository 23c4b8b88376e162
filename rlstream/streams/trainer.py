"""The trainer process: pre-train on rl.corpus.v1 until converged, then RL on rl.experience.v1.

    python -m rlstream.streams.trainer --config loop.json

Effectively-once training on an at-least-once stream: every experience row is de-duplicated
by event_id, and consumer offsets are committed only right after a checkpoint (model,
optimizer, the set of trained ids, counters) is in the object store, so a restarted trainer
resumes from the checkpoint and the offsets that match it. Groups produced by a policy more
than `max_policy_lag` versions old are dropped and counted. Each update announces a policy
version (weights to S3, then the event); evaluations go to rl.eval_results.v1; verified-correct
rollouts go back into rl.corpus.v1.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import time
from collections import defaultdict
from pathlib import Path

import torch

from rlstream.connectors.deadletter import DeadLetters
from rlstream.connectors.endpoints import Endpoints
from rlstream.connectors.kafka import EventProducer, consumer
from rlstream.connectors.objectstore import ObjectStore, PrefixStore, checkpoint_prefix
from rlstream.connectors.reading import ReadRange, read_topic
from rlstream.ops import metrics as prom
from rlstream.schemas import DecodeError, decode, get, make_event_id, rows_to_batch
from rlstream.streams.config import LoopConfig
from rlstream.streams.policystore import publish_policy
from rlstream.trainers.backend import CosineSchedule
from rlstream.trainers.checkpoint import latest_checkpoint, save_checkpoint
from rlstream.trainers.local import Args, Run, pretrain_step
from rlstream.trainers.policy import Policy
from rlstream.trainers.pretrain import Corpus
from rlstream.trainers.rl import Experience
from rlstream.trainers.samplers import UniformSampler

log = logging.getLogger(__name__)
CORPUS, EXPERIENCE, EVAL = get("corpus"), get("experience"), get("eval_results")


def local_args(cfg: LoopConfig) -> Args:
    return Args(
        tasks=cfg.tasks,
        seed=cfg.seed,
        threads=cfg.threads,
        corpus_docs=1,
        pretrain_max_steps=cfg.pretrain_max_steps,
        rl_steps=cfg.rl_steps,
        prompts_per_step=cfg.prompts_per_step,
        group_size=cfg.group_size,
        temperature=cfg.temperature,
        rl_lr=cfg.rl_lr,
        max_new_tokens=cfg.max_new_tokens,
        eval_prompts=cfg.eval_prompts,
        eval_interval=cfg.eval_interval,
        progress=False,
    )


async def load_corpus(endpoints: Endpoints, run_id: str) -> list[str]:
    """The run's documents in generation order (ids sort by index; partitions interleave on
    the wire), so the streamed pre-training sees the corpus the in-process loop would."""
    docs: dict[tuple[bool, str], str] = {}
    async for record in read_topic(endpoints, CORPUS.topic, ReadRange()):
        try:
            rows = decode(record.value, record.headers).to_pylist()
        except DecodeError:
            continue
        docs.update(
            ((r["source"] != "generator", r["doc_id"]), r["text"])
            for r in rows
            if r["run_id"] == run_id
        )
    return [docs[k] for k in sorted(docs)]  # generated documents first, then fed-back ones


def eval_rows(step: int, phase: str, result: dict, n: int) -> list[dict]:
    rows = []
    for metric in ("greedy", "pass1"):
        if metric in result:
            rows.append(
                {"step": step, "task": "all", "metric": metric, "value": result[metric], "n": n}
            )
            for task, value in result.get(f"{metric}_by_task", {}).items():
                rows.append({"step": step, "task": task, "metric": metric, "value": value, "n": n})
    for row in rows:
        row["event_id"] = make_event_id("eval", phase, step, row["task"], row["metric"])
    return rows


def to_experience(groups: list[list[dict]]) -> Experience:
    rows = [r for g in groups for r in g]
    return Experience(
        [r["prompt_tokens"] for r in rows],
        [r["completion_tokens"] for r in rows],
        [r["logprobs"] for r in rows],
        [r["reward"] for r in rows],
        [r["request_id"] for r in rows],
        [r["policy_version"] for r in rows],
    )


class StreamTrainer:
    def __init__(self, cfg: LoopConfig, endpoints: Endpoints):
        self.cfg, self.endpoints = cfg, endpoints
        self.store = ObjectStore(endpoints)
        self.ckpts = PrefixStore(self.store, checkpoint_prefix(cfg.run_id))
        self.run = Run(local_args(cfg), store=self.ckpts, sampler=UniformSampler([None]))
        self.seen: set[str] = set()
        self.counters = defaultdict(float)
        self.pending: dict[str, dict[int, dict]] = defaultdict(dict)
        self.ready: list[list[dict]] = []
        self.trained_ids: list[str] = []

    def state(self) -> dict:
        """The run's state plus the stream's: ids seen, rows taken but not trained yet (their
        offsets are committed with this checkpoint), the ids trained, and counters."""
        pending = {rid: list(group.values()) for rid, group in self.pending.items()}
        stream = {
            "seen": sorted(self.seen),
            "counters": dict(self.counters),
            "pending": pending,
            "ready": self.ready,
            "trained_ids": self.trained_ids,
        }
        return self.run.state_dict() | {"stream": stream}

    def restore(self) -> bool:
        ck = latest_checkpoint(self.ckpts)
        if ck is None:
            return False
        self.run.load_state_dict(ck)
        stream = ck["stream"]
        self.seen = set(stream["seen"])
        self.counters.update(stream["counters"])
        self.pending.update(
            {rid: {r["sample_idx"]: r for r in rows} for rid, rows in stream["pending"].items()}
        )
        self.ready = stream["ready"]
        self.trained_ids = stream["trained_ids"]
        if self.run.learner is not None:
            self.bound_lag()
        log.info("resumed at step %d (phase %s)", self.run.step, self.run.phase)
        return True

    def checkpoint(self) -> None:
        save_checkpoint(self.ckpts, self.run.step, self.state(), keep_last=2)

    async def emit_eval(self, producer: EventProducer, phase: str) -> dict:
        result = await asyncio.to_thread(self.run.evaluate)
        rows = eval_rows(self.run.rl_step, phase, result, self.cfg.eval_prompts)
        for name in ("greedy", "pass1"):
            if name in result:
                prom.TRAINER_ACCURACY.labels(name).set(result[name])
        await producer.send(
            EVAL, rows_to_batch(EVAL, rows, run_id=self.cfg.run_id, policy_version=self._version())
        )
        return result

    async def emit_metrics(self, producer: EventProducer, phase: str, step: int, row: dict):
        """Training figures (losses, entropy, reward) as eval_results rows with task=phase."""
        names = ("loss", "val_loss", "pg_loss", "entropy", "kl", "reward", "grad_norm")
        rows = [
            {
                "event_id": make_event_id("metric", phase, step, k),
                "step": step,
                "task": phase,
                "metric": k,
                "value": float(row[k]),
                "n": 1,
            }
            for k in names
            if k in row and row[k] == row[k]
        ]
        if rows:
            await producer.send(
                EVAL,
                rows_to_batch(EVAL, rows, run_id=self.cfg.run_id, policy_version=self._version()),
            )

    def _version(self) -> int:
        return self.run.learner.version if self.run.learner else 0

    def policy(self) -> Policy:
        return Policy(self.run.model, self.run.tok, self._version())

    async def announce(self, producer: EventProducer, phase: str = "rl", upload: bool = True):
        """Publish the current policy version (weights to S3 first unless upload=False, which
        only refreshes the scheduler's demand signal)."""
        await publish_policy(
            producer,
            self.store,
            self.cfg.run_id,
            self.policy(),
            self.run.rl_step,
            phase,
            int(self.counters["groups_consumed"]),
            upload=upload,
        )

    async def pretrain(self, producer: EventProducer) -> None:
        run = self.run
        docs = await load_corpus(self.endpoints, self.cfg.run_id)
        if not docs:
            raise RuntimeError(f"no corpus documents for run {self.cfg.run_id} in {CORPUS.topic}")
        run.corpus = Corpus(docs + run.added_docs, run.tok, run.args.block_size)
        while run.phase == "pretrain":
            row = await asyncio.to_thread(pretrain_step, run)
            prom.TRAINER_STEPS.labels("pretrain").inc()
            if "val_loss" in row:
                log.info("pretrain step %d val_loss %.4f", run.pre_step, row["val_loss"])
                await self.emit_metrics(producer, "pretrain", run.pre_step, row)
        run.pretrain_eval = await self.emit_eval(producer, "pretrain")
        run.start_rl()
        self.bound_lag()
        self.checkpoint()

    def bound_lag(self) -> None:
        """The loop's staleness bound is the learner's (it drops and counts stale groups)."""
        self.run.learner.args.max_policy_lag = self.cfg.max_policy_lag

    def take(self, rows: list[dict]) -> None:
        for row in rows:
            if row["event_id"] in self.seen:
                self.counters["duplicates_skipped"] += 1
                prom.TRAINER_DUPLICATES.inc()
                continue
            self.seen.add(row["event_id"])
            group = self.pending[row["request_id"]]
            group[row["sample_idx"]] = row
            if len(group) == self.cfg.group_size:
                rows_in_order = [group[i] for i in sorted(group)]
                del self.pending[row["request_id"]]
                if self.filtering() and len({r["reward"] for r in rows_in_order}) == 1:
                    self.drop_zero_variance(rows_in_order)
                else:
                    self.ready.append(rows_in_order)

    def filtering(self) -> bool:
        """Whether zero-variance groups are dropped now (on, and under the batch's cap)."""
        cap = self.cfg.filter_max_rounds * self.cfg.prompts_per_step
        return self.cfg.filter_zero_variance and self.counters["filtered_this_batch"] < cap

    def drop_zero_variance(self, group: list[dict]) -> None:
        """A group that teaches nothing, filtered out: consumed (the scheduler refills), counted,
        never trained."""
        lag = self._version() - group[0]["policy_version"]
        self.counters[f"lag_{lag}"] += 1
        self.counters["groups_consumed"] += 1
        self.counters["zero_variance_groups"] += 1
        self.counters["filtered_groups"] += 1
        self.counters["filtered_this_batch"] += 1
        prom.TRAINER_GROUPS.inc()
        prom.TRAINER_ZERO_VARIANCE_GROUPS.inc()

    def update(self, groups: list[list[dict]]) -> dict:
        run = self.run
        for group in groups:  # versions behind the trainer when trained (dropped ones included)
            lag = self._version() - group[0]["policy_version"]
            self.counters[f"lag_{lag}"] += 1
        run.backend.set_lr(
            CosineSchedule(self.cfg.rl_lr, 0, self.cfg.rl_steps, self.cfg.rl_lr / 10)(run.rl_step)
        )
        metrics = run.learner.step(to_experience(groups))
        self.counters["stale_dropped"] += metrics["dropped_groups"]
        prom.TRAINER_STALE_GROUPS.inc(metrics["dropped_groups"])
        self.counters["groups_consumed"] += len(groups)
        self.counters["filtered_this_batch"] = 0
        zero = sum(len({r["reward"] for r in g}) == 1 for g in groups)  # no learning signal
        self.counters["zero_variance_groups"] += zero
        prom.TRAINER_ZERO_VARIANCE_GROUPS.inc(zero)
        prom.TRAINER_GROUPS.inc(len(groups))
        trained = len(groups) - metrics["dropped_groups"]
        if trained:
            stale = {
                g[0]["request_id"]
                for g in groups
                if self._version() - 1 - g[0]["policy_version"] > self.cfg.max_policy_lag
            }
            self.trained_ids += [
                r["event_id"] for g in groups for r in g if g[0]["request_id"] not in stale
            ]
        self.counters["experience_trained"] += trained * self.cfg.group_size
        if trained:
            prom.TRAINER_STEPS.labels("rl").inc()
            prom.POLICY_VERSION.labels("trainer").set(self._version())
            if "grad_norm" in metrics:
                prom.TRAINER_GRAD_NORM.set(metrics["grad_norm"])
            run.rl_step += 1
            run.rollouts += trained * self.cfg.group_size
        return metrics


async def rl(trainer: StreamTrainer, producer: EventProducer) -> None:
    cfg, run, counters = trainer.cfg, trainer.run, trainer.counters
    dead = DeadLetters(producer, consumer_name=cfg.group("trainer"), run_id=cfg.run_id)
    c = consumer(trainer.endpoints, EXPERIENCE.topic, group_id=cfg.group("trainer"))
    await c.start()
    try:
        await trainer.announce(producer)
        started = last_signal = time.monotonic()
        filtered_announced = counters["filtered_groups"]
        while run.rl_step < cfg.rl_steps:
            waited = time.monotonic()
            while len(trainer.ready) < cfg.prompts_per_step:
                for records in (await c.getmany(timeout_ms=100)).values():
                    for record in records:
                        try:
                            rows = decode(record.value, record.headers).to_pylist()
                        except DecodeError as error:
                            await dead.send(record, error)
                            continue
                        trainer.take([r for r in rows if r["run_id"] == cfg.run_id])
                refill = counters["filtered_groups"] > filtered_announced
                if refill and time.monotonic() - last_signal > 0.2:  # filtered: refill them now
                    filtered_announced = counters["filtered_groups"]
                    await trainer.announce(producer, upload=False)
                    last_signal = time.monotonic()
                if time.monotonic() - last_signal > 2.0:  # keep the scheduler's demand fresh
                    await trainer.announce(producer, upload=False)
                    last_signal = time.monotonic()
            counters["idle_s"] += time.monotonic() - waited
            prom.TRAINER_IDLE_SECONDS.inc(time.monotonic() - waited)
            batch, trainer.ready = (
                trainer.ready[: cfg.prompts_per_step],
                trainer.ready[cfg.prompts_per_step :],
            )
            metrics = await asyncio.to_thread(trainer.update, batch)
            await trainer.emit_metrics(producer, "rl", run.rl_step, metrics)
            await feed_corpus(trainer, producer, batch)
            if run.rl_step % cfg.publish_every == 0 or metrics["dropped_groups"]:
                await trainer.announce(producer)
                last_signal = time.monotonic()
            if run.rl_step % cfg.eval_interval == 0 or run.rl_step == cfg.rl_steps:
                result = await trainer.emit_eval(producer, "rl")
                log.info("rl step %d greedy %.3f", run.rl_step, result["greedy"])
            if run.rl_step % cfg.checkpoint_every == 0 or run.rl_step == cfg.rl_steps:
                await asyncio.to_thread(trainer.checkpoint)
                await c.commit()  # offsets only after the checkpoint that covers them
    finally:
        counters["wall_rl_s"] += time.monotonic() - started
        await c.stop()


async def feed_corpus(trainer: StreamTrainer, producer: EventProducer, groups) -> None:
    """Verified-correct rollouts become pre-training documents (the loop's other direction)."""
    tok = trainer.run.tok
    rows = [
        {
            "doc_id": r["event_id"],
            "text": tok.decode(r["prompt_tokens"] + r["completion_tokens"]),
            "source": "rollout",
            "task": r["task"],
        }
        for g in groups
        for r in g
        if r["correct"]
    ]
    if rows:
        await producer.send(
            CORPUS,
            rows_to_batch(
                CORPUS, rows, run_id=trainer.cfg.run_id, policy_version=trainer._version()
            ),
        )
        trainer.counters["corpus_fed"] += len(rows)


async def serve(cfg: LoopConfig, endpoints: Endpoints) -> dict:
    torch.set_num_threads(cfg.threads)
    trainer = StreamTrainer(cfg, endpoints)
    trainer.restore()
    async with EventProducer(endpoints) as producer:
        if trainer.run.phase != "rl":
            await trainer.pretrain(producer)
        if trainer.run.rl_step < cfg.rl_steps:
            await rl(trainer, producer)
        final = await trainer.emit_eval(producer, "final")
        summary = summarize(trainer, final)
        await asyncio.to_thread(
            trainer.store.put_bytes,
            f"{cfg.run_id}/reports/trainer.json",
            json.dumps(summary, indent=2).encode(),
        )
        await trainer.announce(producer, phase="done")
    return summary


def summarize(trainer: StreamTrainer, final: dict) -> dict:
    c, run = trainer.counters, trainer.run
    wall = c.get("wall_rl_s", 0.0)
    return {
        "pretrain_accuracy": run.pretrain_eval.get("greedy"),
        "pretrain_pass1": run.pretrain_eval.get("pass1"),
        "final_accuracy": final["greedy"],
        "final_pass1": final.get("pass1"),
        "final_by_task": final.get("greedy_by_task"),
        "pretrain_steps": run.pre_step,
        "rl_steps": run.rl_step,
        "experience_trained": int(c["experience_trained"]),
        "duplicates_skipped": int(c["duplicates_skipped"]),
        "duplicates_trained": len(trainer.trained_ids) - len(set(trainer.trained_ids)),
        "stale_dropped": int(c["stale_dropped"]),
        "groups_consumed": int(c["groups_consumed"]),
        "zero_variance_share": round(c["zero_variance_groups"] / c["groups_consumed"], 4)
        if c["groups_consumed"]
        else None,
        "filtered_groups": int(c["filtered_groups"]),
        "corpus_fed": int(c["corpus_fed"]),
        "trainer_idle_share": round(c["idle_s"] / wall, 4) if wall else None,
        "policy_lag_histogram": {
            int(k[4:]): int(v) for k, v in sorted(c.items()) if k.startswith("lag_")
        },
    }


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--config", required=True, type=Path)
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s trainer %(message)s")
    prom.serve_from_env()
    summary = asyncio.run(serve(LoopConfig.read(args.config), Endpoints.from_env()))
    print(json.dumps(summary), flush=True)


if __name__ == "__main__":
    main()
