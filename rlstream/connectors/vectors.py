"""The vector store (Qdrant) for environment and prompt state, over qdrant-client.

A server URL when one is configured (the compose stack), otherwise local mode under a path
(the embedded stack). Local mode allows one process per path: open it from the process that
owns the collection (the scheduler), not from every worker.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from qdrant_client import QdrantClient, models

from rlstream.connectors import faults
from rlstream.connectors.endpoints import Endpoints, state_dir


def vector_client(endpoints: Endpoints) -> QdrantClient:
    if endpoints.qdrant_url:
        return QdrantClient(url=endpoints.qdrant_url)
    path = Path(endpoints.qdrant_path or state_dir() / "qdrant")
    path.mkdir(parents=True, exist_ok=True)
    return QdrantClient(path=str(path))


class VectorStore:
    """One collection of prompt vectors with payload (task, successes, attempts, ...)."""

    def __init__(self, client: QdrantClient, collection: str, dim: int):
        self.client = client
        self.collection = collection
        self.dim = dim

    @classmethod
    def open(cls, endpoints: Endpoints, collection: str, dim: int) -> VectorStore:
        store = cls(vector_client(endpoints), collection, dim)
        store.ensure()
        return store

    def ensure(self) -> None:
        faults.check("qdrant")
        if not self.client.collection_exists(self.collection):
            self.client.create_collection(
                self.collection,
                vectors_config=models.VectorParams(size=self.dim, distance=models.Distance.COSINE),
            )

    def upsert(self, ids: Sequence[int | str], vectors: Sequence[Sequence[float]], payloads):
        faults.check("qdrant")
        points = [
            models.PointStruct(id=i, vector=list(map(float, v)), payload=p)
            for i, v, p in zip(ids, vectors, payloads, strict=True)
        ]
        self.client.upsert(self.collection, points=points)

    def search(self, vector: Sequence[float], limit: int = 10) -> list[models.ScoredPoint]:
        faults.check("qdrant")
        return self.client.query_points(
            self.collection, query=list(map(float, vector)), limit=limit, with_payload=True
        ).points

    def search_batch(
        self, vectors: Sequence[Sequence[float]], limit: int = 10
    ) -> list[list[models.ScoredPoint]]:
        """The `limit` nearest points (with payload) of each vector, in one request."""
        faults.check("qdrant")
        if not len(vectors):
            return []
        requests = [
            models.QueryRequest(query=list(map(float, v)), limit=limit, with_payload=True)
            for v in vectors
        ]
        return [r.points for r in self.client.query_batch_points(self.collection, requests)]

    def scroll_all(self, batch: int = 1024) -> list[models.Record]:
        """Every point with its payload and vector (a run's collection: thousands of points)."""
        faults.check("qdrant")
        points, offset = [], None
        while True:
            page, offset = self.client.scroll(self.collection, limit=batch, offset=offset,
                                              with_payload=True, with_vectors=True)  # fmt: skip
            points += page
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
