"""The chaos suite's figures: recovery per fault kind, the table it prints, repeats combined,
and the mean time between failures the runs bound (a binomial upper bound)."""

from __future__ import annotations

import numpy as np


def unrecovered(f) -> bool:
    """Injected, and the loop never trained again while the run went on."""
    return bool(f.injected) and f.recovered is None and not f.detail.get("run_ended_first")


def survived(r: dict) -> bool:
    """The run's verdict: every fault recovered, nothing lost or trained twice, no request
    issued twice, the archive equal to what was published, and the run complete (or, until
    faults, stopped cleanly once they were over)."""
    ended = r["stopped_cleanly"] if r.get("until") == "faults" else r["completed"]
    return bool(
        ended and r["unrecovered_faults"] == 0 and r["experience_lost"] == 0
        and r["trained_twice"] == 0 and r["archive_matches_published"]
        and not r.get("requests_reissued")
    )  # fmt: skip


def _pct(values: list[float], q: float) -> float | None:
    return round(float(np.percentile(values, q)), 2) if values else None


def table(result: dict) -> str:
    """The fault log and the verdict as Markdown tables."""
    lines = ["| # | fault | target | step | at (s) | recovery (s) | after lifted (s) | note |",
             "|---|---|---|---|---|---|---|---|"]  # fmt: skip
    for i, f in enumerate(result["fault_log"], 1):
        shown = ("kind", "target", "step", "at_s", "recovery_s", "after_lifted_s")
        note = ", ".join(f"{k} {v}" for k, v in f.items() if k not in shown)
        lines.append(f"| {i} | {f['kind']} | {f['target']} | {f['step']} | {f['at_s']} | "
                     f"{f['recovery_s']} | {f['after_lifted_s']} | {note} |")  # fmt: skip
    keys = ("faults", "fault_kinds", "unrecovered_faults", "recovery_p50_s", "recovery_p99_s",
            "requests", "requests_reissued", "groups_by_outcome", "experience_lost",
            "trained_twice", "incomplete_groups", "archive_matches_published", "until",
            "completed", "stopped_cleanly", "stop_s", "rl_steps", "restarts", "final_accuracy",
            "drain_s", "wall_s", "survived")  # fmt: skip
    lines += ["", "| figure | value |", "|---|---|"]
    lines += [f"| {k} | {result.get(k)} |" for k in keys]
    return "\n".join(lines)


def combine(results: list[dict]) -> dict:
    """The figures of one or several chaos runs: counts summed, kinds joined, recovery
    percentiles over every fault of every run, each run kept under `runs`."""
    recoveries = [f["recovery_s"] for r in results for f in r["fault_log"]
                  if f["recovery_s"] is not None]  # fmt: skip
    return {
        "faults": sum(r["faults"] for r in results),
        "fault_kinds": sorted({k for r in results for k in r["fault_kinds"]}),
        "unrecovered_faults": sum(r["unrecovered_faults"] for r in results),
        "experience_lost": sum(r["experience_lost"] for r in results),
        "trained_twice": sum(r["trained_twice"] for r in results),
        "archive_matches_published": all(r["archive_matches_published"] for r in results),
        "completed": all(r["completed"] for r in results),
        "recovery_p50_s": _pct(recoveries, 50),
        "recovery_p99_s": _pct(recoveries, 99),
        "survived": all(r["survived"] for r in results),
        "runs": results,
    }


def mtbf(results: list[dict], fault_rate_per_h: float) -> dict:
    """An MTBF bound from chaos runs. With k of n injected faults not survived (a run that
    failed its audit counts its unrecovered faults, at least one), the chance that a fault is
    not survived is at most p, the exact one-sided 95% (Clopper-Pearson) upper bound: about
    3/n when k = 0 (the rule of three). At `fault_rate_per_h` process faults an hour in
    production, failures come at most p x rate an hour, so MTBF >= 1 / (p x rate)."""
    n = sum(r["faults"] for r in results)
    k = sum(0 if r["survived"] else max(1, r["unrecovered_faults"]) for r in results)
    if n == 0:
        return {"faults_total": 0}
    p = binomial_upper_bound(k, n)
    return {
        "faults_total": n,
        "faults_not_survived": k,
        "p_not_survived_95": round(p, 4),
        "assumed_faults_per_h": fault_rate_per_h,
        "mtbf_lower_bound_h": round(1 / (p * fault_rate_per_h), 1),
    }


def binomial_upper_bound(k: int, n: int, confidence: float = 0.95) -> float:
    """The p at which seeing k or fewer in n has probability 1 - confidence (bisection)."""
    from math import comb

    def cdf(p: float) -> float:
        return sum(comb(n, i) * p**i * (1 - p) ** (n - i) for i in range(k + 1))

    if k >= n:
        return 1.0
    lo, hi = 0.0, 1.0
    for _ in range(60):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if cdf(mid) > 1 - confidence else (lo, mid)
    return hi
