"""The PPM-predictive sampler (GPS-style): predicted intermediate difficulty + diversity + a floor.

Per step:
1. a minimum uniform share of the batch is drawn uniformly from the whole pool (expected share
   exactly `uniform_share`), so no region starves even when its estimate collapsed; and
   `explore_share` of it uniformly among the scored candidates predicted out of reach (below
   the informative band), so the PPM's "hopeless" is checked where it would otherwise never be;
2. a candidate pool is drawn (and, while fewer than the batch's predicted picks reach
   ppm_threshold, another, up to `candidate_max`); the PPM predicts each candidate's pass rate
   mu; a Beta posterior per candidate combines that prediction as a prior worth k rollouts
   with the prompt's own decayed outcomes. k is `prior` 'fit' (the default of the loops): per
   task family, the strength under which the outcomes seen so far were likeliest given the
   predictions made before them (a beta-binomial's maximum-likelihood concentration: how far
   true pass rates scatter around a prediction of that family; measured on the CoT pool, 1
   for chain, 3 for mul, 8-32 for add and sub); or 'skill': `prior_strength` scaled by the
   PPM's prequential Brier skill with `skill_gate` (a PPM no better than the mean pass rate
   leaves a weak prior);
3. value v = the probability that a group of G is informative, 1 - theta^G - (1 - theta)^G
   (a zero-variance group has all-zero advantages and teaches nothing), with `acquisition`
   'expected' its expectation under the posterior in closed form (the predictive probability
   that the group is informative: a prompt the PPM is unsure of puts mass on 0 and 1 and scores
   lower) or 'thompson' at one draw theta from the posterior (uncertain prompts explored);
   candidates with v >= ppm_threshold are preferred, the rest only fill a shortfall;
4. with `stratify` 'task', strata (task families) get the predicted slots in proportion to
   their summed v over the candidates, i.e. to the informative groups uniform sampling would
   draw from them; 'none' ranks all candidates together (the loops' default: with fitted
   strengths v is already calibrated per family, and quotas would pay for a family whose
   prompts the PPM cannot tell apart);
5. within each stratum, greedy max-marginal-relevance picks: score = (1 - w) r + w d, with
   r = v (1 - theta)^hard_tilt (with 'expected', its expectation; 0: r = v; the loops' 2
   leans to the hard-but-solvable side), d the cosine distance (halved, in [0, 1]) to the
   nearest prompt already picked this step, w = diversity_weight; a shortfall of candidates
   at ppm_threshold is filled on r (`fill` 'rank') or on v ('value').
"""

from __future__ import annotations

import numpy as np

from rlstream.registry import register_sampler
from rlstream.trainers.envs import Prompt
from rlstream.trainers.selection.acquisition import (
    Predictor,
    expected_informativeness,
    informativeness,
    mmr_select,
    stratum_quotas,
)
from rlstream.trainers.selection.base import GroupOutcome, PoolSampler
from rlstream.trainers.selection.mopps import beta_mean_std
from rlstream.trainers.selection.ppm import PPMArgs, PromptPredictiveModel
from rlstream.trainers.selection.predictive_args import PredictiveArgs
from rlstream.trainers.selection.records import Selection, make_record
from rlstream.trainers.selection.trust import Trust


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
        self.trust = Trust(self.args)  # what a prediction is worth (trust.py)
        self.stratum = self._strata()
        self.screened = 0  # candidates scored for the last pick
        self.shortlist: dict[int, int] = {}  # pool position -> the round it was drawn in
        self.rounds = 0

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

    def prior_strength(self, family: str = "*") -> float:
        """Rollouts a PPM prediction is worth in a prompt's prior (`Trust.strength`)."""
        return self.trust.strength(family)

    def family_strengths(self) -> dict[str, float]:
        """prior_strength() of each task family in the pool."""
        return {f: self.prior_strength(f) for f in sorted({p.task for p in self.pool})}

    def prompt_strengths(self, prompts: list[Prompt]) -> np.ndarray:
        """prior_strength() of each prompt's task family (computed once per family)."""
        names = [p.task for p in prompts]
        per_family = {k: self.prior_strength(k) for k in set(names)}
        return np.array([per_family[k] for k in names])

    def posterior(self, pos: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Beta(alpha, beta) per candidate: the PPM prediction worth prior_strength() rollouts
        (its family's) plus the prompt's own decayed counts."""
        prompts = [self.pool[i] for i in pos]
        mu = np.clip(self.ppm.predict(prompts), 1e-3, 1 - 1e-3)
        sidx, k = self.stats.of_pool[pos], self.prompt_strengths(prompts)
        return k * mu + self.own_s[sidx], k * (1 - mu) + self.own_f[sidx]

    def select_scored(self, step: int, batch_size: int) -> Selection:
        a = self.args
        n_uni = self.rounded(a.uniform_share * batch_size)
        n_exp = min(self.rounded(a.explore_share * batch_size) if a.explore_share else 0,
                    batch_size - n_uni)  # fmt: skip
        n_pred = batch_size - n_uni - n_exp
        recs, chosen = [], []
        if n_pred + n_exp > 0:
            pos, alpha, beta, value, rank = self.screen(max(n_pred, 1))
            picks, elig = self.pick(pos, value, n_pred, rank) if n_pred else ([], [])
            mean, std = beta_mean_std(alpha, beta)
            reason = {
                j: "informative" if e else "below_threshold_fill"
                for j, e in zip(picks, elig, strict=True)
            }
            low = np.flatnonzero((mean < 0.5) & (value < a.ppm_threshold))
            low = low[~np.isin(low, picks)]
            explore = (
                self.rng.choice(low, min(n_exp, len(low)), replace=False) if n_exp else low[:0]
            )
            reason |= {int(j): "explore_low" for j in explore}
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
            chosen += [self.pool[pos[j]] for j in [*picks, *explore.tolist()]]
            for j in [*picks, *explore.tolist()]:  # a picked prompt leaves the short list
                self.shortlist.pop(int(pos[j]), None)
            # tiny pool or none predicted out of reach: the rest uniformly
            n_uni += n_pred + n_exp - len(picks) - len(explore)
        if n_uni:
            upos = self.draw(n_uni)
            alpha, beta = self.posterior(upos)
            mean, std = beta_mean_std(alpha, beta)
            for j, p in enumerate(upos):
                chosen.append(self.pool[p])
                self.shortlist.pop(int(p), None)
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

    def describe(self) -> str:
        """The selection settings in a line (the scheduler logs it when the sampler is built)."""
        a = self.args
        most = min(len(self.pool), max(a.candidate_max, a.candidate_pool))
        return (
            f"{min(len(self.pool), a.candidate_pool)} candidates scored a round, up to {most} "
            f"while informative ones are scarce; a shortfall filled by {a.fill}; uniform share "
            f"{a.uniform_share:g}, explore share {a.explore_share:g}; "
            + (f"candidates not picked kept {a.shortlist_rounds} rounds; "
               if a.shortlist_rounds else "")
            + "the PPM starts from "
            + ("its features' own pass-rate estimate (zero-shot)"
               if getattr(self.ppm, "base", None) is not None else "a random network")
        )  # fmt: skip

    def rounded(self, x: float) -> int:
        """x rounded up with probability its fraction (an expected share stays exact)."""
        return int(x) + int(self.rng.random() < x - int(x))

    def screen(self, n_pred: int) -> tuple[np.ndarray, ...]:
        """Candidates and their posteriors, values and ranks: candidate_pool of them, and while
        fewer than n_pred reach ppm_threshold, candidate_pool more, up to candidate_max (the
        scoring cost follows how scarce informative prompts are). Returns pos, alpha, beta,
        value, rank, each (C,)."""
        a = self.args
        chunk = max(a.candidate_pool, n_pred)
        if a.shortlist_rounds:
            order = self.short_list(min(len(self.pool), chunk))
            size = chunk = len(order)
        else:
            size = min(len(self.pool), max(a.candidate_max, chunk))
            order = self.draw(size, replace=False)
        parts: list[tuple[np.ndarray, ...]] = []
        eligible, start = 0, 0
        while start < size and (start == 0 or eligible < n_pred):
            pos = order[start : start + chunk]
            alpha, beta = self.posterior(pos)
            value, rank = self.acquire(alpha, beta)
            parts.append((pos, alpha, beta, value, rank))
            eligible += int((value >= a.ppm_threshold).sum())
            start += chunk
        self.screened = min(start, size)
        return tuple(np.concatenate(x) for x in zip(*parts, strict=True))

    def short_list(self, size: int) -> np.ndarray:
        """This round's `size` candidates: the earlier rounds' candidates not picked, each
        kept `shortlist_rounds` rounds, and as many drawn anew as that leaves room for."""
        self.rounds += 1
        kept = [
            p for p, r in self.shortlist.items() if self.rounds - r < self.args.shortlist_rounds
        ]
        kept = kept[-size:]  # the newest
        n_new, taken = size - len(kept), set(kept)
        drawn = self.draw(min(len(self.pool), size + len(kept)), replace=False)
        new = [int(p) for p in drawn if int(p) not in taken][:n_new]
        self.shortlist = {p: self.shortlist[p] for p in kept} | dict.fromkeys(new, self.rounds)
        return np.array(kept + new, dtype=np.int64)

    def acquire(self, alpha: np.ndarray, beta: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Each candidate's value (P(group informative)) and rank (value x (1 - theta)^tilt)
        from its Beta posterior: of one Thompson draw, or expected in closed form."""
        a, g = self.args, self.group_size
        if a.acquisition == "expected":
            return (
                expected_informativeness(alpha, beta, g),
                expected_informativeness(alpha, beta, g, a.hard_tilt),
            )
        theta = self.rng.beta(alpha, beta)
        value = informativeness(theta, g)
        return value, value * (1 - theta) ** a.hard_tilt

    def pick(
        self, pos: np.ndarray, value: np.ndarray, n: int, rank: np.ndarray | None = None
    ) -> tuple[list[int], list[bool]]:
        """Candidate indices (into pos) to train on: quotas per stratum by summed `value`, then
        MMR within each on `rank` (default: value) among those with value >= ppm_threshold,
        then among the rest (on `rank` or `value`, as `fill` says) while picks are short."""
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
            r = rank[members] if a.fill == "rank" else np.where(ok, rank[members], value[members])
            p, e = mmr_select(r, emb[members], int(q), a.diversity_weight, ok)
            picks += members[p].tolist()
            elig += e
        return picks, elig

    def observe(self, prompts: list[Prompt], idx: np.ndarray, outcomes: list[GroupOutcome]):
        self.group_size = outcomes[0].attempts
        self.trust.score(prompts, self.ppm.predict(prompts), outcomes)  # before the PPM learns
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
            "group_size": self.group_size,
            **self.trust.state_dict(),
        }

    def load_extra_state(self, state: dict) -> None:
        self.own_s[:], self.own_f[:] = state["own_s"], state["own_f"]
        self.ppm.load_state_dict(state["ppm"])
        self.group_size = state.get("group_size", self.group_size)
        self.trust.load_state_dict(state)

    def warm_state(self) -> dict:
        """What another run's sampler starts from (`start_from`): the PPM and what its
        predictions were found to be worth (skill, strength fit), not the per-prompt counts."""
        state = self.extra_state()
        return {k: state[k] for k in ("ppm", "skill", "strength_fit", "group_size")}

    def start_from(self, state: dict, neighbours: bool = False) -> None:
        """Start from another run's `warm_state` (`selection.ppm_from`, the bench's `@warm`
        arms): the PPM (`PromptPredictiveModel.start_from`) and how far to trust it, so its
        first picks follow its predictions (a prior worth min_prior_strength rollouts, a cold
        one's, steers them only where predictions are extreme). A bare PPM state (exports
        before 12-06) starts the PPM alone."""
        if "net" in state:
            self.ppm.start_from(state, neighbours)
            return
        self.ppm.start_from(state["ppm"], neighbours)
        self.group_size = state.get("group_size", self.group_size)
        self.trust.load_state_dict(state)
