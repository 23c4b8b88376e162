"""The trainer process: pre-train on rl.corpus.v1 until converged, then RL on rl.experience.v2.

    python -m rlstream.streams.trainer --config config.json

The updates are the training core's (`trainers/core.py`: the same `pretrain_step` and
`rl_update` the in-process loop calls, GRPO or PPO); this file owns where the data comes from.
In hybrid mode (`rl.hybrid`) every update mixes in pre-training loss at `rl.hybrid_ratio`,
drawn from a corpus that takes in the documents arriving on rl.corpus.v1 during RL (verified
rollouts fed back), so what the loop feeds back changes training.

Effectively-once training on an at-least-once stream: every experience row is de-duplicated
by event_id, and consumer offsets are committed only right after a checkpoint (model,
optimizer, the set of trained ids, counters) is in the object store, so a restarted trainer
resumes from the checkpoint and the offsets that match it. Groups produced by a policy more
than `max_policy_lag` versions old are dropped and counted. Each update announces a policy
version (weights to S3, then the event); evaluations go to rl.eval_results.v1; verified-correct
rollouts go back into rl.corpus.v1.

The trainer's ledger says what became of every group it consumed (`experience_checks.py`),
written with each checkpoint.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import os
import sys
import time
from collections import Counter, defaultdict
from pathlib import Path

import psutil
import torch

from rlstream import metrics as prom
from rlstream import sandbox
from rlstream.config import Config
from rlstream.connectors.endpoints import Endpoints
from rlstream.connectors.kafka import EventProducer
from rlstream.connectors.objectstore import ObjectStore, PrefixStore, checkpoint_prefix
from rlstream.streams import EXIT_STOPPED, STOPPED_PREFIX
from rlstream.streams.experience_checks import (
    EnvironmentBroken,
    VersionWindow,
    ledger_entry,
    write_ledger,
)
from rlstream.streams.policystore import PolicyPruner, SharedPolicies, publish_policy
from rlstream.streams.trainer_data import (
    eval_rows,
    metric_rows,
    send_eval_rows,
    set_metric_gauges,
    wait_for_dataset,
)
from rlstream.streams.trainer_intake import GroupIntake
from rlstream.streams.trainer_rl import rl
from rlstream.streams.trainer_summary import summarize
from rlstream.trainers.checkpoint import latest_checkpoint, save_checkpoint, set_rng_state
from rlstream.trainers.core import TrainState, follow, pretrain_step, rl_update
from rlstream.trainers.datasets import usable
from rlstream.trainers.envs import Prompt
from rlstream.trainers.evaluate import evaluate_with
from rlstream.trainers.pretrain import Corpus
from rlstream.trainers.ranks import RANK_ENV, Ranks
from rlstream.trainers.rl import Experience

log = logging.getLogger(__name__)
CHECKPOINT_SIZES_KEPT = 200  # (step, bytes) pairs in the summary (older ones thinned)
PROGRESS_EVERY = 20
"""pre-training steps between loss figures on the events (and the first step's: the run's
start-up ends there); validation figures come at every pretrain.eval_interval"""


class StreamTrainer(GroupIntake):
    """The training core (`TrainState`, `pretrain_step`, `rl_update`) fed from topics; its
    intake of experience rows into groups is `GroupIntake`'s."""

    def __init__(self, cfg: Config, endpoints: Endpoints):
        self.cfg, self.endpoints = cfg, endpoints
        self.store = ObjectStore(endpoints)
        keep, every = cfg.checkpoint.keep_policies, cfg.checkpoint.keep_policy_every
        self.pruner = PolicyPruner(self.store, cfg.run_id, keep, every)
        sync = cfg.loop.weight_sync
        self.shared = None if sync == "s3" else SharedPolicies(sync, cfg.run_id, keep, every)
        self.ckpts = PrefixStore(self.store, checkpoint_prefix(cfg.run_id))
        self.state = TrainState(cfg, threads=cfg.threads(streaming=True))
        self.val: Corpus | None = None
        self.eval_set: list[Prompt] = []
        self.refused: dict[str, int] = {}  # held-out prompts and documents the model cannot take
        self.corpus: Corpus | None = None
        self.doc_ids: set[str] = set()  # documents in the corpus (hybrid: new ones join it)
        self.arrived: list[tuple[str, str]] = []  # fed-back documents not in the corpus yet
        self.pretrain_eval: dict = {}
        self.seen = VersionWindow()  # rows taken (the de-duplication)
        self.trained = VersionWindow()  # rows trained, kept apart to count what `seen` misses
        self.counters = defaultdict(float)
        self.pending: dict[str, dict[int, dict]] = defaultdict(dict)
        self.ready: list[list[dict]] = []
        self.ledger: list[dict] = []  # outcomes since the last checkpoint
        self.checkpoint_sizes: list[tuple[int, int]] = []  # (rl step, bytes), this process's
        self.failed_in_a_row: Counter[str] = Counter()  # env error kinds since a good group
        self.restored: dict | None = None  # the checkpoint this trainer resumed from

    def state_dict(self) -> dict:
        """The train state plus the stream's: ids seen and trained (within the trainable
        window), rows taken but not trained yet (their offsets are committed with this
        checkpoint), and counters."""
        pending = {rid: list(group.values()) for rid, group in self.pending.items()}
        stream = {
            "seen": self.seen.state_dict(),
            "counters": dict(self.counters),
            "pending": pending,
            "ready": self.ready,
            "trained_ids": self.trained.state_dict(),
            "pretrain_eval": self.pretrain_eval,
        }
        return self.state.state_dict() | {"stream": stream}

    def restore(self) -> bool:
        ck = latest_checkpoint(self.ckpts)
        if ck is None:
            return False
        self.restored = ck  # what the other trainer ranks start from (ZeRO: their partitions)
        self.state.load_state_dict(ck)
        set_rng_state(ck["rng"])
        stream = ck["stream"]
        self.seen.load_state_dict(stream["seen"], self.state.version)
        self.counters.update(stream["counters"])
        self.pending.update(
            {rid: {r["sample_idx"]: r for r in rows} for rid, rows in stream["pending"].items()}
        )
        self.ready = stream["ready"]
        self.trained.load_state_dict(stream["trained_ids"], self.state.version)
        self.pretrain_eval = stream["pretrain_eval"]
        log.info("resumed at step %d (phase %s)", self.state.step, self.state.phase)
        return True

    def checkpoint(self, final: bool = False) -> None:
        """The ledger part for the steps since the last checkpoint, then the checkpoint (the
        last one also lists what was taken but never trained)."""
        ck, step = self.cfg.checkpoint, self.state.step
        log.info("checkpoint at step %d", step)
        if final:
            self.record_untrained()
        if self.ledger:
            write_ledger(self.store, self.cfg.run_id, self.state.rl_step, self.ledger)
            self.ledger = []
        size = save_checkpoint(self.ckpts, step, self.state_dict(), keep_last=ck.keep_last)
        prom.TRAINER_CHECKPOINT_BYTES.set(size)
        self.checkpoint_sizes.append((self.state.rl_step, size))
        if len(self.checkpoint_sizes) > 2 * CHECKPOINT_SIZES_KEPT:  # thinned, oldest first
            del self.checkpoint_sizes[:-CHECKPOINT_SIZES_KEPT:2]

    def record_untrained(self) -> None:
        """The groups taken but never trained when the run ends (their offsets are committed)."""
        for group in [*self.ready, *(list(g.values()) for g in self.pending.values())]:
            self.record(group, "untrained_at_end")

    def record(self, group: list[dict], outcome: str) -> None:
        self.ledger.append(ledger_entry(group, outcome, self.state.rl_step))

    def evaluate(self) -> dict:
        return evaluate_with(self.state.model, self.state.tok, self.eval_set, self.cfg)

    async def emit_eval(self, producer: EventProducer, phase: str) -> dict:
        result = await asyncio.to_thread(self.evaluate)
        rows = eval_rows(self.state.rl_step, phase, result, self.cfg.eval.prompts)
        for name in ("greedy", "pass1"):
            if name in result:
                prom.TRAINER_ACCURACY.labels(name).set(result[name])
        await send_eval_rows(producer, self.cfg, self.state.version, rows)
        return result

    async def emit_metrics(self, producer: EventProducer, phase: str, step: int, row: dict):
        """Training figures (losses, entropy, reward) as eval_results rows with task=phase."""
        rows = metric_rows(phase, step, row)
        set_metric_gauges(phase, rows)
        await send_eval_rows(producer, self.cfg, self.state.version, rows)

    async def announce(self, producer: EventProducer, phase: str = "rl", upload: bool = True):
        """Publish the current policy version (weights to S3 first unless upload=False, which
        only refreshes the scheduler's demand signal)."""
        policy = self.state.policy()
        await publish_policy(
            producer,
            self.store,
            self.cfg.run_id,
            policy,
            self.state.rl_step,
            phase,
            int(self.counters["groups_consumed"]),
            upload=upload,
            shared=self.shared,
            every=self.cfg.checkpoint.keep_policy_every,
        )
        if upload:  # the store keeps the newest versions and every keep_policy_every-th
            await asyncio.to_thread(self.pruner.published, policy.version)
            if self.shared is not None:
                await asyncio.to_thread(self.shared.prune, policy.version)

    async def load_data(self) -> None:
        """Evaluation prompts and the pre-training corpus from the run's dataset (waiting for
        it to be published). What the tokenizer or the context cannot take is left out and
        counted (`refused` in the summary): a user's data never raises inside the trainer."""
        cfg, tok = self.cfg, self.state.tok
        started = time.monotonic()
        view = await wait_for_dataset(self.endpoints, cfg)
        read = time.monotonic()
        data = usable(view, cfg, tok)  # ValueError: nothing usable; the run cannot go on
        self.eval_set, self.refused = data.eval_set, data.refused
        self.corpus = Corpus(data.docs, tok, cfg.model.block_size)
        self.val = Corpus(data.validation, tok, cfg.model.block_size)
        self.doc_ids = {doc_id for _, doc_id in view.docs}
        log.info("dataset %r: %d documents, %d validation, %d held-out prompts (read in %.1f s, "
                 "waits included; tokenised in %.1f s)", cfg.data.dataset, len(data.docs),
                 len(data.validation),
                 len(self.eval_set), read - started, time.monotonic() - read)  # fmt: skip

    async def pretrain(self, producer: EventProducer) -> None:
        st = self.state
        while st.phase == "pretrain":
            row = await asyncio.to_thread(pretrain_step, st, self.corpus, self.val)
            prom.TRAINER_STEPS.labels("pretrain").inc()
            if "val_loss" in row:
                log.info("pretrain step %d val_loss %.4f", st.pre_step, row["val_loss"])
            if "val_loss" in row or st.pre_step == 1 or st.pre_step % PROGRESS_EVERY == 0:
                await self.emit_metrics(producer, "pretrain", st.pre_step, row)
        self.pretrain_eval = await self.emit_eval(producer, "pretrain")
        self.pretrain_eval.pop("pass_rates", None)
        self.pretrain_eval["steps"] = st.pre_step
        st.start_rl()
        self.checkpoint()

    def lm_batch(self, rows: int) -> tuple | None:
        """Hybrid mode: the pre-training share of this update, from a corpus that has taken in
        the documents fed back since the last update."""
        rl = self.cfg.rl
        if not rl.hybrid:
            return None
        arrived, self.arrived = self.arrived, []
        self.corpus.extend([text for _, text in arrived])
        self.counters["corpus_consumed"] += len(arrived)
        n = max(1, round(rows * rl.hybrid_ratio / (1 - rl.hybrid_ratio)))
        return self.corpus.batch(n, self.state.data_gen)

    def update(self, groups: list[list[dict]]) -> dict:
        for group in groups:
            self.count_lag(group)
        rows = [r for g in groups for r in g]
        m = rl_update(self.state, Experience.from_rows(rows), self.lm_batch(len(rows)))
        c = self.counters
        c["stale_dropped"] += m["dropped_groups"]
        c["groups_consumed"] += len(groups)
        c["filtered_this_batch"] = 0
        c["zero_variance_groups"] += m["zero_variance_groups"]
        trained = set(m.pop("trained_group_ids"))
        for group in groups:
            self.record(group, "trained" if group[0]["request_id"] in trained else "stale")
        for row in rows:
            if row["request_id"] in trained:
                c["duplicates_trained"] += row in self.trained
                self.trained.add(row)
        floor = self.state.version - self.cfg.rl.max_policy_lag
        self.seen.forget_before(floor)
        self.trained.forget_before(floor)
        c["dedup_window_ids"] = len(self.seen)
        c["experience_trained"] += len(trained) * self.cfg.rl.group_size
        prom.TRAINER_STALE_GROUPS.inc(m["dropped_groups"])
        prom.TRAINER_ZERO_VARIANCE_GROUPS.inc(m["zero_variance_groups"])
        prom.TRAINER_GROUPS.inc(len(groups))
        if trained:
            prom.TRAINER_STEPS.labels("rl").inc()
            prom.POLICY_VERSION.labels("trainer").set(self.state.version)
            if "grad_norm" in m:
                prom.TRAINER_GRAD_NORM.set(m["grad_norm"])
        return m


async def serve(cfg: Config, endpoints: Endpoints, ranks: Ranks | None = None) -> dict:
    torch.set_num_threads(cfg.threads(streaming=True))
    trainer = StreamTrainer(cfg, endpoints)
    trainer.restore()
    if ranks is not None:  # the other ranks start from this rank's state (a resume's too)
        trainer.state.join(ranks)
        ranks.send(("sync", trainer.restored or trainer.state.state_dict()))
    trainer.restored = None
    await trainer.load_data()
    async with EventProducer(endpoints) as producer:
        if trainer.state.phase != "rl":
            await trainer.pretrain(producer)
        if trainer.state.rl_step < cfg.rl.steps:
            await rl(trainer, producer)
        final = await trainer.emit_eval(producer, "final")
        summary = summarize(trainer, final)
        await asyncio.to_thread(
            trainer.store.put_bytes,
            f"{cfg.run_id}/reports/trainer.json",
            json.dumps(summary, indent=2).encode(),
        )
        await trainer.announce(producer, phase="done")
    if ranks is not None:
        ranks.send(("stop",))
    return summary


def follow_rank(cfg: Config, ranks: Ranks) -> None:
    """Ranks 1..N-1: the same train state, updated on this rank's shard of rank 0's batches."""
    torch.set_num_threads(cfg.threads(streaming=True))
    state = TrainState(cfg, threads=cfg.threads(streaming=True))
    state.join(ranks)
    follow(state, ranks, on_update=lambda phase: prom.TRAINER_STEPS.labels(phase).inc())


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--config", required=True, type=Path)
    parser.add_argument("--rank", type=int, help=f"this process's trainer rank (else ${RANK_ENV})")
    args = parser.parse_args(argv)
    rank = int(os.environ.get(RANK_ENV, "0")) if args.rank is None else args.rank
    name = f"trainer-{rank}" if rank else "trainer"
    logging.basicConfig(level=logging.INFO, format=f"%(asctime)s {name} %(message)s")
    log.info("imported in %.1f s", time.time() - psutil.Process().create_time())
    prom.serve_from_env()
    cfg = Config.read(args.config)
    ranks = Ranks.from_env(rank, cfg.loop.trainer_ranks)
    if ranks is not None and not ranks.leader:
        follow_rank(cfg, ranks)
        ranks.close()  # with rank 0's, once it has stopped the group
        return
    sandbox.configure(cfg.sandbox)  # held-out code prompts are graded in the sandbox
    try:
        summary = asyncio.run(serve(cfg, Endpoints.from_env(), ranks))
    except EnvironmentBroken as exc:
        print(f"{STOPPED_PREFIX}{exc}", flush=True)  # the supervisor reports this line
        sys.exit(EXIT_STOPPED)
    if ranks is not None:
        ranks.close()
    print(json.dumps(summary), flush=True)


if __name__ == "__main__":
    main()
