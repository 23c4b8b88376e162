"""The object store against the real SeaweedFS S3 server, and the embedded Qdrant engine."""

from __future__ import annotations

import time
from dataclasses import replace

import pyarrow as pa
import pytest
from minio.error import S3Error

from rlstream.connectors.objectstore import ObjectStore, experience_object
from rlstream.connectors.vectors import VectorStore

pytestmark = pytest.mark.integration


def test_parquet_and_bytes_round_trip_through_s3(endpoints):
    store = ObjectStore(endpoints)
    run_id = f"store-{time.time_ns()}"
    table = pa.table({"prompt_id": ["a", "b"], "reward": [1.0, 0.0]})
    name = experience_object(run_id, policy_version=3, request_id="req-17")
    assert name == f"{run_id}/experience/policy=3/group-req-17.parquet"
    uri = store.put_parquet(name, table)
    assert uri == f"s3://{endpoints.s3_bucket}/{name}"
    store.put_parquet(name, table)  # idempotent name: a rewrite, not a duplicate
    assert store.list(f"{run_id}/") == [name]
    assert store.get_parquet(name).equals(table)
    store.put_bytes(f"{run_id}/checkpoints/step=1/model.pt", b"\x01\x02")
    assert store.get_bytes(f"{run_id}/checkpoints/step=1/model.pt") == b"\x01\x02"
    assert store.read_parquet_prefix(f"{run_id}/experience/").num_rows == 2
    assert store.exists(name) and not store.exists(f"{run_id}/nothing")
    store.delete(name)
    assert not store.exists(name)


def test_wrong_credentials_are_refused(endpoints):
    from dataclasses import replace

    bad = ObjectStore(replace(endpoints, s3_secret_key="wrong"))
    with pytest.raises(S3Error):
        bad.list()


def test_embedded_qdrant_upserts_searches_and_survives_a_sigkill(endpoints, tmp_path):
    """The embedded stack's vector store: a process that upserted and was SIGKILLed before it
    closed leaves every point to the next process (the shard's write-ahead log)."""
    import subprocess
    import sys
    from dataclasses import replace

    where = replace(endpoints, qdrant_path=str(tmp_path / "q"))
    writer = f"""
import os, signal
from rlstream.connectors.endpoints import Endpoints
from rlstream.connectors.vectors import VectorStore
store = VectorStore.open(Endpoints(qdrant_path={where.qdrant_path!r}), "prompts", 3)
store.upsert([1, 2, 2**64 - 1], [[1, 0, 0], [0, 1, 0], [0.9, 0.1, 0]],
             [{{"task": "add"}}, {{"task": "mul"}}, {{"task": "add"}}])
os.kill(os.getpid(), signal.SIGKILL)
"""
    killed = subprocess.run([sys.executable, "-c", writer], capture_output=True, timeout=120)
    assert killed.returncode == -9, killed.stderr.decode()
    store = VectorStore.open(where, "prompts", 3)
    try:
        assert store.exists() and store.count() == 3
        hits = store.search([1, 0, 0], limit=2)
        assert [h.id for h in hits] == [1, 2**64 - 1] and hits[0].payload == {"task": "add"}
        assert hits[0].score == pytest.approx(1.0)
        by_id = {h.id: h for h in store.scroll_all()}
        assert by_id[2].vector == pytest.approx([0, 1, 0]) and by_id[2].payload == {"task": "mul"}
        assert not VectorStore.open(where, "absent", 3, create=False).exists()
    finally:
        store.close()


def test_checkpoints_round_trip_through_s3_with_retention(endpoints):
    import torch

    from rlstream.connectors.objectstore import PrefixStore, checkpoint_prefix
    from rlstream.trainers.checkpoint import latest_checkpoint, save_checkpoint

    run_id = f"ckpt-{time.time_ns()}"
    store = PrefixStore(ObjectStore(endpoints), checkpoint_prefix(run_id))
    for step in (1, 2, 3, 4):
        save_checkpoint(store, step, {"weights": torch.full((3,), float(step))}, keep_last=2)
    assert store.list() == ["step-00000003.pt", "step-00000004.pt"]
    latest = latest_checkpoint(store)
    assert latest["step"] == 4 and torch.equal(latest["weights"], torch.full((3,), 4.0))
    names = ObjectStore(endpoints).list(f"{run_id}/")
    assert names == [f"{run_id}/checkpoints/step-0000000{n}.pt" for n in (3, 4)]


def test_policy_versions_are_pruned_to_the_newest_and_every_nth(endpoints):
    """The trainer's pruner against the real S3 server: what an earlier trainer left is found
    by one listing, the newest two, version 0 and every 3rd stay, a deleted version is gone
    whole; a follower announced a deleted version waits for a newer one instead of failing."""
    import asyncio

    from rlstream.streams.policystore import (
        POLICY_META,
        PolicyFollower,
        PolicyPruner,
        kept,
        policy_prefix,
        stored_versions,
        upload_policy,
    )
    from rlstream.trainers.policy import build_policy

    run_id = f"prune-{time.time_ns()}"
    store = ObjectStore(endpoints)

    def upload(version: int) -> None:  # the files of a version, rlstream.json last
        for name in ("config.json", "model.safetensors", POLICY_META):
            store.put_bytes(policy_prefix(run_id, version) + name, b"{}")

    for version in range(3):  # a trainer killed after version 2: its pruner is gone
        upload(version)
    pruner = PolicyPruner(store, run_id, keep=2, every=3)
    deleted = []
    for version in range(3, 8):
        upload(version)
        deleted += pruner.published(version)
    assert deleted == [1, 2, 4, 5]
    assert sorted(stored_versions(store, run_id)) == [0, 3, 6, 7]
    assert not store.list(policy_prefix(run_id, 4))  # every file of it
    assert [v for v in range(8) if kept(v, 7, 2, 3)] == [0, 3, 6, 7]
    assert [v for v in range(8) if kept(v, 7, 2, 0)] == [0, 6, 7]

    follower = PolicyFollower(endpoints, run_id)
    uri = f"s3://{store.bucket}/{policy_prefix(run_id, 5)}"
    assert not asyncio.run(follower._load({"version": 5, "checkpoint_uri": uri}))
    assert follower.policy is None and not follower.ready.is_set()

    # a follower that reads the announcements late, the newest pruned: the newest stored one
    policy = build_policy()
    upload_policy(store, policy_prefix(run_id, 6), replace(policy, version=6))
    announced = [
        {"version": v, "checkpoint_uri": f"s3://{store.bucket}/{policy_prefix(run_id, v)}"}
        for v in (4, 6, 5, 9)  # 9: announced, then its files deleted
    ]
    asyncio.run(follower.offer(announced))
    assert follower.policy.version == 6 and follower.ready.is_set() and follower.loads == 1
    asyncio.run(follower.offer(announced[:3]))  # nothing newer than the loaded one
    assert follower.loads == 1


def test_a_follower_without_a_policy_says_so_while_it_waits(endpoints, caplog):
    import asyncio

    from rlstream.streams.policystore import PolicyFollower

    follower = PolicyFollower(endpoints, "no-policy-yet")

    async def wait_then_load():
        waiting = asyncio.create_task(follower.wait_ready(warn_every_s=0.05))
        await asyncio.sleep(0.3)
        assert not waiting.done()
        follower.ready.set()
        await asyncio.wait_for(waiting, 1)

    asyncio.run(wait_then_load())
    warnings = [r.message for r in caplog.records if "no policy of run no-policy-yet" in r.message]
    assert len(warnings) >= 2
