"""Neighbourhood pass rates: how often prompts *similar* to this one were solved.

`neighbour_pass_rate` is the pure part (similarity-weighted, shrunk to a prior). Two indexes
answer the k-nearest-neighbour query with the same interface, registered in `NEIGHBOURHOODS`:
`knn` (`KnnNeighbourhood`, exact cosine in numpy, in memory) and `qdrant`
(`QdrantNeighbourhood`, over `connectors.vectors.VectorStore`, the one Qdrant wrapper:
":memory:", a local path or a server).
"""

from __future__ import annotations

import logging
import uuid

import numpy as np

from rlstream.registry import Registry

log = logging.getLogger(__name__)

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
        self.carried: set[str] = set()  # rows another run's outcomes fill until this one's come

    def add(self, ids: list[str], vectors: np.ndarray, successes, attempts) -> None:
        """Accumulate outcomes of prompts (a new id is inserted with its vector)."""
        for pid, v, s, n in zip(ids, _unit(vectors), successes, attempts, strict=True):
            if pid not in self.row:
                self.row[pid] = len(self.vectors)
                self.vectors.append(v)
                self.successes = np.append(self.successes, 0.0)
                self.attempts = np.append(self.attempts, 0.0)
                self._matrix = None
            if pid in self.carried:  # this run's own outcomes replace another run's
                self.carried.discard(pid)
                self.successes[self.row[pid]] = self.attempts[self.row[pid]] = 0.0
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
            "carried": sorted(self.carried),
        }

    def load_state_dict(self, st: dict) -> None:
        self.row, self.vectors = dict(st["row"]), list(st["vectors"])
        self.successes, self.attempts, self._matrix = st["s"].copy(), st["n"].copy(), None
        self.carried = set(st.get("carried", ()))

    def carry(self, st: dict) -> None:
        """Start from another run's outcomes (`state_dict`): neighbours read them until this
        run rolls a prompt out, whose own outcomes then replace them."""
        self.load_state_dict(st)
        self.carried = set(self.row)


@NEIGHBOURHOODS.register("qdrant")
class QdrantNeighbourhood:
    """The same k-NN through the project's Qdrant wrapper (`connectors.vectors.VectorStore`):
    points carry `successes` and `attempts` as payload.

    With `writes` (the default) `add` upserts the running counts; without, the collection is
    written by someone else and only read here: the streaming scheduler's environment state
    (`streams.environment_state.EnvironmentState`) writes its run's collection and the PPM's
    neighbourhood features are read back from it. An in-memory mirror of what `add` saw
    answers while Qdrant is unavailable (`fallbacks` counts those queries)."""

    def __init__(
        self,
        dim: int,
        k: int = 8,
        prior_rate: float = 0.5,
        prior_strength: float = 2.0,
        store=None,
        collection: str = "ppm_neighbours",
        writes: bool = True,
    ):
        self.dim, self.k, self.writes = dim, k, writes
        self.prior_rate, self.prior_strength = prior_rate, prior_strength
        if store is None:
            from qdrant_client import QdrantClient

            from rlstream.connectors.vectors import ClientVectorStore

            store = ClientVectorStore(QdrantClient(":memory:"), collection, dim)
            store.ensure()
        self.store = store
        self.mirror = KnnNeighbourhood(k, prior_rate, prior_strength)
        self.queries = self.fallbacks = 0
        self.down = False  # the last query fell back to the mirror

    @staticmethod
    def point_id(pid: str) -> str:
        return str(uuid.uuid5(uuid.NAMESPACE_OID, pid))

    def add(self, ids: list[str], vectors: np.ndarray, successes, attempts) -> None:
        self.mirror.add(ids, vectors, successes, attempts)
        if not self.writes:
            return
        rows = [self.mirror.row[pid] for pid in ids]
        payloads = [
            {"prompt_id": pid, "successes": float(self.mirror.successes[r]),
             "attempts": float(self.mirror.attempts[r])}
            for pid, r in zip(ids, rows, strict=True)
        ]  # fmt: skip
        self.store.upsert([self.point_id(p) for p in ids], _unit(vectors).tolist(), payloads)

    def query(self, vectors: np.ndarray, exclude: list[str] | None = None):
        n = len(vectors)
        sim, s, a = np.zeros((n, self.k)), np.zeros((n, self.k)), np.zeros((n, self.k))
        self.queries += 1
        try:
            found = self.store.search_batch(_unit(vectors).tolist(), limit=self.k + 1)
        except Exception as exc:  # noqa: BLE001  (a server's client raises several kinds)
            self.fallbacks += 1
            if not self.down:
                log.warning("vector store unavailable for the PPM's neighbourhood (%s); "
                            "reading its in-memory mirror", exc)  # fmt: skip
            self.down = True
            return self.mirror.query(vectors, exclude)
        if self.down:
            log.info("vector store available again for the PPM's neighbourhood")
            self.down = False
        for i, hits in enumerate(found):
            own = exclude[i] if exclude else None
            hits = [h for h in hits if h.payload.get("prompt_id") != own]
            for j, h in enumerate(hits[: self.k]):
                sim[i, j] = h.score
                s[i, j], a[i, j] = h.payload["successes"], h.payload["attempts"]
        return neighbour_pass_rate(sim, s, a, self.prior_rate, self.prior_strength)

    def state_dict(self) -> dict:
        return self.mirror.state_dict()

    def load_state_dict(self, st: dict) -> None:
        self.mirror.load_state_dict(st)
