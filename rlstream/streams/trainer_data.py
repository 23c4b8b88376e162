"""The stream trainer's data: the run's dataset as its topics hold it, the rows of an
evaluation, and the corpus both ways (verified rollouts fed back as documents, and the
documents that arrive during RL)."""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging

from rlstream import metrics as prom
from rlstream.config import Config
from rlstream.connectors.endpoints import Endpoints
from rlstream.connectors.kafka import EventProducer
from rlstream.connectors.reading import follow_run, read_rows_where
from rlstream.schemas import get, make_event_id, rows_to_batch
from rlstream.trainers.datasets import DatasetView

log = logging.getLogger(__name__)
PROMPTS, CORPUS, EVAL = get("prompts"), get("corpus"), get("eval_results")


async def load_dataset(endpoints: Endpoints, cfg: Config) -> DatasetView:
    """The run's dataset as the topics hold it: held-out prompts (evaluation) and documents
    (pre-training), whoever published them. Generated documents sort first, by doc_id (ids
    sort by index; partitions interleave on the wire), so the streamed pre-training sees the
    corpus the in-process loop would."""
    view = DatasetView(cfg.data.dataset, cfg.data.heldout_frac)
    for row in await read_rows_where(endpoints, PROMPTS.topic, view.ours):
        view.add_prompt(row)
    for row in await read_rows_where(endpoints, CORPUS.topic, view.ours):
        view.add_doc(row)
    return view


async def wait_for_dataset(endpoints: Endpoints, cfg: Config) -> DatasetView:
    """The run's dataset once its held-out prompts and its documents (or prompts) are on
    their topics (a run publishes them as it starts)."""
    for waited in itertools.count():
        view = await load_dataset(endpoints, cfg)
        if view.heldout and (view.docs or view.pool):
            return view
        if waited % 20 == 0:
            log.info("waiting for dataset %r on %s and %s (held-out prompts and documents)",
                     cfg.data.dataset, PROMPTS.topic, CORPUS.topic)  # fmt: skip
        await asyncio.sleep(0.5)


METRIC_NAMES = ("loss", "val_loss", "pg_loss", "value_loss", "lm_loss", "entropy", "kl",
                "reward", "grad_norm")  # fmt: skip


def metric_rows(phase: str, step: int, row: dict) -> list[dict]:
    """A step's training figures as eval_results rows with task=phase (NaNs left out)."""
    return [
        {
            "event_id": make_event_id("metric", phase, step, k),
            "step": step,
            "task": phase,
            "metric": k,
            "value": float(row[k]),
            "n": 1,
        }
        for k in METRIC_NAMES
        if k in row and row[k] == row[k]
    ]


def set_metric_gauges(phase: str, rows: list[dict]) -> None:
    """The trainer's loss and entropy gauges from a step's figures (`metric_rows`)."""
    for r in rows:
        if r["metric"].endswith("loss"):
            prom.TRAINER_LOSS.labels(phase, r["metric"]).set(r["value"])
        elif r["metric"] == "entropy":
            prom.TRAINER_ENTROPY.set(r["value"])


async def send_eval_rows(producer: EventProducer, cfg: Config, version: int, rows) -> None:
    """Evaluation results or training figures, on rl.eval_results.v1 at policy `version`."""
    if rows:
        batch = rows_to_batch(EVAL, rows, run_id=cfg.run_id, policy_version=version)
        await producer.send(EVAL, batch)


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


async def follow_fed_back(trainer) -> None:
    """Hybrid mode (`trainer`: the StreamTrainer): documents that reach rl.corpus.v1 during
    RL (verified rollouts fed back, or any producer's) join the corpus the LM share of each
    update reads."""
    topics = [CORPUS.topic]
    async with contextlib.aclosing(follow_run(trainer.endpoints, topics, trainer.cfg.run_id)) as p:
        async for found in p:
            for row in found.get(CORPUS.name, []):
                if row["doc_id"] not in trainer.doc_ids:
                    trainer.doc_ids.add(row["doc_id"])
                    trainer.arrived.append((row["doc_id"], row["text"]))


async def feed_corpus(trainer, producer: EventProducer, groups) -> None:
    """Verified-correct rollouts become pre-training documents (the loop's other direction)."""
    tok = trainer.state.tok
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
                CORPUS, rows, run_id=trainer.cfg.run_id, policy_version=trainer.state.version
            ),
        )
        trainer.counters["corpus_fed"] += len(rows)
