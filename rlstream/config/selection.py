"""Which prompts are rolled out (`selection.*`), and the PPM featurizers' names and per-format
tuning the sampler reads. Sampler names are checked against the registry's declared names
(`rlstream.registry`): nothing here imports a sampler."""

from __future__ import annotations

import re
from dataclasses import dataclass

from rlstream.config.checks import ConfigError, at_least, choice
from rlstream.registry import SELECTION_SAMPLERS

PPM_FEATURES = ("minilm", "text", "hidden", "prefill", "confidence", "reference")
AUTO_FEATURES = {"cot": "confidence", "direct": "confidence"}
"""selection.ppm_features=auto by data.format: the best reference-free set the selection bench
measured for each (docs/selection-benchmark.md). The probability of the policy's own greedy
answer separates
prompts within a task family where a sentence embedding and one hidden state need far more
history (`benchmarks/ppm_features_probe.py`). Against minilm,hidden, 3 seeds each: mixed / late
CoT pools, Pearson r 0.91 / 0.92 (0.81 / 0.83), wasted share 0.69x / 0.74x of uniform's (0.76x
/ 0.86x), test-time compute saved 29% / 30% (0%); direct default / late pools, 5 seeds, r
0.70 / 0.91 (0.37 / 0.78), wasted 0.60x / 0.45x (0.82x / 0.61x), steps to the target 1.37x / -
(0.88x), test-time compute saved 16% / 32% (0% / 0%). Kept per format: a format where another
set wins can say so here."""
FORMAT_TUNING = {
    "cot": {"candidate_max": 0, "fill": "value", "explore_share": 0.05, "pseudo_count": 0.5,
            "confidence_tokens": 12, "shortlist": False, "refresh_every": 1},
    "direct": {"candidate_max": 0, "fill": "rank", "explore_share": 0.0, "pseudo_count": 0.0,
               "confidence_tokens": 2, "shortlist": True, "refresh_every": 4},
}  # fmt: skip
"""The PPM sampler's screening, fill, explore share, fit pseudo-counts, confidence decode and
short list by data.format (where selection.ppm_candidates_max=0, ppm_fill=auto,
ppm_explore_share, ppm_pseudo_count and ppm_shortlist none, ppm_confidence_tokens=0,
ppm_refresh_every=0).
With direct answers, counting scoring's compute (5 seeds, docs/selection-benchmark.md): the
greedy decode of every candidate's whole answer cost 54.9% of the rollouts' compute, and the
PPM got to uniform's final accuracy in 1.55x fewer steps but on 0.98x uniform's compute; the
answer's first 2 tokens cost 40.4% (1.59x, 1.12x less compute); with a short list besides
(candidates kept while their features are, 4 versions), 18.9% (1.34x, 1.10x; 1.11x to the
first target), the lightest that still beats uniform, DAPO and GRESO on compute; 1 token
selected no better than uniform (0.76x).
With a chain of thought, counting scoring's compute (issue 40, docs/selection-benchmark.md):
screening up to 512 candidates with a whole greedy solution each cost as much as the rollouts
(100.8%), so the PPM got to uniform's final accuracy on 1.11x less compute than uniform (2
seeds); the first 12 tokens of the greedy solution over 128 candidates cost 21.6% and got there
on 1.60x less (steps 1.87x, 3 seeds), at the price of test-time allocation (13.2% saved
against 25.7%) and waste (0.44 against 0.26 of rollouts): `--set
selection.ppm_candidates_max=512 --set selection.ppm_confidence_tokens=48` restores the
screen. Before that (rollouts alone counted): with a chain of thought the confidence PPM ranks
well (r 0.93) and
informative prompts grow scarce (uniform's zero-variance share 0.61-0.71), so it scores 128
more candidates at a time, up to 512, while fewer than a batch reach the informative
threshold, and fills a shortfall with the likeliest informative: wasted share 0.54x -> 0.37x
of uniform's (mixed pool) and 0.71x -> 0.37x (late pool), 5 seeds each. With direct answers
(r 0.69, zero-variance share 0.22) screening cost steps (1.42x -> 1.14x to the target) and
waste (0.52x -> 0.58x), and the value fill with it more (0.72x): off there
(docs/selection-benchmark.md).
Screened, the CoT PPM saw the prompts out of reach too seldom and its logits ran away there
(under 0.01 where 7% of samples were right), so with a chain of thought its fit also takes
Jeffreys pseudo-counts (0.5) and 5% of each batch checks candidates it predicts out of reach:
test-time allocation 19.8% -> 25.9% (mixed) and 10.4% -> 24.3% (late) saved, waste 0.42x /
0.41x (selection.ppm_pseudo_count, selection.ppm_explore_share; registry.format_tuning)."""


def check_features(spec: str) -> list[str]:
    """The featurizer names in a spec separated by ',' or '+' (an arm in a comma-separated
    sampler list: `ppm:minilm+hidden`); an unknown one is a ValueError."""
    names = [f.strip() for f in re.split(r"[,+]", spec) if f.strip()]
    if not names or not set(names) <= set(PPM_FEATURES):
        raise ValueError(
            f"ppm_features: separated by ',' or '+', from {', '.join(PPM_FEATURES)}; got {spec!r}"
        )
    return names


def loop_samplers() -> list[str]:
    """Samplers a loop draws its batches from. DAPO's dynamic sampling is not one of them: it
    is a filter over any sampler (`rl.filter_zero_variance`); `dapo` is a benchmark arm."""
    return [n for n in SELECTION_SAMPLERS.names() if n != "dapo"]


@dataclass
class SelectionConfig:
    sampler: str = "ppm"
    """prompt sampler: ppm (predictive, reads the policy), uniform, greso, mopps (for DAPO's
    dynamic sampling set rl.filter_zero_variance=true with any of them)"""
    ppm_features: str = "auto"
    """what the ppm sampler's predictive model reads besides the shared history (attempts,
    successes, version gap, neighbourhood pass rates), comma-separated: minilm (a sentence
    embedding of the prompt), text (char n-grams), hidden (the policy's last hidden state at
    the prompt), prefill (that pass's first-answer-token distribution too; no decoding),
    confidence (its probability of its own greedy answer, one greedy decode) —
    none reads an answer — or reference (its probability of the reference answer: a labelled
    variant). auto: the best reference-free set the selection bench measured for the data's
    answer format (AUTO_FEATURES): confidence, with or without a chain of
    thought (docs/selection-benchmark.md)"""
    ppm_from: str = ""
    """a run id of this stack whose PPM (scheduler snapshot) and prompt collection (Qdrant)
    warm-start this run's predictor (`rlstream run --ppm-from RUN_ID`)"""
    ppm_candidates: int = 128
    """prompts the ppm sampler scores for each batch it picks (at least the batch): more
    find more informative prompts when few are left, at the cost of scoring them (policy
    features read the policy once per candidate)"""
    ppm_shortlist: bool | None = None
    """the ppm sampler keeps its candidates not picked for the next rounds while their policy
    features are cached (`ppm_refresh_every` versions) and draws anew only the places picks
    and expiries freed: scoring costs the new candidates only. false: all ppm_candidates
    drawn and scored anew each round. None: by the answer format (FORMAT_TUNING: on with
    direct answers, off with a chain of thought)"""
    ppm_candidates_max: int = 0
    """while fewer than a batch's predicted picks reach the informative threshold, the ppm
    sampler scores ppm_candidates more, up to this many (at most ppm_candidates: never more),
    so the scoring cost follows how scarce informative prompts are. 0: by the answer format
    (FORMAT_TUNING: none beyond ppm_candidates; up to 512 with a chain of thought took the
    wasted share to 0.37x of uniform's at a scoring cost equal to the rollouts')"""
    ppm_fill: str = "auto"
    """how the ppm sampler fills a batch when too few candidates reach the informative
    threshold: rank (as it ranks the informative ones, the hard side first), value (the
    likeliest informative first) or auto (by the answer format: value with a chain of
    thought, rank with direct answers; FORMAT_TUNING)"""
    ppm_explore_share: float | None = None
    """share of each batch the ppm sampler spends checking candidates it predicts out of reach
    (drawn uniformly among them), so its predictions stay calibrated where selection alone
    never looks (test-time allocation relies on them). None: by the answer format
    (FORMAT_TUNING: 0.05 with a chain of thought, 0 with direct answers)"""
    ppm_pseudo_count: float | None = None
    """successes and as many failures the PPM's fit adds to every group (0.5: Jeffreys'
    prior), so a prompt it has seen fail is predicted unlikely, not impossible. None: by the
    answer format (FORMAT_TUNING: 0.5 with a chain of thought, 0 with direct
    answers)"""
    ppm_zero_shot: bool = True
    """the PPM starts from its featurizer's own estimate of the pass rate (confidence: the
    policy's probability of its greedy answer; reference: of the reference answer) and learns
    the correction to it, so its first picks are informed before any outcome; false: it
    starts from a random network (features without such an estimate, minilm, text, hidden,
    always do)"""

    ppm_refresh_every: int = 0
    """policy versions the ppm sampler keeps a prompt's policy features (hidden state,
    confidence) for before reading the policy again: 1 recomputes them after every update;
    more spends less of the policy's compute on scoring (`selection_compute_share` in the
    run's summary) on staler features. 0: by the answer format (FORMAT_TUNING: 4 with direct
    answers, 1 with a chain of thought)"""

    ppm_confidence_tokens: int = 0
    """how many tokens the confidence featurizer's greedy decode runs to (its feature: the
    probability of that prefix of the policy's greedy answer): fewer cost less scoring, a
    chain of thought's first steps standing for the whole; 0: by the answer format
    (FORMAT_TUNING: 12 with a chain of thought, 2 with direct answers)"""

    ppm_acquisition: str = "expected"
    """how the ppm sampler values a candidate from its Beta posterior: expected (the
    posterior predictive probability that its group of G is informative, in closed form: a
    prompt the PPM is unsure of scores lower) or thompson (one draw from the posterior)"""
    ppm_prior: str = "fit"
    """what a PPM prediction is worth in each prompt's Beta posterior: fit (per task family,
    the beta-binomial strength that makes the outcomes seen so far likeliest given the
    predictions made before them: how far true pass rates scatter around a prediction) or
    skill (ppm_prior_strength, scaled down by the PPM's measured Brier skill)"""
    ppm_hard_tilt: float = 2.0
    """the ppm sampler ranks candidates by E[P(group informative) x (1 - theta)^hard_tilt]:
    > 0 leans to the hard-but-solvable side of the informative band: with the expected
    acquisition it costs little waste (mixed CoT pool 0.54x of uniform's against 0.52x at 0)
    and the PPM, trained on those outcomes, guides test-time allocation (26.9% saved against
    15.3% at 0); 0 ranks by P(group informative) alone"""

    ppm_prior_strength: float = 16.0
    """with ppm_prior=skill: rollouts a PPM prediction is worth in each prompt's Beta
    posterior at full measured skill (the skill gate scales it down)"""

    curriculum: float = 0.0
    """a curriculum over the prompts' difficulty (any sampler): the easiest level first, the
    next once the success rate over the last curriculum_window groups of the hardest open
    level reaches this (e.g. 0.7; for the world environment its dynamics harden with it);
    0: every level from the start"""
    curriculum_window: int = 16
    """groups of the hardest open level the curriculum judges its success rate on"""

    def __post_init__(self):
        at_least("selection", "ppm_candidates", self.ppm_candidates, 1)
        at_least("selection", "curriculum_window", self.curriculum_window, 1)
        at_least("selection", "ppm_refresh_every", self.ppm_refresh_every, 0)
        at_least("selection", "ppm_confidence_tokens", self.ppm_confidence_tokens, 0)
        if not 0 <= self.curriculum <= 1:
            raise ConfigError(f"selection.curriculum: {self.curriculum}; a success rate in "
                              "[0, 1] (0: off)")  # fmt: skip
        at_least("selection", "ppm_candidates_max", self.ppm_candidates_max, 0)
        if self.ppm_hard_tilt < 0:
            raise ConfigError(
                f"selection.ppm_hard_tilt: {self.ppm_hard_tilt}; a power, 0 or more (0: no tilt)"
            )
        choice("selection", "ppm_acquisition", self.ppm_acquisition, ("expected", "thompson"))
        choice("selection", "ppm_prior", self.ppm_prior, ("fit", "skill"))
        choice("selection", "ppm_fill", self.ppm_fill, ("auto", "rank", "value"))
        if self.ppm_pseudo_count is not None and self.ppm_pseudo_count < 0:
            raise ConfigError(
                f"selection.ppm_pseudo_count: {self.ppm_pseudo_count}; observations, 0 or more "
                "(0.5: Jeffreys' prior), or none (by the answer format)"
            )
        if self.ppm_explore_share is not None and not 0 <= self.ppm_explore_share <= 0.5:
            raise ConfigError(
                f"selection.ppm_explore_share: {self.ppm_explore_share}; a share of the batch in "
                "[0, 0.5], or none (by the answer format)"
            )
        if not self.ppm_prior_strength > 0:
            raise ConfigError(
                f"selection.ppm_prior_strength: {self.ppm_prior_strength}; rollouts a prediction "
                "is worth, more than 0 (16: the tuned default)"
            )

        if self.sampler == "dapo":
            raise ConfigError(
                "selection.sampler: for DAPO's dynamic sampling set rl.filter_zero_variance=true "
                f"with any of {', '.join(loop_samplers())}"
            )
        choice("selection", "sampler", self.sampler, loop_samplers())
        try:
            if self.ppm_features != "auto":
                check_features(self.ppm_features)
        except ValueError:
            raise ConfigError(
                f"selection.ppm_features: {self.ppm_features!r}; auto, or comma-separated "
                f"from {', '.join(PPM_FEATURES)}"
            ) from None
        if self.ppm_from and self.sampler != "ppm":
            raise ConfigError(
                f"selection.ppm_from warm-starts the ppm sampler's predictor; this run's "
                f"sampler is {self.sampler}: drop --ppm-from or use --sampler ppm"
            )
