"""The vector store (Qdrant) for environment and prompt state, one collection per run.

Two backends behind one interface (`VectorStore`): a Qdrant server over qdrant-client when
`qdrant_url` is configured (the compose stack), otherwise Qdrant's engine embedded in the
process (qdrant-edge, one shard directory per collection under `qdrant_path`: the embedded
stack). The embedded engine is the server's Rust search in-process: on 5,000 384-d points a
batch of 130 nearest-neighbour queries takes ~38 ms, where qdrant-client's pure-Python local
mode took ~780 ms and grew with every prompt rolled out (it was the scheduler's bottleneck).
An embedded shard allows one process per directory: open it from the process that owns the
collection (the scheduler), not from every worker.
"""

from __future__ import annotations

import uuid
from abc import ABC, abstractmethod
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rlstream.connectors import faults
from rlstream.connectors.endpoints import Endpoints, state_dir


@dataclass
class Hit:
    """One point as either backend returns it: id, similarity (searches), payload, vector."""

    id: int | str
    payload: dict[str, Any]
    score: float = 0.0
    vector: list[float] | None = None


def _point_id(pid):
    """qdrant-edge hands UUID ids back as uuid.UUID; qdrant-client as str."""
    return str(pid) if isinstance(pid, uuid.UUID) else pid


class VectorStore(ABC):
    """One collection of prompt vectors with payload (task, successes, attempts, ...)."""

    collection: str
    dim: int

    @staticmethod
    def open(endpoints: Endpoints, collection: str, dim: int, create: bool = True) -> VectorStore:
        """The run's store: the configured server, else the embedded engine under qdrant_path;
        `create` makes the collection now (else at `ensure`)."""
        if endpoints.qdrant_url:
            from qdrant_client import QdrantClient

            store: VectorStore = ClientVectorStore(
                QdrantClient(url=endpoints.qdrant_url), collection, dim
            )
        else:
            root = Path(endpoints.qdrant_path or state_dir() / "qdrant")
            store = EdgeVectorStore(root, collection, dim)
        if create:
            store.ensure()
        return store

    @abstractmethod
    def ensure(self) -> None:
        """Create the collection if it does not exist."""

    @abstractmethod
    def upsert(self, ids: Sequence[int | str], vectors: Sequence[Sequence[float]], payloads):
        """Insert or replace points (id, vector, payload dict)."""

    @abstractmethod
    def search_batch(self, vectors: Sequence[Sequence[float]], limit: int = 10) -> list[list[Hit]]:
        """The `limit` nearest points (cosine, with payload) of each vector, in one request."""

    @abstractmethod
    def scroll_all(self, batch: int = 1024) -> list[Hit]:
        """Every point with its payload and vector (a run's collection: thousands of points)."""

    @abstractmethod
    def exists(self) -> bool: ...

    @abstractmethod
    def count(self) -> int: ...

    @abstractmethod
    def close(self) -> None: ...

    def search(self, vector: Sequence[float], limit: int = 10) -> list[Hit]:
        return self.search_batch([vector], limit)[0]


class ClientVectorStore(VectorStore):
    """Over qdrant-client: a Qdrant server, or its in-process ":memory:" mode (the bench)."""

    def __init__(self, client, collection: str, dim: int):
        self.client, self.collection, self.dim = client, collection, dim

    def ensure(self) -> None:
        from qdrant_client import models

        faults.check("qdrant")
        if not self.client.collection_exists(self.collection):
            self.client.create_collection(
                self.collection,
                vectors_config=models.VectorParams(size=self.dim, distance=models.Distance.COSINE),
            )

    def upsert(self, ids, vectors, payloads) -> None:
        from qdrant_client import models

        faults.check("qdrant")
        points = [
            models.PointStruct(id=i, vector=list(map(float, v)), payload=p)
            for i, v, p in zip(ids, vectors, payloads, strict=True)
        ]
        self.client.upsert(self.collection, points=points)

    def search_batch(self, vectors, limit: int = 10) -> list[list[Hit]]:
        from qdrant_client import models

        faults.check("qdrant")
        if not len(vectors):
            return []
        requests = [
            models.QueryRequest(query=list(map(float, v)), limit=limit, with_payload=True)
            for v in vectors
        ]
        found = self.client.query_batch_points(self.collection, requests)
        return [[Hit(h.id, h.payload or {}, h.score) for h in r.points] for r in found]

    def scroll_all(self, batch: int = 1024) -> list[Hit]:
        faults.check("qdrant")
        points, offset = [], None
        while True:
            page, offset = self.client.scroll(self.collection, limit=batch, offset=offset,
                                              with_payload=True, with_vectors=True)  # fmt: skip
            points += [Hit(p.id, p.payload or {}, vector=list(p.vector)) for p in page]
            if offset is None:
                return points

    def exists(self) -> bool:
        faults.check("qdrant")
        return self.client.collection_exists(self.collection)

    def count(self) -> int:
        faults.check("qdrant")
        return self.client.count(self.collection).count

    def close(self) -> None:
        self.client.close()


class EdgeVectorStore(VectorStore):
    """Over qdrant-edge: the collection is a shard directory `root/<collection>`, durable (its
    write-ahead log survives a SIGKILL), searched with one thread (the loop's cores are for
    training). The shard is opened at the first call that needs it."""

    def __init__(self, root: str | Path, collection: str, dim: int):
        self.path = Path(root) / collection
        self.collection, self.dim = collection, dim
        self._shard = None

    def _open(self, create: bool = False):
        if self._shard is None:
            import qdrant_edge as qe

            if (self.path / "edge_config.json").exists():
                self._shard = qe.EdgeShard.load(str(self.path))
            elif create:
                params = qe.EdgeVectorParams(size=self.dim, distance=qe.Distance.Cosine)
                config = qe.EdgeConfig(vectors=params, max_search_threads=1)
                self._shard = qe.EdgeShard.create(str(self.path), config)
        return self._shard

    def ensure(self) -> None:
        faults.check("qdrant")
        self._open(create=True)

    def upsert(self, ids, vectors, payloads) -> None:
        import qdrant_edge as qe

        faults.check("qdrant")
        points = [
            qe.Point(i, list(map(float, v)), p)
            for i, v, p in zip(ids, vectors, payloads, strict=True)
        ]
        self._open(create=True).update(qe.UpdateOperation.upsert_points(points))

    def search_batch(self, vectors, limit: int = 10) -> list[list[Hit]]:
        import qdrant_edge as qe

        faults.check("qdrant")
        shard = self._open()
        if not len(vectors) or shard is None:
            return [[] for _ in vectors]
        requests = [
            qe.QueryRequest(
                limit=limit, query=qe.Query.Nearest(list(map(float, v))), with_payload=True
            )
            for v in vectors
        ]
        found = shard.query_batch(qe.QueryBatchRequest(requests))
        return [[Hit(_point_id(h.id), h.payload or {}, h.score) for h in r] for r in found]

    def scroll_all(self, batch: int = 1024) -> list[Hit]:
        import qdrant_edge as qe

        faults.check("qdrant")
        shard, points, offset = self._open(), [], None
        while shard is not None:
            page_of = qe.ScrollRequest(offset=offset, limit=batch, with_payload=True,
                                       with_vector=True)  # fmt: skip
            page, offset = shard.scroll(page_of)
            points += [Hit(_point_id(p.id), p.payload or {}, vector=list(p.vector)) for p in page]
            if offset is None:
                break
        return points

    def exists(self) -> bool:
        faults.check("qdrant")
        return self._open() is not None

    def count(self) -> int:
        import qdrant_edge as qe

        faults.check("qdrant")
        shard = self._open()
        return 0 if shard is None else shard.count(qe.CountRequest(exact=True))

    def close(self) -> None:
        if self._shard is not None:
            self._shard.close()
            self._shard = None
