"""Scheduler decision records, shaped like the `prompt_scores` event payload.

Every `select_scored` returns the chosen prompts *and* one `ScoreRecord` per candidate it
considered (selected or not, with the reason), so the streaming loop can publish the decisions
and a replay can audit them.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field

import pyarrow as pa

from rlstream.schemas import get, rows_to_batch
from rlstream.trainers.envs import Prompt


@dataclass(frozen=True)
class ScoreRecord:
    """One candidate's score and the scheduler's decision (the `prompt_scores` v1 payload)."""

    prompt_id: str
    """content id of the prompt"""
    predicted_pass_rate: float
    """the sampler's estimate of the pass rate before any rollout (0.5 when it has none)"""
    uncertainty: float | None
    """standard deviation of that estimate, when the sampler has one"""
    ppm_version: int
    """fits of the prompt predictive model so far (0 for samplers without one)"""
    sampler: str
    """registered name of the sampler that decided"""
    selected: bool
    """whether the prompt goes to rollout"""
    reason: str | None = None
    """why: e.g. 'closest_to_target', 'greso_skip', 'uniform_share', 'diversity'"""
    text: str | None = None
    """prompt text (lets a consumer roll out without a lookup)"""
    task: str | None = None
    """task family"""
    answer: str | None = None
    """reference answer"""

    def to_row(self) -> dict:
        row = asdict(self)
        p = row["predicted_pass_rate"]
        row["predicted_pass_rate"] = 0.5 if p is None or math.isnan(p) else float(p)
        return row


def make_record(
    prompt: Prompt,
    predicted: float,
    uncertainty: float | None,
    sampler: str,
    selected: bool,
    reason: str,
    ppm_version: int = 0,
) -> ScoreRecord:
    """A record for one candidate, carrying the prompt's text, task and answer."""
    unc = None if uncertainty is None else float(uncertainty)
    return ScoreRecord(
        prompt.prompt_id,
        float(predicted),
        unc,
        int(ppm_version),
        sampler,
        bool(selected),
        reason,
        prompt.text,
        prompt.task,
        prompt.answer,
    )


@dataclass
class Selection:
    """What a sampler hands the loop: the prompts to roll out and the per-candidate records."""

    prompts: list[Prompt]
    records: list[ScoreRecord] = field(default_factory=list)


def records_to_batch(
    records: list[ScoreRecord], run_id: str = "default", policy_version: int = 0, **kw
) -> pa.RecordBatch:
    """The records as an Arrow batch of the latest registered `prompt_scores` event."""
    return rows_to_batch(
        get("prompt_scores"),
        [r.to_row() for r in records],
        run_id=run_id,
        policy_version=policy_version,
        **kw,
    )
