"""Policy versions: the trainer writes weights to the object store, then announces them on
rl.policy_versions.v1; rollout workers follow the announcements and load the newest weights.

A version is a Hugging Face directory (`save_policy`: config.json, model.safetensors, the
tokenizer files, rlstream.json) under `<run>/policies/version=NNNNNN/`; its `checkpoint_uri` is
that prefix. `rlstream export` copies one out; plain `transformers` loads it.

With `loop.weight_sync=DIR` (a directory every process of the run sees: a shared volume) the
versions go there instead (`SharedPolicies`: `DIR/<run>/version=NNNNNN/`, renamed into place
whole) and are announced as file:// URIs, which the followers load in place, with no object
store round trip; the versions kept for good and the last one are also uploaded, so `rlstream
export` and the registry find them.

The store keeps the newest `checkpoint.keep_policies` versions, version 0 and every
`checkpoint.keep_policy_every`-th (`PolicyPruner`): kept whole, 920 soak steps of a 0.35M
model stored 3 GB of versions, and a follower only ever loads the newest. A follower that was
announced a version deleted before it loaded loads the newest announced one still stored."""

from __future__ import annotations

import asyncio
import logging
import shutil
import tempfile
from pathlib import Path

from minio.error import S3Error

from rlstream import metrics
from rlstream.connectors.endpoints import Endpoints
from rlstream.connectors.kafka import EventProducer
from rlstream.connectors.objectstore import (  # noqa: F401  (the policy layout's home)
    POLICY_META,
    ObjectStore,
    download_policy,
    policy_prefix,
    stored_versions,
)
from rlstream.connectors.reading import follow_run
from rlstream.schemas import get, rows_to_batch
from rlstream.trainers.lm import prepare_transformers
from rlstream.trainers.policy import Policy, load_policy, save_policy

log = logging.getLogger(__name__)
POLICY_VERSIONS = get("policy_versions")


def kept_for_good(version: int, every: int) -> bool:
    """Version 0 (the pre-trained policy) and every `every`-th (none when 0)."""
    return version == 0 or (every > 0 and version % every == 0)


def kept(version: int, newest: int, keep: int, every: int) -> bool:
    """Whether a stored version stays once `newest` is published: the newest `keep`, and
    those kept for good."""
    return version > newest - keep or kept_for_good(version, every)


class PolicyPruner:
    """Deletes the versions that are no longer kept as new ones are published. It lists the
    store once (what an earlier incarnation of the trainer left), then tracks what it adds."""

    def __init__(self, store: ObjectStore, run_id: str, keep: int, every: int):
        self.store, self.run_id, self.keep, self.every = store, run_id, keep, every
        self.pending: set[int] | None = None  # stored versions that a later publish may drop

    def published(self, newest: int) -> list[int]:
        """Delete what `newest` makes redundant; the versions deleted."""
        if self.pending is None:
            self.pending = set(stored_versions(self.store, self.run_id))
        self.pending.add(newest)
        gone = sorted(v for v in self.pending if not kept(v, newest, self.keep, self.every))
        for version in gone:
            names = self.store.list(policy_prefix(self.run_id, version))
            # rlstream.json first: a version deleted halfway reads as incomplete, never loaded
            for name in sorted(names, key=lambda n: not n.endswith(POLICY_META)):
                self.store.delete(name)
        forever = {v for v in self.pending if kept_for_good(v, self.every)}
        self.pending -= set(gone) | forever
        return gone


class SharedPolicies:
    """A run's policy versions in a shared directory, pruned like the store's."""

    def __init__(self, root: str | Path, run_id: str, keep: int, every: int):
        self.directory = Path(root) / run_id
        self.keep, self.every = keep, every

    def write(self, policy: Policy) -> str:
        """The version's directory, written beside and renamed into place (a follower never
        sees half of it); its file:// URI."""
        final = self.directory / f"version={policy.version:06d}"
        partial = final.with_name(final.name + ".partial")
        shutil.rmtree(partial, ignore_errors=True)
        save_policy(policy, partial)
        shutil.rmtree(final, ignore_errors=True)  # a restarted trainer writes its version again
        partial.rename(final)
        return f"file://{final}"

    def prune(self, newest: int) -> list[int]:
        gone = []
        for path in self.directory.glob("version=*"):
            version = int(path.name.removeprefix("version=").removesuffix(".partial"))
            if not kept(version, newest, self.keep, self.every):
                # rlstream.json first: a version deleted halfway reads as gone, never loaded
                (path / POLICY_META).unlink(missing_ok=True)
                shutil.rmtree(path, ignore_errors=True)
                gone.append(version)
        return sorted(gone)


def upload_policy(store: ObjectStore, prefix: str, policy: Policy) -> None:
    """Every file of the version's directory, rlstream.json last (it marks it complete)."""
    with tempfile.TemporaryDirectory() as d:
        files = sorted(
            save_policy(policy, d).iterdir(), key=lambda p: (p.name == POLICY_META, p.name)
        )
        for path in files:
            store.put_file(prefix + path.name, path)


def preload() -> None:
    """Import what `load_policy` imports on first use."""
    prepare_transformers()
    from transformers import AutoModelForCausalLM  # noqa: F401


def fetch_policy(store: ObjectStore, uri: str, device: str = "cpu") -> Policy:
    """The policy version at `uri`; FileNotFoundError when it is gone, also when the pruning
    deletes it while it is read (CI: transformers, its files vanishing mid-load, took the path
    for a hub repo id, and the worker crashed)."""
    if uri.startswith("file://"):  # a shared directory (loop.weight_sync): loaded in place
        directory = Path(uri.removeprefix("file://"))
        if not (directory / POLICY_META).is_file():
            raise FileNotFoundError(f"no policy version in {directory}")
        try:
            policy = load_policy(directory, device)
        except OSError as exc:
            if not (directory / POLICY_META).is_file() or not directory.is_dir():
                raise FileNotFoundError(f"{directory} was pruned while it was read") from exc
            raise
        # The pruning removes rlstream.json first: still there, no file went before the read
        # ended. Gone, the read may have raced the deletion without an error: transformers
        # built a tokenizer of one token from a directory that had lost tokenizer.json and
        # tokenizer_config.json, and a rollout worker dead-lettered every request with it.
        if not (directory / POLICY_META).is_file():
            raise FileNotFoundError(f"{directory} was pruned while it was read")
        return policy
    with tempfile.TemporaryDirectory() as d:
        return load_policy(download_policy(store, uri, d), device)


async def publish_policy(
    producer: EventProducer,
    store: ObjectStore,
    run_id: str,
    policy: Policy,
    step: int,
    phase: str,
    groups_consumed: int = 0,
    upload: bool = True,
    shared: SharedPolicies | None = None,
    every: int = 0,
) -> str:
    """Weights first, then the event: a worker never hears of weights it cannot load.

    upload=False re-announces the current version (a demand signal for the scheduler).
    `shared`: the weights go to the shared directory and are announced from there; the object
    store gets the versions kept for good (`every`) and the last (phase done) for the record.
    """
    prefix = policy_prefix(run_id, policy.version)
    uri = f"s3://{store.bucket}/{prefix}"
    if upload and shared is not None:
        uri = await asyncio.to_thread(shared.write, policy)
        if kept_for_good(policy.version, every) or phase == "done":
            await asyncio.to_thread(upload_policy, store, prefix, policy)
    elif upload:
        await asyncio.to_thread(upload_policy, store, prefix, policy)
    elif shared is not None:
        uri = f"file://{shared.directory / f'version={policy.version:06d}'}"
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
        self.announced = 0  # announcements read

    async def run(self) -> None:
        """Follow rl.policy_versions.v1 from the beginning; load only the newest of each poll.
        The loading code is imported first: the first version is announced when RL starts, and
        importing transformers' auto classes then (~4 s of CPU) delayed the first rollouts."""
        await asyncio.to_thread(preload)
        async for found in follow_run(self.endpoints, [POLICY_VERSIONS.topic], self.run_id):
            if found.get(POLICY_VERSIONS.name):
                await self.offer(found[POLICY_VERSIONS.name])

    async def wait_ready(self, warn_every_s: float = 30.0) -> None:
        """Until a policy is loaded, saying every `warn_every_s` what it waits for (work that
        needs the policy stands still meanwhile: it should not do so silently)."""
        while not self.ready.is_set():
            try:
                await asyncio.wait_for(self.ready.wait(), warn_every_s)
            except TimeoutError:
                log.warning("%s: no policy of run %s loaded yet (%d announcements read); "
                            "waiting", self.role, self.run_id, self.announced)  # fmt: skip

    async def offer(self, rows: list[dict]) -> None:
        """Load the newest version announced in `rows` that is newer than the loaded one; one
        no longer stored gives way to the next older announced one. Waiting for a newer one
        instead would wait forever where no trainer runs any more: the chaos suite's drain
        starts rollout workers after the run, which read every announcement at once."""
        self.announced += len(rows)
        current = -1 if self.policy is None else self.policy.version
        newest = {r["version"]: r for r in rows if r["version"] > current}  # the last per version
        for version in sorted(newest, reverse=True):
            if await self._load(newest[version]):
                return

    async def _load(self, row: dict) -> bool:
        try:
            policy = await asyncio.to_thread(fetch_policy, self.store, row["checkpoint_uri"])
        except (FileNotFoundError, S3Error) as exc:
            if isinstance(exc, S3Error) and exc.code not in ("NoSuchKey", "NoSuchObject"):
                raise
            # pruned while announced (the trainer published newer ones meanwhile): `offer`
            # tries the next older one
            log.info("policy version %d is no longer stored", row["version"])
            return False
        self.policy = policy
        self.loads += 1
        metrics.POLICY_VERSION.labels(self.role).set(self.policy.version)
        self.ready.set()
        log.info("loaded policy version %d", self.policy.version)
        return True
