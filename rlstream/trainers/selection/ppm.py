"""The Prompt Predictive Model: predicts a prompt's pass rate before any rollout.

features(prompt) = [featurizer(prompt) (text / sentence embedding / policy hidden states),
history_features(attempts, successes, version gap, neighbourhood pass rate)] -> MLP (hidden 256)
-> sigmoid. Parameters are shared across prompts, so prompts never rolled out get a score from
what similar prompts did. Where a featurizer's column estimates the pass rate itself (the
policy's probability of its greedy answer), the MLP learns a correction to that column's logit
and starts at none: before any outcome the PPM predicts it (a zero-shot prior). Trained
online: every observed group (successes of n, with the features the prompt had *before* that
rollout) joins a history buffer, and each `fit` takes a few Adam steps of the binomial
likelihood (optionally with pseudo-counts) over the whole buffer, recent observations weighted
more (the policy drifts); an observation whose weight fell below
MIN_RECENCY_WEIGHT is dropped, so the buffer (and a fit's cost) stays bounded on long runs.
Calibration: Brier score and Pearson r on unseen prompts. Scoring can run on an INT8
dynamically quantized copy; `quantization_error` reports what that costs.
"""

from __future__ import annotations

import bisect
import copy
import math
import warnings
from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from rlstream.trainers.envs import Prompt
from rlstream.trainers.selection.features import (
    HISTORY_DIM,
    Featurizer,
    history_features,
    make_featurizer,
)
from rlstream.trainers.selection.neighbours import KnnNeighbourhood

MIN_RECENCY_WEIGHT = 1e-3
"""An observation weighted less than this in the fit is dropped from the buffer (at recency 0.98:
kept for the last 342 observe() calls; the next older weighs under 0.1% of the newest)."""


class WarmStartError(ValueError):
    """A PPM (`selection.ppm_from`, a selection bench `@warm` arm) cannot start from that state."""


def binomial_nll(
    logits: torch.Tensor,
    successes: torch.Tensor,
    attempts: torch.Tensor,
    weights: torch.Tensor | None = None,
) -> torch.Tensor:
    """Binomial negative log-likelihood per rollout (the binomial coefficient dropped).

    logits, successes, attempts, weights: (N,). Returns the scalar
    sum_i w_i * -(s_i log sigma(z_i) + (n_i - s_i) log sigma(-z_i)) / sum_i w_i n_i.
    """
    w = torch.ones_like(logits) if weights is None else weights
    ll = successes * F.logsigmoid(logits) + (attempts - successes) * F.logsigmoid(-logits)
    return -(w * ll).sum() / (w * attempts).sum().clamp_min(1e-8)


def brier_score(pred: np.ndarray, successes: np.ndarray, attempts: np.ndarray) -> float:
    """Mean squared error of pred against every binary outcome: sum(s(1-p)^2 + f p^2) / sum(n)."""
    p, s, n = (np.asarray(x, dtype=float) for x in (pred, successes, attempts))
    return float((s * (1 - p) ** 2 + (n - s) * p**2).sum() / n.sum())


def pearson_r(x: np.ndarray, y: np.ndarray) -> float:
    """Pearson correlation (0 when either side is constant)."""
    x, y = np.asarray(x, dtype=float), np.asarray(y, dtype=float)
    sx, sy = x.std(), y.std()
    return 0.0 if sx == 0 or sy == 0 else float(((x - x.mean()) * (y - y.mean())).mean() / sx / sy)


def calibration(pred: np.ndarray, successes: np.ndarray, attempts: np.ndarray) -> dict:
    """Brier score and Pearson r of predictions against observed pass rates s/n."""
    return {
        "brier": brier_score(pred, successes, attempts),
        "pearson_r": pearson_r(pred, np.asarray(successes) / np.asarray(attempts)),
        "n_prompts": len(pred),
    }


BASE_CLIP = 0.02
"""A zero-shot base rate is read in [BASE_CLIP, 1 - BASE_CLIP] (logits within +-3.9): a policy
sure of its greedy answer is still wrong sometimes, and the network learns a bounded correction."""


class PPMNet(nn.Module):
    """x (N, D) -> logit (N,): Linear-ReLU-Linear-ReLU-Linear.

    With `base` (a column of x that estimates the pass rate itself) the MLP learns a correction
    to that column's logit, and starts at none (its output layer zero): before any
    observation the PPM predicts the base rate, a zero-shot prior."""

    def __init__(self, in_dim: int, hidden: int = 256, base: int | None = None):
        super().__init__()
        self.mlp = nn.Sequential(
            nn.Linear(in_dim, hidden),
            nn.ReLU(),
            nn.Linear(hidden, hidden),
            nn.ReLU(),
            nn.Linear(hidden, 1),
        )
        self.base = base
        if base is not None:
            nn.init.zeros_(self.mlp[-1].weight)
            nn.init.zeros_(self.mlp[-1].bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = self.mlp(x).squeeze(-1)  # (N,)
        if self.base is None:
            return out
        return out + torch.logit(x[:, self.base].clamp(BASE_CLIP, 1 - BASE_CLIP))


def quantize_int8(net: nn.Module) -> nn.Module:
    """An INT8 dynamically quantized copy of net's Linear layers, for scoring only."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # torch.ao.quantization deprecation notices
        from torch.ao.quantization import quantize_dynamic

        return quantize_dynamic(copy.deepcopy(net).eval(), {nn.Linear}, dtype=torch.qint8)


@torch.no_grad()
def quantization_error(net: nn.Module, x: torch.Tensor) -> dict:
    """Accuracy cost of INT8 scoring: max and mean |sigmoid(float) - sigmoid(int8)| on x (N, D)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        d = (torch.sigmoid(net.eval()(x)) - torch.sigmoid(quantize_int8(net)(x))).abs()
    return {"max_abs": float(d.max()), "mean_abs": float(d.mean()), "n": len(x)}


@dataclass
class PPMArgs:
    featurizers: tuple[str, ...] = ("text",)
    """registered featurizers whose outputs are concatenated (see features.FEATURIZERS)"""
    hidden: int = 256
    """MLP hidden width"""
    lr: float = 2e-3
    """Adam learning rate"""
    weight_decay: float = 1e-4
    """AdamW weight decay"""
    batch_size: int = 256
    """observations per gradient step"""
    fit_steps: int = 20
    """gradient steps per fit()"""
    pseudo_count: float = 0.0
    """pseudo-observations added to every group in the fit, this many successes and as many
    failures (0.5: Jeffreys' prior): a group of 8 all wrong then pulls its prompt's prediction
    to 0.5/9 = 0.056, not to 0. Without them a PPM that seldom sees prompts out of reach (a
    sampler screening for informative ones rarely picks them) extrapolates its logits there:
    on the late chain-of-thought pool it predicted under 0.01 for prompts 7% of whose samples
    were right, and test-time allocation, trusting it, starved them"""
    recency: float = 0.98
    """weight of an observation decays by this factor per policy version (drift)"""
    max_history: int = 50_000
    """observations kept in the buffer (oldest dropped)"""
    use_history: bool = True
    """append history and neighbourhood features"""
    k_neighbours: int = 8
    """neighbours for the neighbourhood pass rate"""
    zero_shot: bool = True
    """where the featurizer has a column that estimates the pass rate itself (`confidence`: the
    policy's probability of its own greedy answer; `reference`: of the reference answer),
    predict that before any observation and learn the correction to it, instead of starting
    from a random network's guesses: on the pre-trained chain-of-thought policy that column
    alone has Pearson r 0.76 with 16-sample pass rates, and a first batch picked by it wastes
    0.24 of its rollouts where a random one wastes 0.59 (benchmarks/ppm_features_probe.py);
    on the selection bench the first batch wasted a quarter to three fifths less on every pool"""
    refresh_every: int = 1
    """policy versions a prompt's policy features are kept for: they are recomputed once the
    policy has moved this many versions past the one they read (1: after every update).
    Larger spends less of the policy's compute on scoring, on staler features"""
    int8_scoring: bool = False
    """score with an INT8 dynamically quantized copy (refreshed after each fit)"""
    seed: int = 0
    """seed of the MLP init and minibatch draws"""

    def __post_init__(self):
        if not self.featurizers:
            raise ValueError("the PPM needs at least one featurizer to score unseen prompts")
        if self.pseudo_count < 0:
            raise ValueError(f"pseudo_count counts observations, >= 0; got {self.pseudo_count}")
        if not 0 < self.recency <= 1:
            raise ValueError(f"recency is a per-version decay in (0, 1], got {self.recency}")
        if self.hidden < 1 or self.batch_size < 1 or self.fit_steps < 0:
            raise ValueError("hidden and batch_size must be >= 1, fit_steps >= 0")


class PromptPredictiveModel:
    """Featurize, remember every observation, fit online, predict pass rates (also for unseen)."""

    def __init__(
        self,
        args: PPMArgs | None = None,
        featurizer: Featurizer | None = None,
        neighbourhood=None,
        keys: Featurizer | None = None,
    ):
        """`keys`: the vectors neighbours are found by (default: the featurizer's output); a
        neighbourhood kept outside (the run's Qdrant collection) is searched in its space."""
        self.args = a = args or PPMArgs()
        if featurizer is None:
            from rlstream.trainers.selection.features import ConcatFeaturizer

            featurizer = ConcatFeaturizer([make_featurizer(n) for n in a.featurizers])
        self.featurizer, self.keys = featurizer, keys
        self.neighbours = neighbourhood or KnnNeighbourhood(a.k_neighbours)
        self.in_dim = featurizer.dim + (HISTORY_DIM if a.use_history else 0)
        self.base = getattr(featurizer, "base", None) if a.zero_shot else None
        torch.manual_seed(a.seed)
        self.net = PPMNet(self.in_dim, a.hidden, self.base)
        # fused: one kernel per step for all parameters, 26% off a fit on this machine's CPU
        self.opt = torch.optim.AdamW(self.net.parameters(), lr=a.lr, weight_decay=a.weight_decay,
                                     fused=True)  # fmt: skip
        self.gen = torch.Generator().manual_seed(a.seed)
        self.counts: dict[str, list[float]] = {}  # prompt_id -> [successes, attempts, last ver]
        self.x, self.s, self.n, self.ver = [], [], [], []  # the observation buffer
        self.policy_version, self.version = 0, 0  # observe() calls, fit() calls
        self._cache: dict[str, tuple[int, np.ndarray]] = {}  # prompt id -> (moves, features)
        self._moves = 0  # policy versions seen
        self._int8: nn.Module | None = None

    def embed(self, prompts: list[Prompt]) -> np.ndarray:
        """Featurizer output (N, featurizer.dim), cached by prompt id."""
        missing = [p for p in dict.fromkeys(prompts) if p.prompt_id not in self._cache]
        if missing:
            for p, v in zip(missing, self.featurizer(missing), strict=True):
                self._cache[p.prompt_id] = (self._moves, v)
        return np.stack([self._cache[p.prompt_id][1] for p in prompts]).astype(np.float32)

    def key_vectors(self, prompts: list[Prompt]) -> np.ndarray:
        """The vectors the neighbourhood is searched by."""
        return self.embed(prompts) if self.keys is None else self.keys(prompts)

    def refresh_features(self, version: int | None = None) -> None:
        """The policy moved (to `version`, else by one): forget each prompt's cached featurizer
        output once the policy is `refresh_every` versions past the one it read."""
        self._moves = self._moves + 1 if version is None else version
        keep = self.args.refresh_every
        self._cache = {k: v for k, v in self._cache.items() if self._moves - v[0] < keep}

    def features(self, prompts: list[Prompt]) -> np.ndarray:
        """Model inputs (N, in_dim): embedding + history features as of now."""
        e = self.embed(prompts)
        if not self.args.use_history:
            return e
        c = np.array([self.counts.get(p.prompt_id, [0.0, 0.0, -1.0]) for p in prompts])
        gap = self.policy_version - c[:, 2]
        rate, weight = self.neighbours.query(
            self.key_vectors(prompts), exclude=[p.prompt_id for p in prompts]
        )
        return np.concatenate([e, history_features(c[:, 1], c[:, 0], gap, rate, weight)], axis=1)

    def observe(self, prompts: list[Prompt], successes, attempts) -> None:
        """Add one step's groups to the history (features taken before the counters move)."""
        x = self.features(prompts)
        s, n = np.asarray(successes, dtype=float), np.asarray(attempts, dtype=float)
        self.x += list(x)
        self.s += s.tolist()
        self.n += n.tolist()
        self.ver += [self.policy_version] * len(prompts)
        for p, si, ni in zip(prompts, s, n, strict=True):
            c = self.counts.setdefault(p.prompt_id, [0.0, 0.0, -1.0])
            c[0], c[1], c[2] = c[0] + si, c[1] + ni, self.policy_version
        if self.args.use_history:
            self.neighbours.add([p.prompt_id for p in prompts], self.key_vectors(prompts), s, n)
        drop = self._stale()
        if drop > 0:
            del self.x[:drop], self.s[:drop], self.n[:drop], self.ver[:drop]
        self.policy_version += 1

    def _stale(self) -> int:
        """How many of the oldest observations go: beyond max_history, or weighted below
        MIN_RECENCY_WEIGHT at the next fit (`ver` never decreases, so they are a prefix)."""
        drop = len(self.s) - self.args.max_history
        if self.args.recency < 1.0:
            max_age = math.log(MIN_RECENCY_WEIGHT) / math.log(self.args.recency)
            drop = max(drop, bisect.bisect_left(self.ver, self.policy_version - max_age))
        return drop

    def fit(self, steps: int | None = None) -> float:
        """Adam steps on the recency-weighted binomial likelihood of the buffer; last loss."""
        a, steps = self.args, self.args.fit_steps if steps is None else steps
        if not self.s or steps == 0:
            return float("nan")
        x = torch.from_numpy(np.stack(self.x))
        s, n = torch.tensor(self.s) + a.pseudo_count, torch.tensor(self.n) + 2 * a.pseudo_count
        w = a.recency ** (self.policy_version - 1 - torch.tensor(self.ver, dtype=torch.float64))
        self.net.train()
        for _ in range(steps):
            idx = torch.multinomial(
                w, min(a.batch_size, len(w)), replacement=True, generator=self.gen
            )
            loss = binomial_nll(self.net(x[idx]), s[idx].float(), n[idx].float())
            self.opt.zero_grad(set_to_none=True)
            loss.backward()
            self.opt.step()
        self.version += 1
        self._int8 = quantize_int8(self.net) if a.int8_scoring else None
        return float(loss.detach())

    @torch.no_grad()
    def predict(self, prompts: list[Prompt], int8: bool | None = None) -> np.ndarray:
        """Predicted pass rate (N,) in (0, 1) for any prompts, seen or not; int8 True/False
        forces INT8 or float scoring (default: as `int8_scoring` says)."""
        if not prompts:
            return np.zeros(0)
        net = self._int8 if self._int8 is not None else self.net.eval()
        if int8 is not None:
            net = quantize_int8(self.net) if int8 else self.net.eval()
        return torch.sigmoid(net(torch.from_numpy(self.features(prompts)))).numpy().astype(float)

    def start_from(self, state: dict, neighbours: bool = False) -> None:
        """Start this fresh PPM from another run's final `state_dict`: its network, optimiser
        and observation history (ages kept relative to that run's end, so they weigh as older
        than anything this run observes), not its per-prompt counters: those described that
        run's policy. `neighbours`: also its neighbourhood's outcomes (an in-memory one: a
        prompt this run rolls out then counts only its own, as a Qdrant collection carried
        over by the scheduler does). A PPM of other features cannot start from it."""
        theirs = state["net"]["mlp.0.weight"].shape[1]
        if theirs != self.in_dim:
            raise WarmStartError(
                f"selection.ppm_from: that run's PPM read {theirs} features, this one reads "
                f"{self.in_dim}; use the same selection.ppm_features"
            )
        self._check_base(state)
        self.net.load_state_dict(state["net"])
        self.opt.load_state_dict(state["opt"])
        end = state["policy_version"]
        self.x, self.s, self.n = list(state["x"]), list(state["s"]), list(state["n"])
        self.ver = [v - end for v in state["ver"]]  # <= 0: older than anything observed here
        self.version = state["version"]
        if neighbours and state.get("neighbours") is not None:
            self.neighbours.carry(state["neighbours"])
        self._int8 = quantize_int8(self.net) if self.args.int8_scoring else None

    def _check_base(self, state: dict) -> None:
        """A network learned as a correction to a zero-shot base rate predicts nonsense without
        it, and one learned from scratch with it (states before 12-06 have no base)."""
        theirs = state.get("base")
        if theirs != self.base:
            said = lambda b: "from scratch" if b is None else f"as a correction to column {b}"  # noqa: E731
            raise WarmStartError(
                f"selection.ppm_zero_shot: that PPM was learned {said(theirs)}, this one "
                f"{said(self.base)}; use the same selection.ppm_zero_shot"
            )

    def state_dict(self) -> dict:
        return {
            "base": self.base,
            "net": self.net.state_dict(),
            "opt": self.opt.state_dict(),
            "gen": self.gen.get_state(),
            "counts": copy.deepcopy(self.counts),
            "x": list(self.x),
            "s": list(self.s),
            "n": list(self.n),
            "ver": list(self.ver),
            "policy_version": self.policy_version,
            "version": self.version,
            "neighbours": self.neighbours.state_dict()
            if hasattr(self.neighbours, "state_dict")
            else None,
        }

    def load_state_dict(self, st: dict) -> None:
        self._check_base(st)
        self.net.load_state_dict(st["net"])
        self.opt.load_state_dict(st["opt"])
        self.gen.set_state(st["gen"])
        self.counts = copy.deepcopy(st["counts"])
        self.x, self.s, self.n, self.ver = (
            list(st["x"]),
            list(st["s"]),
            list(st["n"]),
            list(st["ver"]),
        )
        self.policy_version, self.version = st["policy_version"], st["version"]
        if st["neighbours"] is not None:
            self.neighbours.load_state_dict(st["neighbours"])
        self._int8 = quantize_int8(self.net) if self.args.int8_scoring else None
