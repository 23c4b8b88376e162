"""The environment state in Qdrant: one vector per prompt with its outcomes and predictions, read
back for diversity and neighbourhood statistics, and its snapshot in the object store."""

from __future__ import annotations

import contextlib
import json
import logging
import time

from rlstream import metrics
from rlstream.connectors.endpoints import Endpoints
from rlstream.trainers.envs import Prompt
from rlstream.trainers.selection.ppm import WarmStartError

log = logging.getLogger(__name__)


class EnvironmentState:
    """Prompt vectors with running outcome statistics in Qdrant, one collection per run.

    Upserts are batched (`flush_every` groups); the payload carries task, attempts, successes,
    pass rate and the last policy version that tried the prompt, so the neighbourhood of an
    unseen prompt can be looked up by similarity. While the store is unavailable the statistics
    stay in memory and the flush is retried every `RETRY_S`: selection never waits for it.
    """

    RETRY_S = 5.0

    def __init__(self, endpoints: Endpoints, run_id: str, featurize, flush_every: int = 32):
        from rlstream.connectors.vectors import VectorStore

        self.featurize = featurize  # the PPM's prompt vectors (its neighbourhood is read here)
        self.store = VectorStore.open(endpoints, collection_name(run_id), featurize.dim,
                                      create=False)  # fmt: skip
        self.ensured = False  # the collection is made at the first flush that reaches the store
        with contextlib.suppress(Exception):  # unavailable: the first flush that reaches it
            self.store.ensure()
            self.ensured = True
        self.stats: dict[str, dict] = {}
        self.dirty: dict[str, Prompt] = {}
        self.carried: list = []  # another run's points, to write under this run (warm start)
        self.flush_every = flush_every
        self.retry_at = 0.0  # monotonic; a failed flush waits until then

    def observe(self, prompt: Prompt, rewards: list[float], policy_version: int) -> None:
        s = self.stats.setdefault(
            prompt.prompt_id, {"task": prompt.task, "attempts": 0, "successes": 0}
        )
        s["attempts"] += len(rewards)
        s["successes"] += sum(r > 0.5 for r in rewards)
        s["pass_rate"] = s["successes"] / s["attempts"]
        s["last_policy_version"] = policy_version
        self.dirty[prompt.prompt_id] = prompt
        if len(self.dirty) >= self.flush_every and time.monotonic() >= self.retry_at:
            self.flush()

    def carry_over(self, points: list[dict]) -> None:
        """Start from another run's collection (`selection.ppm_from`, rows of `export_ppm`):
        its prompt vectors and outcome statistics are written into this run's collection now
        (or at the next flush that reaches Qdrant), so a new run's neighbourhood features read
        them from its first round; a prompt this run rolls out replaces them with its own."""
        if points and len(points[0]["vector"]) != self.store.dim:
            raise WarmStartError(
                f"selection.ppm_from: that run embedded prompts in {len(points[0]['vector'])} "
                f"dimensions, this run in {self.store.dim}; use its selection.ppm_features"
            )
        self.carried = points
        self.flush()

    def flush(self) -> bool:
        """Upsert what changed; False (kept for the next try) if the store is unavailable."""
        if not self.dirty and not self.carried:
            return True
        prompts = list(self.dirty.values())
        try:
            if not self.ensured:
                self.store.ensure()
                self.ensured = True
            if self.carried:
                self.store.upsert([p["id"] for p in self.carried],
                                  [p["vector"] for p in self.carried],
                                  [json.loads(p["payload"]) for p in self.carried])  # fmt: skip
                self.carried = []
            if not prompts:
                return True
            self.store.upsert(
                [int(p.prompt_id, 16) for p in prompts],
                self.featurize(prompts).tolist(),
                [self.stats[p.prompt_id] | {"prompt_id": p.prompt_id} for p in prompts],
            )
        except Exception as exc:  # noqa: BLE001  (a server's client raises several kinds)
            metrics.SCHEDULER_VECTOR_FAILURES.inc()
            if self.retry_at == 0.0:
                log.warning("vector store unavailable (%s); %d prompts kept, retrying every "
                            "%.0f s", exc, len(self.dirty), self.RETRY_S)  # fmt: skip
            self.retry_at = time.monotonic() + self.RETRY_S
            return False
        if self.retry_at:
            log.info("vector store available again: %d prompts written", len(prompts))
        self.retry_at = 0.0
        self.dirty.clear()
        return True

    def close(self) -> None:
        self.flush()
        self.store.close()


def collection_name(run_id: str) -> str:
    return f"prompts-{run_id}"


def state_object(run_id: str) -> str:
    """Where the scheduler's snapshot lives in the object store."""
    return f"{run_id}/scheduler/state.pt"
