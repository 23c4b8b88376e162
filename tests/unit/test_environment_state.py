"""The scheduler's environment state in Qdrant (local mode under a temporary path) while the
vector store is unavailable: statistics stay in memory, the flush is retried, nothing is lost.
The outage is the chaos suite's failpoint ($RLSTREAM_FAULTS_DIR/qdrant)."""

from __future__ import annotations

from rlstream.connectors.endpoints import Endpoints
from rlstream.connectors.faults import FAULTS_DIR
from rlstream.streams.scheduler import EnvironmentState
from rlstream.trainers.envs import Prompt


def _prompts(n: int) -> list[Prompt]:
    return [Prompt(f"{i:016x}", f"{i}+1=", "add", 1, str(i + 1)) for i in range(n)]


def test_an_unavailable_store_keeps_the_statistics_until_it_is_back(tmp_path, monkeypatch):
    monkeypatch.setenv(FAULTS_DIR, str(tmp_path / "faults"))
    (tmp_path / "faults").mkdir()
    flag = tmp_path / "faults" / "qdrant"
    flag.touch()  # down from the start: not even the collection exists yet
    state = EnvironmentState(Endpoints(qdrant_path=str(tmp_path / "qdrant")), "env-it", 4)
    state.RETRY_S = 0.0
    for p in _prompts(6):
        state.observe(p, [1.0, 0.0], policy_version=3)  # flushes are tried and fail
    assert len(state.dirty) == 6 and not state.ensured
    flag.unlink()
    state.observe(_prompts(7)[-1], [1.0, 1.0], policy_version=4)
    assert not state.dirty and state.store.count() == 7
    hit = state.store.search(state.featurize(_prompts(1)).tolist()[0], limit=1)[0]
    assert hit.payload["attempts"] == 2 and hit.payload["pass_rate"] == 0.5
    state.close()
