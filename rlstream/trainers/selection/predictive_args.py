"""The predictive sampler's settings, each with what it does and what the selection bench
measured."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class PredictiveArgs:
    candidate_pool: int = 256
    """candidates scored per step (capped at the pool size; at least the batch size)"""
    shortlist_rounds: int = 0
    """a short list: a candidate not picked stays among the candidates this many rounds (the
    PPM's refresh_every: while its features are cached, only its posterior recomputed), and
    each round draws anew only the places that picks and expiries freed, so scoring costs
    those only. 0: every candidate is drawn and scored anew each round"""
    candidate_max: int = 0
    """score more candidates, candidate_pool at a time, up to this many, while fewer than the
    predicted picks reach ppm_threshold (informative prompts grew scarce); at most
    candidate_pool: never more"""
    ppm_threshold: float = 0.7
    """minimum P(group informative) to be preferred (0.7 with G = 8: p in [0.14, 0.86])"""
    diversity_weight: float = 0.3
    """weight of the distance-to-picked term in the greedy selection"""
    uniform_share: float = 0.1
    """expected share of each batch drawn uniformly from the whole pool"""
    explore_share: float = 0.0
    """expected share of each batch drawn uniformly from the scored candidates predicted below
    the informative band (posterior mean under 1/2, value under ppm_threshold): the PPM's
    claims of 'out of reach' are checked where selection alone never would, so it stays
    calibrated there (test-time allocation spends on what it predicts hopeless)"""
    prior_strength: float = 4.0
    """rollouts the PPM prediction is worth as a Beta prior for a prompt"""
    prior: str = "skill"
    """what a PPM prediction is worth as a prompt's Beta prior: 'skill' (prior_strength, scaled
    by the PPM's measured Brier skill when skill_gate) or 'fit' (per task family, the strength
    under which the outcomes of the prompts picked so far were likeliest given the
    predictions made before them: the beta-binomial's maximum-likelihood concentration, i.e.
    how far true pass rates scatter around a prediction of that family)"""
    fit_pooling: float = 32.0
    """with prior 'fit': groups' worth of the all-families likelihood a family's own starts
    from (a family with few outcomes takes the pooled strength)"""
    fit_decay: float = 0.9
    """with prior 'fit': decay of the likelihood per 32 groups observed (the policy and PPM
    move on; per group, so the streaming scheduler's updates of any size decay alike)"""
    skill_gate: bool = True
    """scale the prior by the PPM's measured skill: an unskilled PPM (early on, or after the
    policy moved) leaves a weak prior, so Thompson draws spread and selection is near uniform"""
    min_prior_strength: float = 1.0
    """prior strength when the PPM has no skill"""
    skill_decay: float = 0.8
    """per-step decay of the squared errors the skill is measured on"""
    acquisition: str = "thompson"
    """how a candidate's posterior becomes its value: 'thompson' (one draw theta from it,
    v = informativeness(theta)) or 'expected' (v = its expectation under the posterior, in
    closed form: the predictive probability that the group is informative)"""
    hard_tilt: float = 0.0
    """rank eligible candidates by v x (1 - theta)^hard_tilt: > 0 prefers the hard-but-solvable
    side of the informative band (a prompt the policy mostly fails but sometimes solves is
    where greedy accuracy and pass@k move; one it mostly solves is already right). Pays only
    with a PPM that separates hard-but-solvable from out of reach (see the bench report)"""
    fill: str = "rank"
    """how a shortfall of candidates at ppm_threshold is filled: 'rank' (the tilted rank, as
    the informative picks: the hard side first) or 'value' (the likeliest informative first;
    the tilt would fill with the near-hopeless, whose groups are mostly all wrong)"""
    stratify: str = "task"
    """split the predicted slots by 'task' family (in proportion to informative mass) or 'none'"""
    decay: float = 0.9
    """per-update decay of a prompt's own outcome counts (the policy moves on)"""
    fit_steps: int = 20
    """PPM gradient steps per fit"""
    fit_every: int = 1
    """fit the PPM after every fit_every-th update (the fit dominates this sampler's overhead)"""

    def __post_init__(self):
        if not 0 <= self.ppm_threshold <= 1:
            raise ValueError(
                f"ppm_threshold is a probability (informative group); got {self.ppm_threshold}"
            )
        if self.prior not in ("skill", "fit"):
            raise ValueError(f"prior is 'skill' or 'fit'; got {self.prior!r}")
        if self.fit_pooling < 0 or not 0 <= self.fit_decay <= 1:
            raise ValueError("fit_pooling must be >= 0 and fit_decay in [0, 1]")
        if self.acquisition not in ("thompson", "expected"):
            raise ValueError(f"acquisition is 'thompson' or 'expected'; got {self.acquisition!r}")
        if self.fill not in ("rank", "value"):
            raise ValueError(f"fill is 'rank' or 'value'; got {self.fill!r}")
        if self.stratify not in ("task", "none"):
            raise ValueError(f"stratify is 'task' or 'none'; got {self.stratify!r}")
        shares = (self.diversity_weight, self.uniform_share, self.explore_share)
        if not all(0 <= w <= 1 for w in shares) or self.uniform_share + self.explore_share > 1:
            raise ValueError(
                "diversity_weight, uniform_share and explore_share are weights in [0, 1], the "
                "two shares together at most 1"
            )
        if self.prior_strength <= 0:
            raise ValueError("prior_strength must be > 0 (a Beta prior needs positive mass)")
        if self.fit_every < 1:
            raise ValueError(f"fit_every counts updates and must be >= 1, got {self.fit_every}")
        if self.candidate_pool < 1 or not 0 <= self.decay <= 1:
            raise ValueError("candidate_pool must be >= 1 and decay in [0, 1]")
        if self.candidate_max < 0:
            raise ValueError(f"candidate_max must be >= 0, got {self.candidate_max}")
