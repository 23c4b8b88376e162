"""Policy versions: the trainer writes weights to the object store, then announces them on
rl.policy_versions.v1; rollout workers follow the announcements and load the newest weights."""

from __future__ import annotations

import asyncio
import logging

from rlstream import metrics
from rlstream.connectors.endpoints import Endpoints
from rlstream.connectors.kafka import EventProducer
from rlstream.connectors.objectstore import ObjectStore
from rlstream.connectors.reading import follow_run
from rlstream.schemas import get, rows_to_batch
from rlstream.trainers.policy import Policy, policy_from_bytes, policy_to_bytes

log = logging.getLogger(__name__)
POLICY_VERSIONS = get("policy_versions")


def policy_object(run_id: str, version: int) -> str:
    return f"{run_id}/policies/version={version:06d}.pt"


async def publish_policy(
    producer: EventProducer,
    store: ObjectStore,
    run_id: str,
    policy: Policy,
    step: int,
    phase: str,
    groups_consumed: int = 0,
    upload: bool = True,
) -> str:
    """Weights first, then the event: a worker never hears of weights it cannot load.

    upload=False re-announces the current version (a demand signal for the scheduler).
    """
    name = policy_object(run_id, policy.version)
    uri = f"s3://{store.bucket}/{name}"
    if upload:
        uri = await asyncio.to_thread(store.put_bytes, name, policy_to_bytes(policy))
    row = {
        "version": policy.version,
        "checkpoint_uri": uri,
        "step": step,
        "phase": phase,
        "groups_consumed": groups_consumed,
    }
    await producer.send(
        POLICY_VERSIONS,
        rows_to_batch(POLICY_VERSIONS, [row], run_id=run_id, policy_version=policy.version),
    )
    return uri


class PolicyFollower:
    """Tracks the newest announced policy of a run and keeps its weights loaded."""

    def __init__(self, endpoints: Endpoints, run_id: str, role: str = "rollout_worker"):
        self.endpoints, self.run_id, self.role = endpoints, run_id, role
        self.store = ObjectStore(endpoints)
        self.policy: Policy | None = None
        self.ready = asyncio.Event()
        self.loads = 0

    async def run(self) -> None:
        """Follow rl.policy_versions.v1 from the beginning; load only the newest of each poll."""
        async for found in follow_run(self.endpoints, [POLICY_VERSIONS.topic], self.run_id):
            rows = found.get(POLICY_VERSIONS.name, [])
            newest = max(rows, key=lambda r: r["version"], default=None)
            if newest and (self.policy is None or newest["version"] > self.policy.version):
                await self._load(newest)

    async def _load(self, row: dict) -> None:
        name = row["checkpoint_uri"].split("/", 3)[3]  # s3://bucket/<name>
        data = await asyncio.to_thread(self.store.get_bytes, name)
        self.policy = policy_from_bytes(data)
        self.loads += 1
        metrics.POLICY_VERSION.labels(self.role).set(self.policy.version)
        self.ready.set()
        log.info("loaded policy version %d", self.policy.version)
