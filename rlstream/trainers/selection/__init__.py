"""Predictive prompt selection: samplers, the prompt predictive model, decision records,
test-time allocation.

Samplers (registry `SELECTION_SAMPLERS`, all `cls(pool, seed, args=None)` with `select`,
`update`, `state_dict`, `load_state_dict`, plus `select_scored` -> prompts and decision
records): uniform, dapo (DAPO dynamic sampling; drive it with `fill_batch`), greso, mopps, ppm.

The benchmark (`rlstream bench selection`): loop.py runs one arm (sampler x seed) of GRPO from
a shared checkpoint (policies.py builds and caches it), metrics.py turns the per-step records
into RESEARCH.md's figures, bench.py orchestrates pools/arms/seeds, report.py prints and writes.
"""

from rlstream.registry import SELECTION_SAMPLERS, register_sampler
from rlstream.trainers.selection.allocation import (
    allocate_samples,
    compare_allocations,
    expected_pass_at_n,
    uniform_allocation,
)
from rlstream.trainers.selection.base import (
    GroupOutcome,
    PoolSampler,
    UniformSelection,
    group_outcome,
)
from rlstream.trainers.selection.dapo import (
    DapoArgs,
    DapoBatch,
    DynamicSamplingSampler,
    dapo_filter,
    fill_batch,
)
from rlstream.trainers.selection.features import FEATURIZERS, make_featurizer, register_featurizer
from rlstream.trainers.selection.greso import (
    GresoArgs,
    GresoSampler,
    greso_adapt,
    greso_skip_probability,
)
from rlstream.trainers.selection.mopps import MoppsArgs, MoppsSampler, beta_decay_update
from rlstream.trainers.selection.neighbours import KnnNeighbourhood, QdrantNeighbourhood
from rlstream.trainers.selection.ppm import (
    PPMArgs,
    PromptPredictiveModel,
    binomial_nll,
    brier_score,
    calibration,
    pearson_r,
    quantization_error,
    quantize_int8,
)
from rlstream.trainers.selection.predictive import PredictiveArgs, PredictiveSampler, mmr_select
from rlstream.trainers.selection.records import ScoreRecord, Selection, records_to_batch
from rlstream.trainers.selection.registry import make_selection_sampler

__all__ = [
    "FEATURIZERS",
    "SELECTION_SAMPLERS",
    "DapoArgs",
    "DapoBatch",
    "DynamicSamplingSampler",
    "GresoArgs",
    "GresoSampler",
    "GroupOutcome",
    "KnnNeighbourhood",
    "MoppsArgs",
    "MoppsSampler",
    "PPMArgs",
    "PoolSampler",
    "PredictiveArgs",
    "PredictiveSampler",
    "PromptPredictiveModel",
    "QdrantNeighbourhood",
    "ScoreRecord",
    "Selection",
    "UniformSelection",
    "allocate_samples",
    "beta_decay_update",
    "binomial_nll",
    "brier_score",
    "calibration",
    "compare_allocations",
    "dapo_filter",
    "expected_pass_at_n",
    "fill_batch",
    "greso_adapt",
    "greso_skip_probability",
    "group_outcome",
    "make_featurizer",
    "make_selection_sampler",
    "mmr_select",
    "pearson_r",
    "quantization_error",
    "quantize_int8",
    "records_to_batch",
    "register_featurizer",
    "register_sampler",
    "uniform_allocation",
]
