"""generate_rollouts: rollout workers in one consumer group turn requests into G completions.

    python -m rlstream.streams.rollout_worker --config config.json --worker-id w1

Every worker follows rl.policy_versions.v1 on its own (no group) and generates with the newest
weights; the request stream is shared by the group, so adding a worker needs no configuration.
Requests that arrive together are sampled in one batch; each group's G rollouts share a key,
so a group never spans messages.
"""

from __future__ import annotations

import argparse
import logging
import os
import socket
import sys
import zlib
from collections import Counter
from pathlib import Path

import faust
import torch

from rlstream import metrics, sandbox
from rlstream.config import Config
from rlstream.connectors.endpoints import Endpoints
from rlstream.schemas import DecodeError, get, rows_to_batch
from rlstream.streams.app import Glue, Worker, make_app, raw_topic
from rlstream.streams.policystore import PolicyFollower
from rlstream.trainers.datasets import prompt_of_row, text_problem
from rlstream.trainers.experience import MAX_GROUP_SIZE
from rlstream.trainers.policy import Policy, rollout

REQUESTS, ROLLOUTS = get("rollout_requests"), get("rollouts")
log = logging.getLogger(__name__)


class Unservable(DecodeError):
    """A rollout request that decodes but cannot be sampled (it would crash or stall the worker
    on every redelivery)."""

    kind = "unservable_request"


def request_problem(request: dict, tok, cfg: Config) -> str | None:
    """Why this worker cannot sample the request, or None (pure)."""
    g = request["group_size"]
    if not 1 <= g <= MAX_GROUP_SIZE:
        return f"group_size {g} is outside 1..{MAX_GROUP_SIZE}"
    return text_problem(request["text"], tok, cfg.model.block_size - cfg.rl.max_new_tokens)


def rollout_rows(
    requests: list[dict],
    policy: Policy,
    cfg: Config,
    worker_id: str,
    generator: torch.Generator,
) -> list[dict]:
    """G completions for each request (pure apart from the model's sampling)."""
    prompts = [prompt_of_row(r) for r in requests]
    G = requests[0]["group_size"]
    s = rollout(policy, prompts, G, cfg.rl.max_new_tokens, cfg.rl.temperature, generator, cfg.env)
    rows = []
    for k, i in enumerate(s.prompt_index):
        req = requests[i]
        episode = s.episodes[k] if s.episodes and s.episodes[k].env is not None else None
        rows.append(
            episode_columns(episode)
            | {
                "run_id": req["run_id"],
                "policy_version": policy.version,
                "request_id": req["request_id"],
                "prompt_id": req["prompt_id"],
                "sample_idx": k - i * G,
                "group_size": G,
                "task": req["task"],
                "prompt_text": req["text"],
                "difficulty": req.get("difficulty"),
                "answer": req.get("answer"),
                "prompt_tokens": s.prompt_tokens[k],
                "completion": s.texts[k],
                "completion_tokens": s.tokens[k],
                "logprobs": s.logprobs[k],
                "finish_reason": s.finish_reasons[k],
                "worker_id": worker_id,
                "verifier": req.get("verifier"),
                "metadata": req.get("metadata"),
            }
        )
    return rows


def episode_columns(e) -> dict:
    """A multi-turn episode's own columns of its rollouts row (none for a single turn)."""
    if e is None:
        return {}
    return {
        "environment": e.prompt.environment,
        "loss_mask": e.loss_mask,
        "turn_rewards": e.turn_rewards,
        "turns": e.turns,
        "stop_reason": e.stop_reason,
        "env_error": str(e.error) if e.error else None,
        "env_spans": e.env_spans,
        "episode_reward": 0.0 if e.error else e.reward,
        "tool_calls": e.tool_calls,
        "env_s": round(e.env_s, 4),
    }


def count_episodes(rows: list[dict]) -> None:
    """The environment metrics of the episodes among `rows`."""
    for r in rows:
        env = r.get("environment")
        if not env:
            continue
        metrics.ENV_STEPS.labels(env).inc(r["turns"] + 1)
        metrics.ENV_WAIT_SECONDS.labels(env).inc(r["env_s"])
        metrics.ENV_EPISODES.labels(env, r["stop_reason"]).inc()
        metrics.ENV_TURNS.labels(env).inc(r["turns"])
        metrics.ENV_TOOL_CALLS.labels(env).inc(r["tool_calls"])
        if r["env_error"]:
            metrics.ENV_ERRORS.labels(env, r["env_error"].partition(":")[0]).inc()


def build(cfg: Config, endpoints: Endpoints, worker_id: str) -> faust.App:
    app = make_app(cfg.group("rollout-workers"), endpoints)
    glue = Glue(app, consumer_name=f"{cfg.group('rollout-workers')}/{worker_id}", run_id=cfg.run_id)
    follower = PolicyFollower(endpoints, cfg.run_id)
    generator = torch.Generator().manual_seed(
        cfg.seed * 1000 + zlib.crc32(worker_id.encode()) % 1000
    )

    @app.task
    async def follow_policies():
        await follower.run()

    @app.agent(raw_topic(app, REQUESTS.topic), name="generate_rollouts")
    async def generate_rollouts(stream):
        # Messages that arrive together are sampled together: bigger batches, fewer token steps
        # per completion. take_events acks a batch only after this loop has handled it.
        async for events in stream.take_events(8, within=0.05):
            requests = []
            for event in events:
                decoded = await glue.decode(event, expect=("rollout_requests",))
                if decoded is None:
                    continue
                rows = [
                    (i, r) for i, r in enumerate(decoded.to_pylist()) if r["run_id"] == cfg.run_id
                ]
                if rows:
                    await follower.wait_ready()
                for i, row in rows:
                    problem = request_problem(row, follower.policy.tok, cfg)
                    if problem is None:
                        requests.append(row)
                    else:
                        await glue.reject(event, Unservable(f"{row['request_id']}: {problem}"), i)
            if requests:
                await generate(requests)
            for event in events:  # handled: take_events acks them (a skipped one stays unacked)
                event.processed = True

    async def generate(requests: list[dict]) -> None:
        policy = follower.policy  # one policy for the whole batch, even if a new one lands
        by_size: dict[int, list[dict]] = {}
        for request in requests:
            by_size.setdefault(request["group_size"], []).append(request)
        for same_size in by_size.values():
            rows = rollout_rows(same_size, policy, cfg, worker_id, generator)
            for task, n in Counter(r["task"] for r in rows).items():
                metrics.ROLLOUTS_GENERATED.labels(task).inc(n)
            count_episodes(rows)
            batch = rows_to_batch(ROLLOUTS, rows, run_id=cfg.run_id, policy_version=policy.version)
            await glue.emit(ROLLOUTS, batch)  # split by key: a group never spans messages

    return app


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--config", required=True, type=Path)
    # distinct per replica: it seeds the worker's sampling (a container's pid is the same in all)
    parser.add_argument("--worker-id", default=f"{socket.gethostname()}-{os.getpid()}")
    args = parser.parse_args(argv)
    cfg = Config.read(args.config)
    sandbox.configure(cfg.sandbox)  # the python environment's tool calls run there
    torch.set_num_threads(cfg.threads(streaming=True))
    app = build(cfg, Endpoints.from_env(), args.worker_id)
    metrics.serve_from_env()
    sys.argv = sys.argv[:1]
    loglevel = os.environ.get("RLSTREAM_LOGLEVEL", "WARNING")  # INFO: rebalances, recoveries
    Worker(app, loglevel=loglevel, quiet=True).execute_from_commandline()


if __name__ == "__main__":
    main()
