"""The PPM a run ends with, exported for a later run's --ppm-from (its state and the prompts it
saw), and the warm start read back from such an export."""

from __future__ import annotations

import json
from pathlib import Path

from rlstream.connectors.endpoints import Endpoints
from rlstream.connectors.objectstore import ObjectStore
from rlstream.streams.environment_state import collection_name, state_object
from rlstream.trainers.checkpoint import from_bytes, to_bytes

PPM_EXPORT = ("state.pt", "prompts.parquet")
"""What a finished PPM run leaves in <run dir>/ppm for `--ppm-from`: the PPM sampler's warm
state in its last scheduler snapshot (the PPM, its skill and strength fit) and its Qdrant
collection (id, vector, payload as JSON)."""


def export_ppm(endpoints: Endpoints, run_id: str, directory: Path) -> bool:
    """Save run `run_id`'s PPM and prompt collection under `directory` (its scheduler has
    stopped: an embedded shard takes one process); False when it left no PPM snapshot."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from rlstream.connectors.vectors import VectorStore

    store, name = ObjectStore(endpoints), state_object(run_id)
    if not store.exists(name):
        return False
    sampler = from_bytes(store.get_bytes(name))["sampler"]
    if "ppm" not in sampler:
        return False
    # PredictiveSampler.warm_state: the PPM and what its predictions were worth
    warm = {k: sampler[k] for k in ("ppm", "skill", "strength_fit", "group_size") if k in sampler}
    directory.mkdir(parents=True, exist_ok=True)
    (directory / PPM_EXPORT[0]).write_bytes(to_bytes(warm))
    vectors = VectorStore.open(endpoints, collection_name(run_id), 0, create=False)
    try:
        points = vectors.scroll_all() if vectors.exists() else []
    finally:
        vectors.close()
    table = pa.table({
        "id": pa.array([p.id for p in points], pa.uint64()),
        "vector": pa.array([list(p.vector) for p in points], pa.list_(pa.float32())),
        "payload": pa.array([json.dumps(p.payload) for p in points], pa.string()),
    })  # fmt: skip
    pq.write_table(table, directory / PPM_EXPORT[1])
    return True


def load_warm_start(directory: Path) -> tuple[dict, list[dict]]:
    """The PPM state and the collection rows `export_ppm` wrote under `directory`."""
    import pyarrow.parquet as pq

    state = from_bytes((directory / PPM_EXPORT[0]).read_bytes())
    return state, pq.read_table(directory / PPM_EXPORT[1]).to_pylist()
