"""The run's data onto its topics, published like a user's: the dataset's name, the generated
pool and corpus written to files first, and the admission check that refuses what the run's
model cannot take."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

from rlstream.config import Config
from rlstream.connectors.endpoints import Endpoints
from rlstream.ops.commands.publish import publish_file
from rlstream.schemas import get

PROMPTS, CORPUS = get("prompts"), get("corpus")


BAD_ROWS_SHOWN = 20  # refused rows listed in the summary and report (all are counted)


def with_dataset(cfg: Config) -> Config:
    """The config with data.dataset named (`datasets.dataset_name`), as every process reads it."""
    from rlstream.trainers.datasets import dataset_name

    return replace(cfg, data=replace(cfg.data, dataset=dataset_name(cfg)))


async def seed_topics(endpoints: Endpoints, cfg: Config, out: Path) -> dict:
    """Publish the run's data like any user: generated prompts and corpus are written to
    `<run>/data/*.jsonl` first; files named by data.prompts / data.corpus go as they are;
    topic:DATASET sources are already on the topics. Bad rows are reported, not fatal."""
    from rlstream.trainers.datasets import generated_corpus_rows, generated_prompt_rows

    dataset, data_dir = cfg.data.dataset, out / "data"
    prompts, corpus = cfg.data.prompts, cfg.data.corpus
    if prompts is None:
        data_dir.mkdir(parents=True, exist_ok=True)
        prompts = str(write_jsonl(data_dir / "prompts.jsonl", generated_prompt_rows(cfg, dataset)))
        if corpus is None:
            rows = generated_corpus_rows(cfg, dataset)
            corpus = str(write_jsonl(data_dir / "corpus.jsonl", rows))
    figures: dict = {"dataset": dataset, "bad_rows": {}}
    for event, source in ((PROMPTS, prompts), (CORPUS, corpus)):
        if source is None or source.startswith("topic:"):
            continue
        report = await publish_file(
            endpoints, Path(source), event, batch_rows=2000, run_id=cfg.run_id, dataset=dataset,
            check=run_admission(cfg) if event is PROMPTS else None,
        )  # fmt: skip
        figures[f"{event.name}_published"] = report.rows_published
        if report.bad_rows:
            figures["bad_rows"][str(source)] = report.bad_rows[:BAD_ROWS_SHOWN]
            figures[f"{event.name}_refused"] = len(report.bad_rows)
    return figures


def run_admission(cfg: Config):
    """A row check for `publish_file`: the prompts this run cannot train on are refused."""
    from rlstream.schemas import RowError
    from rlstream.trainers.datasets import prompt_problem
    from rlstream.trainers.lm import load_tokenizer

    tok, room = load_tokenizer(cfg.model), cfg.model.block_size - cfg.rl.max_new_tokens

    def check(row: dict) -> None:
        problem = prompt_problem(row, tok, room)
        if problem:
            raise RowError(problem)

    return check


def write_jsonl(path: Path, rows: list[dict]) -> Path:
    with open(path, "w") as f:
        for row in rows:
            f.write(json.dumps(row) + "\n")
    return path
