"""The scheduler's inputs: the run's prompt pool as it is published (admitted or refused with the
reason) and the trainer's demand for experience, followed from its policy versions; and the
rollout workers' request backlog, exported as a gauge while the run lasts."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from dataclasses import dataclass

from rlstream import metrics
from rlstream.config import Config
from rlstream.connectors.deadletter import DeadLetters
from rlstream.connectors.endpoints import Endpoints
from rlstream.connectors.kafka import group_lag
from rlstream.connectors.reading import ReadRange, follow_run, read_topic
from rlstream.schemas import DecodeError, decode, get
from rlstream.trainers.datasets import DatasetView, prompt_problem
from rlstream.trainers.envs import Prompt

PROMPTS, POLICY_VERSIONS = get("prompts"), get("policy_versions")
REQUESTS = get("rollout_requests")
log = logging.getLogger(__name__)


def in_snapshot_order(
    pool: list[tuple[str, Prompt]], saved_keys: list[str]
) -> list[tuple[str, Prompt]]:
    """The pool with the snapshot's entries first, in its order (the restored sampler's
    statistics are by position), then the entries that joined after it, in arrival order."""
    at = {key: i for i, key in enumerate(saved_keys)}
    return sorted(pool, key=lambda entry: at.get(entry[0], len(at)))  # stable for the rest


class PromptRefused(DecodeError):
    """A well-formed prompt the run cannot train on (no verifier, bad answer, text)."""

    kind = "refused_prompt"


class PromptFeed:
    """The run's dataset on rl.prompts.v1, followed for the whole run.

    Train-split prompts of `data.dataset` join the pool (by event id: a re-published row does
    not repeat); held-out ones are kept out; prompts the run cannot train on (no verifier,
    an answer the verifier cannot read, text the tokenizer or the context cannot take) are
    dead-lettered with the reason, and the loop goes on.
    """

    def __init__(self, cfg: Config):
        from rlstream.trainers.lm import load_tokenizer

        self.view = DatasetView(cfg.data.dataset, cfg.data.heldout_frac)
        self.tok = load_tokenizer(cfg.model)
        self.max_chars = cfg.model.block_size - cfg.rl.max_new_tokens

    def admit(self, rows: list[dict]) -> tuple[list[tuple[str, Prompt]], list[tuple[int, str]]]:
        """(new pool entries, refused (row index, reason)) among a message's rows."""
        fresh, refused = [], []
        for i, row in enumerate(rows):
            if not self.view.ours(row):
                continue
            problem = prompt_problem(row, self.tok, self.max_chars)
            if problem:
                refused.append((i, f"prompt {row['prompt_id']}: {problem}"))
                continue
            known = row["event_id"] in self.view.pool
            if self.view.add_prompt(row) == "train" and not known:
                fresh.append((row["event_id"], self.view.pool[row["event_id"]]))
        return fresh, refused

    async def load(self, endpoints: Endpoints) -> list[tuple[str, Prompt]]:
        """The pool as the topic holds it now (a bounded read; refusals are left to follow)."""
        pool = []
        async for record in read_topic(endpoints, PROMPTS.topic, ReadRange()):
            try:
                rows = decode(record.value, record.headers, expect=("prompts",)).to_pylist()
            except DecodeError:
                continue
            pool += self.admit(rows)[0]
        return pool

    async def follow(self, endpoints: Endpoints, dead: DeadLetters, join) -> None:
        """Read the topic from the start for good: `join(entries)` for new pool entries,
        dead letters for undecodable messages and refused prompts."""
        async for record in read_topic(endpoints, PROMPTS.topic, ReadRange(follow=True)):
            try:
                rows = decode(record.value, record.headers, expect=("prompts",)).to_pylist()
            except DecodeError as error:
                await dead.send(record, error)
                continue
            fresh, refused = self.admit(rows)
            for i, reason in refused:
                await dead.send(record, PromptRefused(reason), part=i)
            if fresh:
                join(fresh)


@dataclass
class Demand:
    """What the trainer has consumed, from its policy_versions announcements."""

    rl_step: int = 0
    groups_consumed: int = 0
    started: bool = False  # the trainer announced its first RL policy
    done: bool = False


async def follow_trainer(endpoints: Endpoints, run_id: str, demand: Demand) -> None:
    async with contextlib.aclosing(follow_run(endpoints, [POLICY_VERSIONS.topic], run_id)) as polls:
        async for found in polls:
            for row in found.get(POLICY_VERSIONS.name, []):
                if row["phase"] == "done":
                    demand.done = True
                elif row["phase"] == "rl":
                    demand.started = True
                    demand.rl_step = max(demand.rl_step, row["step"])
                    demand.groups_consumed = max(
                        demand.groups_consumed, row["groups_consumed"] or 0
                    )
            if demand.done:
                return


BACKLOG_EVERY_S = 5.0


async def export_backlog(endpoints: Endpoints, group: str, demand: Demand) -> None:
    """The rollout workers' request backlog as a gauge (`ROLLOUT_REQUEST_BACKLOG`), for the
    dashboard and its alert: the same consumer lag the autoscaler and KEDA read."""
    while not demand.done:
        try:
            metrics.ROLLOUT_REQUEST_BACKLOG.set(await group_lag(endpoints, group, REQUESTS.topic))
        except Exception as exc:  # noqa: BLE001  (a broker outage: the gauge keeps its value)
            log.debug("backlog not measured: %s", exc)
        for _ in range(int(BACKLOG_EVERY_S / 0.5)):  # the run's end is not kept waiting
            if demand.done:
                return
            await asyncio.sleep(0.5)
