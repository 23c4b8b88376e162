"""Neighbourhood pass rates: how often prompts *similar* to this one were solved.

`neighbour_pass_rate` is the pure part (similarity-weighted, shrunk to a prior). Two indexes
answer the k-nearest-neighbour query with the same interface, registered in `NEIGHBOURHOODS`:
`knn` (`KnnNeighbourhood`, exact cosine in numpy, in memory) and `qdrant`
(`QdrantNeighbourhood`, over `connectors.vectors.VectorStore`, the one Qdrant wrapper:
":memory:", a local path or a server).
"""

from __future__ import annotations

import uuid

import numpy as np

from rlstream.registry import Registry

NEIGHBOURHOODS = Registry("neighbourhood index")  # name -> class with add() and query()


def neighbour_pass_rate(
    sim: np.ndarray,
    successes: np.ndarray,
    attempts: np.ndarray,
    prior_rate: float = 0.5,
    prior_strength: float = 2.0,
) -> tuple[np.ndarray, np.ndarray]:
    """Similarity-weighted pass rate of k neighbours, shrunk to a prior.

    sim, successes, attempts: (N, k). Negative similarities weigh 0.
    Returns rate (N,) = (sum w*s + prior_rate*prior_strength) / (sum w*n + prior_strength) and
    the evidence weight (N,) = sum w*n.

    >>> r, w = neighbour_pass_rate(np.array([[1.0, 0.5]]), np.array([[4, 0]]), np.array([[4, 4]]))
    >>> round(float(r[0]), 3), float(w[0])
    (0.625, 6.0)
    """
    w = np.clip(sim, 0, None)
    num = (w * successes).sum(axis=1) + prior_rate * prior_strength
    den = (w * attempts).sum(axis=1)
    return num / (den + prior_strength), den


def _unit(x: np.ndarray) -> np.ndarray:
    x = np.asarray(x, dtype=np.float32)
    return x / np.maximum(np.linalg.norm(x, axis=1, keepdims=True), 1e-8)


@NEIGHBOURHOODS.register("knn")
class KnnNeighbourhood:
    """Exact cosine k-NN over the prompts rolled out so far, with their success counters."""

    def __init__(self, k: int = 8, prior_rate: float = 0.5, prior_strength: float = 2.0):
        self.k, self.prior_rate, self.prior_strength = k, prior_rate, prior_strength
        self.row: dict[str, int] = {}
        self.vectors: list[np.ndarray] = []
        self.successes, self.attempts = np.zeros(0), np.zeros(0)
        self._matrix: np.ndarray | None = None

    def add(self, ids: list[str], vectors: np.ndarray, successes, attempts) -> None:
        """Accumulate outcomes of prompts (a new id is inserted with its vector)."""
        for pid, v, s, n in zip(ids, _unit(vectors), successes, attempts, strict=True):
            if pid not in self.row:
                self.row[pid] = len(self.vectors)
                self.vectors.append(v)
                self.successes = np.append(self.successes, 0.0)
                self.attempts = np.append(self.attempts, 0.0)
                self._matrix = None
            self.successes[self.row[pid]] += s
            self.attempts[self.row[pid]] += n

    def query(self, vectors: np.ndarray, exclude: list[str] | None = None):
        """(rate, weight) per query row; `exclude[i]` (the query's own id) is never a neighbour."""
        n = len(vectors)
        if not self.vectors:
            return np.full(n, self.prior_rate), np.zeros(n)
        if self._matrix is None:
            self._matrix = np.stack(self.vectors)
        sim = _unit(vectors) @ self._matrix.T  # (N, M)
        for i, pid in enumerate(exclude or []):
            if pid in self.row:
                sim[i, self.row[pid]] = -np.inf
        k = min(self.k, sim.shape[1])
        top = np.argpartition(-sim, k - 1, axis=1)[:, :k]
        s = np.take_along_axis(sim, top, axis=1)
        s = np.where(np.isfinite(s), s, 0.0)
        return neighbour_pass_rate(
            s,
            self.successes[top],
            self.attempts[top] * (s > 0),
            self.prior_rate,
            self.prior_strength,
        )

    def state_dict(self) -> dict:
        return {
            "row": dict(self.row),
            "vectors": list(self.vectors),
            "s": self.successes.copy(),
            "n": self.attempts.copy(),
        }

    def load_state_dict(self, st: dict) -> None:
        self.row, self.vectors = dict(st["row"]), list(st["vectors"])
        self.successes, self.attempts, self._matrix = st["s"].copy(), st["n"].copy(), None


@NEIGHBOURHOODS.register("qdrant")
class QdrantNeighbourhood:
    """The same k-NN through the project's Qdrant wrapper (`connectors.vectors.VectorStore`):
    points carry (successes, attempts) as payload."""

    def __init__(
        self,
        dim: int,
        k: int = 8,
        prior_rate: float = 0.5,
        prior_strength: float = 2.0,
        store=None,
        collection: str = "ppm_neighbours",
    ):
        from qdrant_client import QdrantClient

        from rlstream.connectors.vectors import VectorStore

        self.dim, self.k = dim, k
        self.prior_rate, self.prior_strength = prior_rate, prior_strength
        self.store = store or VectorStore(QdrantClient(":memory:"), collection, dim)
        self.store.ensure()
        self.counts: dict[str, tuple[float, float]] = {}

    @staticmethod
    def point_id(pid: str) -> str:
        return str(uuid.uuid5(uuid.NAMESPACE_OID, pid))

    def add(self, ids: list[str], vectors: np.ndarray, successes, attempts) -> None:
        points, payloads = [], []
        for pid, s, n in zip(ids, successes, attempts, strict=True):
            s0, n0 = self.counts.get(pid, (0.0, 0.0))
            self.counts[pid] = (s0 + float(s), n0 + float(n))
            points.append(self.point_id(pid))
            payloads.append({"prompt_id": pid, "s": s0 + float(s), "n": n0 + float(n)})
        self.store.upsert(points, _unit(vectors).tolist(), payloads)

    def query(self, vectors: np.ndarray, exclude: list[str] | None = None):
        n = len(vectors)
        sim, s, a = np.zeros((n, self.k)), np.zeros((n, self.k)), np.zeros((n, self.k))
        for i, v in enumerate(_unit(vectors)):
            hits = self.store.search(v.tolist(), limit=self.k + 1)
            hits = [h for h in hits if not exclude or h.payload["prompt_id"] != exclude[i]]
            for j, h in enumerate(hits[: self.k]):
                sim[i, j], s[i, j], a[i, j] = h.score, h.payload["s"], h.payload["n"]
        return neighbour_pass_rate(sim, s, a, self.prior_rate, self.prior_strength)
