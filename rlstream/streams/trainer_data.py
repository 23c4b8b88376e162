"""The stream trainer's data: the run's dataset as its topics hold it, and the rows of an
evaluation."""

from __future__ import annotations

from rlstream.config import Config
from rlstream.connectors.endpoints import Endpoints
from rlstream.connectors.reading import read_rows_where
from rlstream.schemas import get, make_event_id
from rlstream.trainers.datasets import DatasetView

PROMPTS, CORPUS = get("prompts"), get("corpus")


async def load_dataset(endpoints: Endpoints, cfg: Config) -> DatasetView:
    """The run's dataset as the topics hold it: held-out prompts (evaluation) and documents
    (pre-training), whoever published them. Generated documents sort first, by doc_id (ids
    sort by index; partitions interleave on the wire), so the streamed pre-training sees the
    corpus the in-process loop would."""
    view = DatasetView(cfg.data.dataset, cfg.data.heldout_frac)
    for row in await read_rows_where(endpoints, PROMPTS.topic, view.ours):
        view.add_prompt(row)
    for row in await read_rows_where(endpoints, CORPUS.topic, view.ours):
        view.add_doc(row)
    return view


def eval_rows(step: int, phase: str, result: dict, n: int) -> list[dict]:
    rows = []
    for metric in ("greedy", "pass1"):
        if metric in result:
            rows.append(
                {"step": step, "task": "all", "metric": metric, "value": result[metric], "n": n}
            )
            for task, value in result.get(f"{metric}_by_task", {}).items():
                rows.append({"step": step, "task": task, "metric": metric, "value": value, "n": n})
    for row in rows:
        row["event_id"] = make_event_id("eval", phase, step, row["task"], row["metric"])
    return rows
