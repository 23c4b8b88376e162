"""What the scheduler measures about its own selection: time spent selecting, the PPM's
calibration against outcomes, and reward groups joined back to their requests."""

from __future__ import annotations

import contextlib
import time
from collections import defaultdict, deque

import numpy as np

from rlstream import metrics
from rlstream.schemas import make_event_id
from rlstream.trainers.selection.compute import Compute

# Completed groups remembered to skip a redelivery: a duplicate comes from the processors
# re-scoring the rollouts they had not committed when they were restarted, which is at most
# the groups in flight (loop.target_in_flight, tens) plus one commit interval's worth.
COMPLETED_KEPT = 10_000


class SelectionClock:
    """Seconds spent choosing prompts, by part (`SCHEDULER_SELECT_SECONDS`), and per round;
    candidates scored per round (`SCHEDULER_CANDIDATES`)."""

    def __init__(self):
        self.seconds: dict[str, float] = {}
        self.rounds = 0
        self.candidates = 0  # prompts the PPM sampler scored (selection.ppm_candidates_max)
        self.compute = Compute()  # the policy tokens scoring read (the sampler's own counter)
        self.prefill_ratio: float | None = None  # measured once the policy is there

    @contextlib.contextmanager
    def part(self, name: str):
        started = time.perf_counter()
        try:
            yield
        finally:
            took = time.perf_counter() - started
            self.seconds[name] = self.seconds.get(name, 0.0) + took
            metrics.SCHEDULER_SELECT_SECONDS.labels(name).inc(took)

    def screened(self, n: int) -> None:
        self.candidates += n
        metrics.SCHEDULER_CANDIDATES.inc(n)

    def figures(self) -> dict[str, float]:
        """{} before the first round; else the total and per-round milliseconds, by part, and
        the candidates scored per round."""
        if not self.rounds:
            return {}
        total = sum(self.seconds.values())
        cost = {"select_decoded": self.compute.decoded, "select_prefilled": self.compute.prefilled}
        if self.prefill_ratio is not None:
            cost["prefill_ratio"] = round(self.prefill_ratio, 4)
        return cost | {"select_s": round(total, 3),
                "select_ms_per_round": round(1000 * total / self.rounds, 2),
                "candidates_per_round": round(self.candidates / self.rounds, 1)} | {
            f"{name}_ms_per_round": round(1000 * s / self.rounds, 2)
            for name, s in sorted(self.seconds.items())
        }  # fmt: skip

    def state_dict(self) -> dict:
        return {"seconds": dict(self.seconds), "rounds": self.rounds,
                "candidates": self.candidates, "compute": self.compute.as_dict(),
                "prefill_ratio": self.prefill_ratio}  # fmt: skip

    def load_state_dict(self, state: dict) -> None:
        """A restarted scheduler goes on counting from its snapshot."""
        self.seconds = dict(state.get("seconds", {}))
        self.rounds = int(state.get("rounds", 0))
        self.candidates = int(state.get("candidates", 0))
        self.compute = Compute(**state.get("compute", {}))
        self.prefill_ratio = state.get("prefill_ratio")


class Calibration:
    """The PPM's predictions for prompts picked before any of their rollouts, against the
    groups those rollouts then scored: the predictor's calibration on unseen prompts, live,
    over the last `window` such groups. Two windows: every first pick (`unseen`: biased, as the
    sampler picks prompts it predicts to be informative, which narrows the range r sees) and
    the picks of its uniform share (`uniform`: unbiased, what the benchmark's held-out r is)."""

    WINDOWS = ("unseen", "uniform")

    def __init__(self, window: int = 512, least: int = 16):
        self.pending: dict[str, tuple[float, bool]] = {}  # id -> (prediction, uniform pick)
        self.scored = {name: deque(maxlen=window) for name in self.WINDOWS}
        self.least = least

    def predicted(self, records, counts: dict) -> None:
        for r in records:
            if r.selected and r.prompt_id not in counts and r.prompt_id not in self.pending:
                self.pending[r.prompt_id] = (r.predicted_pass_rate, r.reason == "uniform_share")

    def observed(self, prompt_id: str, rewards: list[float]) -> None:
        pred, uniform = self.pending.pop(prompt_id, (None, False))
        if pred is None:
            return
        outcome = (pred, sum(r > 0.5 for r in rewards), len(rewards))
        self.scored["unseen"].append(outcome)
        if uniform:
            self.scored["uniform"].append(outcome)

    def figures(self) -> dict[str, dict]:
        """Brier score and Pearson r per window that holds `least` groups."""
        from rlstream.trainers.selection.ppm import calibration

        out = {}
        for name, scored in self.scored.items():
            if len(scored) >= self.least:
                pred, s, n = (np.array(col, dtype=float) for col in zip(*scored, strict=True))
                out[name] = calibration(pred, s, n)
        return out


class RewardGroups:
    """Reward rows gathered per request into complete groups, each group once.

    A reward seen before is skipped: the same sample of a partial group, or any of one of the
    newest `kept` completed groups (the processors re-score what they had not committed when
    they were restarted), so no group reaches the sampler twice."""

    def __init__(self, kept: int = COMPLETED_KEPT):
        self.kept = kept
        self.partial: dict[str, dict[int, float]] = defaultdict(dict)  # request -> sample -> r
        self.completed: dict[str, None] = {}  # insertion-ordered: the oldest goes first

    def add(self, rows: list[dict]) -> list[tuple[dict, list[float]]]:
        """The groups `rows` complete: (the completing row, rewards by sample index)."""
        done = []
        for r in rows:
            request_id = r["request_id"]
            if request_id in self.completed:
                metrics.SCHEDULER_REWARDS_REDELIVERED.inc()
                continue
            got = self.partial[request_id]
            got.setdefault(r["sample_idx"], r["reward"])
            if len(got) < r["group_size"]:
                continue
            del self.partial[request_id]
            self.completed[request_id] = None
            if len(self.completed) > self.kept:
                del self.completed[next(iter(self.completed))]
            done.append((r, [got[i] for i in sorted(got)]))
        return done

    def state_dict(self) -> dict:
        return {"rewards": dict(self.partial), "completed": list(self.completed)}

    def load_state_dict(self, state: dict) -> None:
        for request_id, got in state["rewards"].items():
            if isinstance(got, list):  # an older snapshot: rewards in arrival order, no samples
                got = {-1 - i: r for i, r in enumerate(got)}
            self.partial[request_id] = dict(got)
        self.completed = dict.fromkeys(state.get("completed", []))


def selection_rows(
    run_id: str,
    round_: int,
    step: int,
    clock: SelectionClock,
    calibration,
    curriculum: dict[str, float],
    strengths: dict[str, float],
) -> list[dict]:
    """The PPM's calibration on prompts it had never seen rolled out (Brier, Pearson r) and its
    prior strength per task family, as eval_results rows (task `ppm`: the report, MLflow) and
    gauges; what choosing prompts has cost so far and the curriculum (task `scheduler`)."""
    rows = [
        {"event_id": make_event_id("select_cost", run_id, round_, k), "step": step,
         "task": "scheduler", "metric": k, "value": float(v), "n": clock.rounds}
        for k, v in clock.figures().items() | curriculum.items()
    ]  # fmt: skip
    for window, figures in calibration.figures().items():
        metrics.SCHEDULER_PPM_BRIER.labels(window).set(figures["brier"])
        metrics.SCHEDULER_PPM_PEARSON.labels(window).set(figures["pearson_r"])
        rows += [
            {"event_id": make_event_id("ppm_calibration", run_id, round_, window, k),
             "step": step, "task": "ppm", "metric": f"{k}_{window}",
             "value": float(figures[k]), "n": figures["n_prompts"]}
            for k in ("brier", "pearson_r")
        ]  # fmt: skip
    for family, k in strengths.items():
        metrics.SCHEDULER_PPM_PRIOR_STRENGTH.labels(family).set(k)
        rows.append(
            {"event_id": make_event_id("ppm_prior", run_id, round_, family), "step": step,
             "task": "ppm", "metric": f"prior_strength_{family}", "value": float(k),
             "n": clock.rounds}
        )  # fmt: skip
    return rows
