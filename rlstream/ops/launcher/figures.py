"""The run's summary figures, read back from its topics and stores once it is done: rates,
latencies, the scheduler's cost, Qdrant's view, prompts that joined mid-run."""

from __future__ import annotations

import asyncio
import json

from rlstream.config import Config
from rlstream.connectors.endpoints import Endpoints
from rlstream.connectors.reading import read_rows_where
from rlstream.schemas import get

PROMPTS = get("prompts")
EXPERIENCE_TOPIC = get("experience").topic


async def _run_rows(endpoints: Endpoints, event_name: str, run_id: str) -> list[dict]:
    from rlstream.connectors.reading import read_run_rows

    return await read_run_rows(endpoints, get(event_name).topic, run_id)


def rl_rates(view) -> dict[str, float]:
    """Mean messages/s per topic over the RL phase (first to last sample with experience)."""
    samples = [(t, c) for t, c in view.throughput if c.get(get("experience").topic, 0) > 0]
    if len(samples) < 2:
        return {}
    (t0, c0), (t1, c1) = samples[0], samples[-1]
    return {
        topic.split(".")[1]: round((c1[topic] - c0.get(topic, 0)) / (t1 - t0), 2)
        for topic in c1
        if c1[topic] > c0.get(topic, 0)
    }


def latency(requests: list[dict], experience: list[dict]) -> dict:
    """Request-to-experience latency per group (produced_at of the request to that of the
    first experience row of its group), p50 and p99 in milliseconds."""
    import numpy as np

    asked = {r["request_id"]: r["produced_at"] for r in requests}
    done: dict[str, object] = {}
    for r in experience:
        if r["request_id"] in asked:
            done[r["request_id"]] = min(
                done.get(r["request_id"], r["produced_at"]), r["produced_at"]
            )
    ms = [(t - asked[k]).total_seconds() * 1000 for k, t in done.items()]
    if not ms:
        return {"request_to_experience_p50_ms": None, "request_to_experience_p99_ms": None}
    return {
        "request_to_experience_p50_ms": round(float(np.percentile(ms, 50)), 1),
        "request_to_experience_p99_ms": round(float(np.percentile(ms, 99)), 1),
    }


def scheduler_figures(evals: list[dict]) -> dict:
    """The scheduler's last report (eval_results rows): its PPM's live calibration on prompts
    never rolled out before (task `ppm`) and the time choosing prompts took (task
    `scheduler`), e.g. {"ppm_brier_unseen": 0.12, "scheduler_select_ms_per_round": 210.0}."""
    return {
        f"{r['task']}_{r['metric']}": round(r["value"], 4)
        for r in evals
        if r["task"] in ("ppm", "scheduler")
    }


def time_to_mark(evals: list[dict], share: float = 0.9) -> dict:
    """RL wall clock to the run's own mark: seconds from the evaluation that opened RL (step 0,
    the pre-trained policy) until held-out greedy accuracy first reached the start plus
    `share` of the run's whole gain, interpolated between evaluations; what a sampler that
    picks better prompts shortens, its own compute included. {} without a gain.

    >>> from datetime import datetime, timedelta
    >>> t0 = datetime(2026, 1, 1)
    >>> rows = [{"task": "all", "metric": "greedy", "step": s, "value": v,
    ...          "produced_at": t0 + timedelta(seconds=10 * s)}
    ...         for s, v in [(0, 0.2), (5, 0.6), (10, 0.9), (15, 1.0)]]
    >>> time_to_mark(rows)  # the mark 0.2 + 0.9 x 0.8 = 0.92: a fifth of the way from step 10
    {'rl_s_to_90pct_mark': 110.0, 'rl_step_at_90pct_mark': 11.0, 'mark_accuracy': 0.92}
    """
    greedy = sorted((r for r in evals if r["task"] == "all" and r["metric"] == "greedy"),
                    key=lambda r: (r["step"], r["produced_at"]))  # fmt: skip
    if len(greedy) < 2 or greedy[-1]["value"] <= greedy[0]["value"]:
        return {}
    start, mark = greedy[0], greedy[0]["value"] + share * (greedy[-1]["value"] - greedy[0]["value"])
    prev = start
    for r in greedy[1:]:
        if r["value"] >= mark:
            f = (mark - prev["value"]) / (r["value"] - prev["value"])
            at = prev["produced_at"] + f * (r["produced_at"] - prev["produced_at"])
            return {f"rl_s_to_{round(share * 100)}pct_mark": round(
                        (at - start["produced_at"]).total_seconds(), 1),
                    f"rl_step_at_{round(share * 100)}pct_mark": round(
                        prev["step"] + f * (r["step"] - prev["step"]), 1),
                    "mark_accuracy": round(mark, 4)}  # fmt: skip
        prev = r
    return {}


def selection_compute(summary: dict) -> dict:
    """Scoring's compute against the rollouts' (`trainers/selection/compute.py`: decoded-token
    units, a prefilled token at the ratio the scheduler measured on the policy): the share of
    the run's generation budget that went to choosing prompts. 0 for samplers that read no
    policy.

    >>> selection_compute({"rollout_decoded": 900, "rollout_prefilled": 400,
    ...     "scheduler_select_decoded": 0, "scheduler_select_prefilled": 400,
    ...     "scheduler_prefill_ratio": 0.25})["selection_compute_share"]
    0.1
    """
    ratio = summary.get("scheduler_prefill_ratio") or 0.0
    rollouts = summary.get("rollout_decoded", 0) + ratio * summary.get("rollout_prefilled", 0)
    scoring = summary.get("scheduler_select_decoded", 0) + ratio * summary.get(
        "scheduler_select_prefilled", 0
    )
    return {
        "selection_compute": round(scoring),
        "rollout_compute": round(rollouts),
        "selection_compute_share": round(scoring / rollouts, 4) if rollouts else None,
    }


def qdrant_figures(endpoints: Endpoints, cfg: Config) -> dict:
    """Prompts with outcome statistics in the run's Qdrant collection (the environment state)."""
    from rlstream.connectors.vectors import VectorStore
    from rlstream.streams.environment_state import collection_name

    store = VectorStore.open(endpoints, collection_name(cfg.run_id), 0, create=False)
    try:
        return {"qdrant_prompts": store.count() if store.exists() else 0}
    finally:
        store.close()


def collect(endpoints: Endpoints, cfg: Config) -> dict:
    """The run's figures: the trainer's summary, and experience published vs archived."""

    from rlstream.connectors.objectstore import ObjectStore

    store = ObjectStore(endpoints)
    name = f"{cfg.run_id}/reports/trainer.json"
    trainer = json.loads(store.get_bytes(name)) if store.exists(name) else {}
    published = asyncio.run(_run_rows(endpoints, "experience", cfg.run_id))
    archive = store.read_parquet_prefix(f"{cfg.run_id}/experience/")
    archived = archive.column("event_id").to_pylist() if archive.num_rows else []
    published_ids = {r["event_id"] for r in published}
    rows = {r["event_id"]: r for r in published}.values()
    figures_tokens = {  # what the rollouts cost (selection_compute charges scoring against it)
        "rollout_decoded": sum(len(r["completion_tokens"]) for r in rows),
        "rollout_prefilled": sum(len(r["prompt_tokens"]) for r in rows),
    }
    requests = asyncio.run(_run_rows(endpoints, "rollout_requests", cfg.run_id))
    prompts = asyncio.run(
        read_rows_where(endpoints, PROMPTS.topic, lambda r: r["dataset"] == cfg.data.dataset)
    )
    ppm = cfg.selection.sampler == "ppm"
    figures = {"run_id": cfg.run_id, "sampler": cfg.selection.sampler,
               "ppm_features": cfg.ppm_feature_spec() if ppm else None, **trainer}  # fmt: skip
    from rlstream.connectors.kafka import log_start_offsets

    # records the broker has dropped (Kafka's retention on a long run): the archive must still
    # hold what the topic holds; the rest of it is what retention took
    dropped = any((asyncio.run(log_start_offsets(endpoints, EXPERIENCE_TOPIC))).values())
    matches = published_ids <= set(archived) if dropped else set(archived) == published_ids
    figures |= {
        "experience_published": len(published_ids),
        "experience_messages_redelivered": len(published) - len(published_ids),
        "experience_archived": len(archived),
        "archive_duplicates": len(archived) - len(set(archived)),
        "archive_matches_topic": matches,
        "experience_dropped_by_broker": dropped,
    }
    figures |= figures_tokens
    figures |= latency(requests, published) | joined_mid_run(prompts, requests, cfg)
    return figures | qdrant_figures(endpoints, cfg)


def joined_mid_run(prompts: list[dict], requests: list[dict], cfg: Config) -> dict:
    """Train prompts of the dataset published after the run's first rollout request: how many,
    how many were requested since, and publish -> first request latency (p50, max; ms)."""
    import numpy as np

    from rlstream.trainers.datasets import prompt_problem, split_of_row
    from rlstream.trainers.lm import load_tokenizer

    if not requests:
        return {}
    tok, room = load_tokenizer(cfg.model), cfg.model.block_size - cfg.rl.max_new_tokens
    start = min(r["produced_at"] for r in requests)
    first: dict[str, object] = {}
    for r in requests:
        if r["prompt_id"] not in first or r["produced_at"] < first[r["prompt_id"]]:
            first[r["prompt_id"]] = r["produced_at"]
    late = {}
    for p in prompts:
        if p["produced_at"] <= start or split_of_row(p, cfg.data.heldout_frac) != "train":
            continue
        if not prompt_problem(p, tok, room):  # refused ones are dead letters, not late prompts
            late.setdefault(p["prompt_id"], p["produced_at"])
    waits = [
        (first[pid] - at).total_seconds() * 1000
        for pid, at in late.items()
        if pid in first and first[pid] >= at
    ]
    out = {"prompts_published_mid_run": len(late), "mid_run_prompts_requested": len(waits)}
    if waits:
        out["publish_to_first_request_p50_ms"] = round(float(np.percentile(waits, 50)), 1)
        out["publish_to_first_request_max_ms"] = round(max(waits), 1)
    return out
