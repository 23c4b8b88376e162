"""What a PPM prediction is worth, in rollouts: the strength of the Beta prior the predictive
sampler gives each prompt (`PredictiveArgs.prior`).

'skill': `prior_strength` scaled by the PPM's prequential Brier skill against the running mean
pass rate (`skill_gate`), at least `min_prior_strength`. 'fit': per task family, the strength
on `STRENGTH_GRID` under which the outcomes seen so far were likeliest given the predictions
made before them (a beta-binomial's maximum-likelihood concentration: how far true pass rates
scatter around a prediction of that family), the pooled fit counting as `fit_pooling` groups.
Both learn from each step's outcomes before the PPM does (`score`), so no prediction is judged
on what it was fitted to.
"""

from __future__ import annotations

import numpy as np

from rlstream.trainers.envs import Prompt
from rlstream.trainers.selection.acquisition import strength_loglik
from rlstream.trainers.selection.base import GroupOutcome
from rlstream.trainers.selection.predictive_args import PredictiveArgs

STRENGTH_GRID = np.geomspace(0.25, 256.0, 31)
"""prior strengths (rollouts) the 'fit' prior chooses among: 0.25 (a prediction says little
more than the family's spread) to 256 (an oracle), about 26% apart"""


class Trust:
    """How far the predictive sampler trusts its PPM, learnt from the outcomes."""

    def __init__(self, args: PredictiveArgs):
        self.args = args
        self.err_ppm = self.err_base = 0.0  # decayed squared errors: PPM, running mean
        self.seen_s = self.seen_n = 0.0  # successes and attempts so far (the running mean)
        # 'fit' prior: decayed beta-binomial log-likelihood over STRENGTH_GRID and decayed
        # group counts, per task family and pooled ("*")
        self.strength_ll: dict[str, np.ndarray] = {}
        self.strength_n: dict[str, float] = {}

    @property
    def skill(self) -> float:
        """The PPM's recent Brier skill against the running mean pass rate, in [0, 1].

        Prequential: each step's outcomes are scored against predictions made before the PPM
        saw them. 0 until the PPM beats always predicting the mean (e.g. before any fit)."""
        if self.err_base <= 1e-9:
            return 0.0
        return float(np.clip(1.0 - max(self.err_ppm, 0.0) / self.err_base, 0.0, 1.0))

    def strength(self, family: str = "*") -> float:
        """Rollouts a PPM prediction is worth in a prompt's prior (prior 'fit': in task
        `family`, default pooled over all)."""
        a = self.args
        if a.prior == "fit":
            return self.fitted_strength(family)
        if not a.skill_gate:
            return a.prior_strength
        return max(a.min_prior_strength, a.prior_strength * self.skill)

    def fitted_strength(self, family: str = "*") -> float:
        """The grid strength of highest likelihood: the family's own plus the pooled one
        weighted as fit_pooling groups; min_prior_strength before any outcome."""
        n_all = self.strength_n.get("*", 0.0)
        if n_all <= 0:
            return self.args.min_prior_strength
        ll = self.strength_ll["*"]
        if family != "*":
            ll = ll * (self.args.fit_pooling / n_all) + self.strength_ll.get(family, 0.0)
        return float(STRENGTH_GRID[int(np.argmax(ll))])

    def fold_strength(self, prompts: list[Prompt], pred: np.ndarray, successes, attempts):
        """Add one step's outcomes to the strength likelihoods (decayed, per family and
        pooled)."""
        ll = strength_loglik(pred, successes, attempts, STRENGTH_GRID)
        d = self.args.fit_decay ** (len(prompts) / 32)
        for key in self.strength_ll:
            self.strength_ll[key] *= d
            self.strength_n[key] *= d
        names = np.array([p.task for p in prompts] + ["*"] * len(prompts))
        rows = np.concatenate([ll, ll])
        for key in np.unique(names):
            here = names == key
            self.strength_ll[key] = self.strength_ll.get(key, 0.0) + rows[here].sum(0)
            self.strength_n[key] = self.strength_n.get(key, 0.0) + float(here.sum())

    def score(self, prompts: list[Prompt], pred: np.ndarray, outcomes: list[GroupOutcome]):
        """Fold one step's outcomes, and the PPM's predictions `pred` made before it saw them,
        into its skill and the strength fit."""
        n = np.array([o.attempts for o in outcomes], dtype=float)
        rate = np.array([o.successes for o in outcomes]) / n
        # unbiased binomial noise of each observed rate: both errors contain it; without it a
        # perfect PPM looks no better than the mean on the p ~ 0.5 prompts it picks
        noise = rate * (1 - rate) / np.maximum(n - 1, 1)
        base = self.seen_s / self.seen_n if self.seen_n else 0.5
        r = self.args.skill_decay
        if self.args.prior == "fit":
            self.fold_strength(prompts, pred, [o.successes for o in outcomes], n)
        self.err_ppm = r * self.err_ppm + float(((pred - rate) ** 2 - noise).sum())
        self.err_base = r * self.err_base + float(((base - rate) ** 2 - noise).sum())
        self.seen_s += sum(o.successes for o in outcomes)
        self.seen_n += sum(o.attempts for o in outcomes)

    def state_dict(self) -> dict:
        return {
            "skill": [self.err_ppm, self.err_base, self.seen_s, self.seen_n],
            "strength_fit": {
                k: [ll.tolist(), self.strength_n[k]] for k, ll in self.strength_ll.items()
            },
        }

    def load_state_dict(self, state: dict) -> None:
        # states saved before the skill gate existed restore with no skill measured yet
        self.err_ppm, self.err_base, self.seen_s, self.seen_n = state.get("skill", [0.0] * 4)
        fit = state.get("strength_fit", {})  # none in states saved before the 'fit' prior
        self.strength_ll = {k: np.array(ll) for k, (ll, _) in fit.items()}
        self.strength_n = {k: float(n) for k, (_, n) in fit.items()}
