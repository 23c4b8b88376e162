"""The PPM-predictive sampler (GPS-style): predicted intermediate difficulty + diversity + a floor.

Per step:
1. a minimum uniform share of the batch is drawn uniformly from the whole pool (expected share
   exactly `uniform_share`), so no region starves even when its estimate collapsed;
2. a candidate pool is drawn; the PPM predicts each candidate's pass rate mu; a Beta posterior
   per candidate combines that prediction as a prior worth `prior_strength` rollouts with the
   prompt's own decayed outcomes, and one Thompson sample theta is drawn from it (uncertain
   prompts get explored, confident ones exploited); with `skill_gate` the prior's weight scales
   with the PPM's prequential Brier skill, so a PPM that predicts no better than the mean pass
   rate (before its first fits, or after the policy moved) leaves selection near uniform;
3. value v = the probability that a group of G is informative, 1 - theta^G - (1 - theta)^G
   (a zero-variance group has all-zero advantages and teaches nothing); candidates with
   v >= ppm_threshold are preferred, the rest only fill a shortfall;
4. strata (by default the task family) get the predicted slots in proportion to their summed
   v over the candidates, i.e. to the informative groups uniform sampling would draw from them:
   the batch's family mix follows uniform's *useful* mix, so no family that still has something
   to teach starves, and one that has nothing left (all solved, or out of reach) is not paid for;
5. within each stratum, greedy max-marginal-relevance picks: score = (1 - w) r + w d, with
   r = v (1 - theta)^hard_tilt (0 by default: r = v; > 0 leans to the hard-but-solvable side),
   d the cosine distance (halved, in [0, 1]) to the nearest prompt already picked this step,
   w = diversity_weight.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

import numpy as np

from rlstream.trainers.envs import Prompt
from rlstream.trainers.selection.base import GroupOutcome, PoolSampler
from rlstream.trainers.selection.mopps import beta_mean_std
from rlstream.trainers.selection.ppm import PPMArgs, PromptPredictiveModel
from rlstream.trainers.selection.records import Selection, make_record
from rlstream.trainers.selection.registry import register_sampler


class Predictor(Protocol):
    """What the sampler needs from a PPM (PromptPredictiveModel satisfies it)."""

    version: int

    def predict(self, prompts: list[Prompt]) -> np.ndarray: ...
    def embed(self, prompts: list[Prompt]) -> np.ndarray: ...
    def observe(self, prompts: list[Prompt], successes, attempts) -> None: ...
    def fit(self, steps: int | None = None) -> float: ...
    def state_dict(self) -> dict: ...
    def load_state_dict(self, state: dict) -> None: ...


def informativeness(theta: np.ndarray, group_size: int) -> np.ndarray:
    """P(a group of `group_size` Bernoulli(theta) rewards is not all equal).

    >>> informativeness(np.array([0.5, 0.0, 1.0]), 2).tolist()
    [0.5, 0.0, 0.0]
    """
    return 1.0 - theta**group_size - (1.0 - theta) ** group_size


def stratum_quotas(mass: np.ndarray, available: np.ndarray, n: int, rng) -> np.ndarray:
    """Integer slots per stratum summing to min(n, available.sum()), proportional to `mass`
    (equal shares where every mass is 0), never above a stratum's `available` candidates.

    Randomised rounding: the fractional parts are drawn in proportion to their size.
    >>> stratum_quotas(np.array([3.0, 1.0]), np.array([10, 10]), 4, None).tolist()
    [3, 1]
    """
    quota = np.zeros(len(mass), dtype=np.int64)
    want = min(n, int(available.sum()))
    while quota.sum() < want:
        open_ = quota < available
        m = np.where(open_, np.maximum(mass, 0.0), 0.0)
        m = m if m.sum() > 0 else open_.astype(float)
        raw = (want - quota.sum()) * m / m.sum()
        add = np.minimum(np.floor(raw).astype(np.int64), available - quota)
        if add.sum() == 0:  # only fractions left: one slot, drawn in proportion to them
            frac = raw - np.floor(raw)
            p = frac if frac.sum() > 0 else m
            add[rng.choice(len(m), p=p / p.sum())] = 1
        quota += add
    return quota


def mmr_select(
    value: np.ndarray,
    emb: np.ndarray,
    k: int,
    diversity_weight: float,
    eligible: np.ndarray | None = None,
) -> tuple[list[int], list[bool]]:
    """Greedy max-marginal-relevance: k picks maximising (1-w) value + w distance-to-picked.

    value: (C,) in [0, 1]; emb: (C, D) (normalised inside); eligible: (C,) bool, picked first.
    Returns the picked indices in order and, per pick, whether it came from the eligible set.
    """
    c = len(value)
    e = emb / np.maximum(np.linalg.norm(emb, axis=1, keepdims=True), 1e-8)
    dist = np.ones(c)  # distance to the nearest pick so far, (1 - cos) / 2 in [0, 1]
    free = np.ones(c, dtype=bool)
    elig = np.ones(c, dtype=bool) if eligible is None else eligible.astype(bool)
    picks, from_elig = [], []
    for _ in range(min(k, c)):
        pool = free & elig if (free & elig).any() else free
        score = np.where(pool, (1 - diversity_weight) * value + diversity_weight * dist, -np.inf)
        j = int(np.argmax(score))
        picks.append(j)
        from_elig.append(bool(elig[j]))
        free[j] = False
        dist = np.minimum(dist, (1 - e @ e[j]) / 2)
    return picks, from_elig


@dataclass
class PredictiveArgs:
    candidate_pool: int = 256
    """candidates scored per step (capped at the pool size; at least the batch size)"""
    ppm_threshold: float = 0.7
    """minimum P(group informative) to be preferred (0.7 with G = 8: p in [0.14, 0.86])"""
    diversity_weight: float = 0.3
    """weight of the distance-to-picked term in the greedy selection"""
    uniform_share: float = 0.1
    """expected share of each batch drawn uniformly from the whole pool"""
    prior_strength: float = 4.0
    """rollouts the PPM prediction is worth as a Beta prior for a prompt"""
    skill_gate: bool = True
    """scale the prior by the PPM's measured skill: an unskilled PPM (early on, or after the
    policy moved) leaves a weak prior, so Thompson draws spread and selection is near uniform"""
    min_prior_strength: float = 1.0
    """prior strength when the PPM has no skill"""
    skill_decay: float = 0.8
    """per-step decay of the squared errors the skill is measured on"""
    hard_tilt: float = 0.0
    """rank eligible candidates by v x (1 - theta)^hard_tilt: > 0 prefers the hard-but-solvable
    side of the informative band (a prompt the policy mostly fails but sometimes solves is
    where greedy accuracy and pass@k move; one it mostly solves is already right). Pays only
    with a PPM that separates hard-but-solvable from out of reach (see the bench report)"""
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
        if self.stratify not in ("task", "none"):
            raise ValueError(f"stratify is 'task' or 'none'; got {self.stratify!r}")
        if not 0 <= self.diversity_weight <= 1 or not 0 <= self.uniform_share <= 1:
            raise ValueError("diversity_weight and uniform_share are weights in [0, 1]")
        if self.prior_strength <= 0:
            raise ValueError("prior_strength must be > 0 (a Beta prior needs positive mass)")
        if self.fit_every < 1:
            raise ValueError(f"fit_every counts updates and must be >= 1, got {self.fit_every}")
        if self.candidate_pool < 1 or not 0 <= self.decay <= 1:
            raise ValueError("candidate_pool must be >= 1 and decay in [0, 1]")


@register_sampler("ppm")
class PredictiveSampler(PoolSampler):
    """GPS-style selection driven by a prompt predictive model."""

    def __init__(
        self,
        pool: list[Prompt],
        seed: int = 0,
        args: PredictiveArgs | None = None,
        ppm: Predictor | None = None,
        embeddings: np.ndarray | None = None,
        embedder=None,
    ):
        super().__init__(pool, seed)
        self.args = args or PredictiveArgs()
        self.ppm = ppm or PromptPredictiveModel(PPMArgs(seed=seed))
        if embeddings is not None and len(embeddings) != len(pool):
            raise ValueError(f"{len(embeddings)} embeddings for a pool of {len(pool)} prompts")
        self.embeddings = embeddings
        self.embedder = embedder  # how `embeddings` were made, to embed prompts added later
        self.own_s = np.zeros(len(self.stats))  # decayed successes per prompt
        self.own_f = np.zeros(len(self.stats))  # decayed failures
        self.group_size = 8  # G, until the first update shows the real one
        self.err_ppm = self.err_base = 0.0  # decayed squared errors: PPM, running mean
        self.seen_s = self.seen_n = 0.0  # successes and attempts so far (the running mean)
        self.stratum = self._strata()

    def _strata(self) -> np.ndarray:
        keys = [p.task if self.args.stratify == "task" else "" for p in self.pool]
        names = {k: i for i, k in enumerate(sorted(set(keys)))}
        return np.array([names[k] for k in keys], dtype=np.int64)

    def on_extend(self, prompts: list[Prompt], new_stats: int) -> None:
        if self.embeddings is not None:
            if self.embedder is None:
                raise ValueError("precomputed embeddings without an embedder: no new prompts")
            new = self.embedder(prompts)
            self.embeddings = np.concatenate([self.embeddings, new.astype(self.embeddings.dtype)])
        self.own_s = np.concatenate([self.own_s, np.zeros(new_stats)])
        self.own_f = np.concatenate([self.own_f, np.zeros(new_stats)])
        self.stratum = self._strata()

    def embed(self, pos: np.ndarray) -> np.ndarray:
        if self.embeddings is not None:
            return self.embeddings[pos]
        return self.ppm.embed([self.pool[i] for i in pos])

    @property
    def skill(self) -> float:
        """The PPM's recent Brier skill against the running mean pass rate, in [0, 1].

        Prequential: each step's outcomes are scored against predictions made before the PPM
        saw them. 0 until the PPM beats always predicting the mean (e.g. before any fit)."""
        if self.err_base <= 1e-9:
            return 0.0
        return float(np.clip(1.0 - max(self.err_ppm, 0.0) / self.err_base, 0.0, 1.0))

    def prior_strength(self) -> float:
        a = self.args
        if not a.skill_gate:
            return a.prior_strength
        return max(a.min_prior_strength, a.prior_strength * self.skill)

    def posterior(self, pos: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Beta(alpha, beta) per candidate: the PPM prediction worth prior_strength() rollouts
        plus the prompt's own decayed counts."""
        mu = np.clip(self.ppm.predict([self.pool[i] for i in pos]), 1e-3, 1 - 1e-3)
        sidx, k = self.stats.of_pool[pos], self.prior_strength()
        return k * mu + self.own_s[sidx], k * (1 - mu) + self.own_f[sidx]

    def score_skill(self, prompts: list[Prompt], outcomes: list[GroupOutcome]) -> None:
        """Fold one step's outcomes into the PPM's skill (before the PPM learns from them)."""
        n = np.array([o.attempts for o in outcomes], dtype=float)
        rate = np.array([o.successes for o in outcomes]) / n
        # unbiased binomial noise of each observed rate: both errors contain it; without it a
        # perfect PPM looks no better than the mean on the p ~ 0.5 prompts it picks
        noise = rate * (1 - rate) / np.maximum(n - 1, 1)
        base = self.seen_s / self.seen_n if self.seen_n else 0.5
        r = self.args.skill_decay
        pred = self.ppm.predict(prompts)
        self.err_ppm = r * self.err_ppm + float(((pred - rate) ** 2 - noise).sum())
        self.err_base = r * self.err_base + float(((base - rate) ** 2 - noise).sum())
        self.seen_s += sum(o.successes for o in outcomes)
        self.seen_n += sum(o.attempts for o in outcomes)

    def select_scored(self, step: int, batch_size: int) -> Selection:
        a = self.args
        u = a.uniform_share * batch_size
        n_uni = int(u) + int(self.rng.random() < u - int(u))
        n_pred = batch_size - n_uni
        recs, chosen = [], []
        if n_pred > 0:
            size = min(len(self.pool), max(a.candidate_pool, n_pred))
            pos = self.draw(size, replace=False)
            alpha, beta = self.posterior(pos)
            theta = self.rng.beta(alpha, beta)
            value = informativeness(theta, self.group_size)
            picks, elig = self.pick(pos, value, n_pred, value * (1 - theta) ** a.hard_tilt)
            mean, std = beta_mean_std(alpha, beta)
            reason = {
                j: "informative" if e else "below_threshold_fill"
                for j, e in zip(picks, elig, strict=True)
            }
            for j, p in enumerate(pos):
                recs.append(
                    make_record(
                        self.pool[p],
                        mean[j],
                        std[j],
                        self.name,
                        j in reason,
                        reason.get(j, "not_picked"),
                        self.ppm.version,
                    )
                )
            chosen += [self.pool[pos[j]] for j in picks]
            if len(picks) < n_pred:  # tiny pool: fill the rest uniformly
                n_uni += n_pred - len(picks)
        if n_uni:
            upos = self.draw(n_uni)
            alpha, beta = self.posterior(upos)
            mean, std = beta_mean_std(alpha, beta)
            for j, p in enumerate(upos):
                chosen.append(self.pool[p])
                recs.append(
                    make_record(
                        self.pool[p],
                        mean[j],
                        std[j],
                        self.name,
                        True,
                        "uniform_share",
                        self.ppm.version,
                    )
                )
        return Selection(chosen, recs)

    def pick(
        self, pos: np.ndarray, value: np.ndarray, n: int, rank: np.ndarray | None = None
    ) -> tuple[list[int], list[bool]]:
        """Candidate indices (into pos) to train on: quotas per stratum by summed `value`, then
        MMR within each on `rank` (default: value) among those with value >= ppm_threshold."""
        rank = value if rank is None else rank
        a, emb = self.args, self.embed(pos)
        strata = self.stratum[pos]
        ids = np.unique(strata)
        mass = np.array([value[strata == s].sum() for s in ids])
        available = np.array([(strata == s).sum() for s in ids])
        picks, elig = [], []
        for s, q in zip(ids, stratum_quotas(mass, available, n, self.rng), strict=True):
            if q == 0:
                continue
            members = np.flatnonzero(strata == s)
            ok = value[members] >= a.ppm_threshold
            p, e = mmr_select(rank[members], emb[members], int(q), a.diversity_weight, ok)
            picks += members[p].tolist()
            elig += e
        return picks, elig

    def observe(self, prompts: list[Prompt], idx: np.ndarray, outcomes: list[GroupOutcome]):
        self.group_size = outcomes[0].attempts
        self.score_skill(prompts, outcomes)
        d = self.args.decay
        touched = np.unique(idx)
        self.own_s[touched] *= d
        self.own_f[touched] *= d
        for i, o in zip(idx, outcomes, strict=True):
            self.own_s[i] += o.successes
            self.own_f[i] += o.attempts - o.successes
        self.ppm.observe(prompts, [o.successes for o in outcomes], [o.attempts for o in outcomes])
        if self.stats.version % self.args.fit_every == 0:
            self.ppm.fit(self.args.fit_steps)

    def extra_state(self) -> dict:
        return {
            "own_s": self.own_s.copy(),
            "own_f": self.own_f.copy(),
            "ppm": self.ppm.state_dict(),
            "skill": [self.err_ppm, self.err_base, self.seen_s, self.seen_n],
            "group_size": self.group_size,
        }

    def load_extra_state(self, state: dict) -> None:
        self.own_s[:], self.own_f[:] = state["own_s"], state["own_f"]
        self.ppm.load_state_dict(state["ppm"])
        # states saved before the skill gate existed restore with no skill measured yet
        self.err_ppm, self.err_base, self.seen_s, self.seen_n = state.get("skill", [0.0] * 4)
        self.group_size = state.get("group_size", self.group_size)
