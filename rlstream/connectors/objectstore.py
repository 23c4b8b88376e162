"""The object store (S3: MinIO in production, SeaweedFS embedded) over the `minio` client.

Layout (ARCHITECTURE.md): `<run_id>/experience/policy=<v>/part-<first_offset>.parquet`,
`<run_id>/checkpoints/step=<n>/...`, `<run_id>/reports/...`. Object names are derived from event
ids or offsets, so writing the same thing twice overwrites it instead of duplicating it.
Transient failures (connection errors, 5xx, throttling) are retried with exponential backoff
for up to `RLSTREAM_S3_RETRY_S` seconds: 10 by default (a command fails soon), the loop's
processes get `loop.s3_retry_s` (120), so an S3 server that is down for a while (restarted,
failed over) stalls them instead of crashing them.
"""

from __future__ import annotations

import io
import logging
import os
from collections.abc import Iterator
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import urllib3
from minio import Minio
from minio.error import S3Error
from tenacity import (
    retry,
    retry_if_exception,
    stop_after_delay,
    wait_exponential,
)

from rlstream.connectors.endpoints import Endpoints

log = logging.getLogger(__name__)

_RETRYABLE_S3_CODES = {"InternalError", "ServiceUnavailable", "SlowDown", "RequestTimeout"}


def _transient(exc: BaseException) -> bool:
    if isinstance(exc, S3Error):
        return exc.code in _RETRYABLE_S3_CODES
    return isinstance(exc, urllib3.exceptions.HTTPError | ConnectionError | TimeoutError)


def _warn(state) -> None:
    if state.attempt_number in (3, 10) or state.attempt_number % 30 == 0:
        log.warning("S3 unavailable (%s); retrying for up to %.0f s",
                    state.outcome.exception(), retry_budget_s())  # fmt: skip


def retry_budget_s() -> float:
    return float(os.environ.get("RLSTREAM_S3_RETRY_S", "10"))


_retry = retry(
    retry=retry_if_exception(_transient),
    stop=lambda state: stop_after_delay(retry_budget_s())(state),
    wait=wait_exponential(multiplier=0.1, max=2),
    before_sleep=_warn,
    reraise=True,
)


class ObjectStore:
    """Put, get and list objects (Parquet tables, checkpoints, reports) in one bucket."""

    def __init__(self, endpoints: Endpoints, bucket: str | None = None):
        self.bucket = bucket or endpoints.s3_bucket
        http = urllib3.PoolManager(
            timeout=urllib3.Timeout(connect=5, read=60), retries=False, maxsize=8
        )
        self.client = Minio(
            endpoints.s3_endpoint,
            access_key=endpoints.s3_access_key,
            secret_key=endpoints.s3_secret_key,
            secure=endpoints.s3_secure,
            http_client=http,
        )

    @_retry
    def ensure_bucket(self) -> None:
        if not self.client.bucket_exists(self.bucket):
            self.client.make_bucket(self.bucket)

    @_retry
    def put_bytes(self, name: str, data: bytes, content_type: str = "application/octet-stream"):
        self.client.put_object(
            self.bucket, name, io.BytesIO(data), len(data), content_type=content_type
        )
        return f"s3://{self.bucket}/{name}"

    @_retry
    def get_bytes(self, name: str) -> bytes:
        response = self.client.get_object(self.bucket, name)
        try:
            return response.read()
        finally:
            response.close()
            response.release_conn()

    def put_parquet(self, name: str, table: pa.Table | pa.RecordBatch) -> str:
        if isinstance(table, pa.RecordBatch):
            table = pa.Table.from_batches([table])
        sink = io.BytesIO()
        pq.write_table(table, sink, compression="zstd")
        return self.put_bytes(name, sink.getvalue(), "application/vnd.apache.parquet")

    def get_parquet(self, name: str) -> pa.Table:
        return pq.read_table(io.BytesIO(self.get_bytes(name)))

    def put_file(self, name: str, path: Path) -> str:
        return self.put_bytes(name, Path(path).read_bytes())

    def get_file(self, name: str, path: Path) -> Path:
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(self.get_bytes(name))
        return path

    @_retry
    def list(self, prefix: str = "") -> list[str]:
        """Object names under `prefix`, recursively, sorted."""
        objects = self.client.list_objects(self.bucket, prefix=prefix, recursive=True)
        return sorted(o.object_name for o in objects)

    @_retry
    def exists(self, name: str) -> bool:
        try:
            self.client.stat_object(self.bucket, name)
        except S3Error as exc:
            if exc.code in ("NoSuchKey", "NoSuchObject", "NotFound"):
                return False
            raise
        return True

    @_retry
    def delete(self, name: str) -> None:
        self.client.remove_object(self.bucket, name)

    def read_parquet_prefix(self, prefix: str) -> pa.Table:
        """Concatenate every Parquet object under `prefix` (e.g. a run's experience archive)."""
        tables = [self.get_parquet(n) for n in self.list(prefix) if n.endswith(".parquet")]
        return pa.concat_tables(tables) if tables else pa.table({})

    def iter_parquet(self, prefix: str) -> Iterator[tuple[str, pa.Table]]:
        for name in self.list(prefix):
            if name.endswith(".parquet"):
                yield name, self.get_parquet(name)


class PrefixStore:
    """A named-bytes store under one prefix of the object store (a checkpoint directory in S3).

    Implements the trainers' CheckpointStore protocol: save_bytes, load_bytes, list, delete.
    """

    def __init__(self, store: ObjectStore, prefix: str):
        self.store = store
        self.prefix = prefix.rstrip("/") + "/"

    def save_bytes(self, name: str, data: bytes) -> None:
        self.store.put_bytes(self.prefix + name, data)

    def load_bytes(self, name: str) -> bytes:
        return self.store.get_bytes(self.prefix + name)

    def list(self) -> list[str]:
        return [n[len(self.prefix) :] for n in self.store.list(self.prefix)]

    def delete(self, name: str) -> None:
        self.store.delete(self.prefix + name)


def experience_object(run_id: str, policy_version: int, request_id: str) -> str:
    """The archive name of one experience group: idempotent, derived from its request id."""
    return f"{run_id}/experience/policy={policy_version}/group-{request_id}.parquet"


def checkpoint_prefix(run_id: str) -> str:
    return f"{run_id}/checkpoints/"


POLICY_META = "rlstream.json"
"""beside a policy version's Hugging Face files (version and context length); written last, so
a version without it is an upload a crash cut short"""


def policy_prefix(run_id: str, version: int) -> str:
    return f"{run_id}/policies/version={version:06d}/"


def stored_versions(store: ObjectStore, run_id: str) -> dict[int, str]:
    """The run's complete policy versions in the object store: version -> its s3:// uri (an
    upload a crash cut short has no rlstream.json, written last)."""
    found = {}
    for name in store.list(f"{run_id}/policies/version="):
        _, _, head, file = name.split("/", 3)  # <run>/policies/version=NNNNNN/<file>
        if file == POLICY_META:
            found[int(head.removeprefix("version="))] = (
                f"s3://{store.bucket}/{run_id}/policies/{head}/"
            )
    return found


def download_policy(store: ObjectStore, uri: str, directory: str | Path) -> Path:
    """The version at `uri` (s3://bucket/<prefix>) as a local Hugging Face directory."""
    prefix = uri.split("/", 3)[3]
    names = store.list(prefix)
    if not names:
        raise FileNotFoundError(f"no policy version under {uri}")
    for name in names:
        store.get_file(name, Path(directory) / name.removeprefix(prefix))
    return Path(directory)
