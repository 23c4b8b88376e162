"""mirror_eval: a candidate policy evaluated on a mirror of a live run's request stream.

    rlstream mirror RUN --candidate 12 --name lr-sweep-a      (a stored version of the run)
    rlstream mirror RUN --candidate /path/to/exported-policy   (an export, or s3://... URI)

The design note's control layer "mirrors traffic for model evaluation": the mirror reads
rl.rollout_requests.v1 in a consumer group of its own (`rlstream-<run>-mirror-<name>`), beside
the rollout workers' group, from the live edge. Kafka gives each group every message, so the
mirror sees each prompt the run spends rollouts on while the workers' offsets, and so the
training loop, are untouched: it writes nothing the loop reads. Each mirrored prompt is solved
greedily by the candidate and by the policy serving the run at that moment (the newest
announced version, followed as a rollout worker does), both graded by the prompt's verifier, so
the comparison is paired on the same live prompts. Every `report_every` prompts the running
figures go to rl.eval_results.v1 under the task `mirror:<name>` (metrics `candidate_greedy`,
`serving_greedy`, `candidate_minus_serving`; step = the serving version), where the run's
report, MLflow and `rlstream tail` see them beside the trainer's own evaluations.
"""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass, field
from pathlib import Path

from rlstream.config import Config
from rlstream.connectors.endpoints import Endpoints
from rlstream.connectors.kafka import EventProducer, consumer
from rlstream.connectors.objectstore import ObjectStore, stored_versions
from rlstream.schemas import DecodeError, decode, get, rows_to_batch
from rlstream.streams.policystore import PolicyFollower, fetch_policy
from rlstream.trainers.datasets import prompt_of_row
from rlstream.trainers.policy import Policy, load_policy

log = logging.getLogger(__name__)
REQUESTS, EVAL = get("rollout_requests"), get("eval_results")


class MirrorError(ValueError):
    """A candidate that cannot be found or loaded (one line for the user)."""


def load_candidate(store: ObjectStore, run_id: str, candidate: str) -> Policy:
    """A stored version of the run (a number), an exported directory, or an s3:// URI."""
    if candidate.isdigit():
        versions = stored_versions(store, run_id)
        if int(candidate) not in versions:
            kept = ", ".join(map(str, sorted(versions))) or "none"
            raise MirrorError(f"--candidate {candidate}: run {run_id!r} has no stored policy "
                              f"version {candidate} (stored: {kept})")  # fmt: skip
        return fetch_policy(store, versions[int(candidate)])
    if candidate.startswith(("s3://", "file://")):
        return fetch_policy(store, candidate)
    if not Path(candidate).is_dir():
        raise MirrorError(f"--candidate {candidate!r}: a stored version number, an exported "
                          "policy directory or an s3:// URI")  # fmt: skip
    return load_policy(candidate)


@dataclass
class Tally:
    """Paired greedy outcomes on the mirrored prompts."""

    candidate: list[float] = field(default_factory=list)
    serving: list[float] = field(default_factory=list)
    serving_versions: set[int] = field(default_factory=set)

    def figures(self) -> dict:
        n = len(self.candidate)
        cand, serv = sum(self.candidate) / max(1, n), sum(self.serving) / max(1, n)
        return {"mirrored_prompts": n, "candidate_greedy": round(cand, 4),
                "serving_greedy": round(serv, 4), "candidate_minus_serving": round(cand - serv, 4),
                "serving_versions": sorted(self.serving_versions)}  # fmt: skip


def solve(policy: Policy, prompts: list, cfg: Config) -> list[float]:
    from rlstream.trainers.evaluate import solved

    return solved(policy.model, policy.tok, prompts, 1, cfg.rl.max_new_tokens, 0, None, cfg.env)


async def mirror(cfg: Config, endpoints: Endpoints, candidate: Policy, name: str,
                 prompts: int, report_every: int = 16, timeout_s: float = 600.0,
                 say=print) -> dict:  # fmt: skip
    """Mirror up to `prompts` requests of the run (or until `timeout_s`); the paired figures."""
    tally, serving = Tally(), PolicyFollower(endpoints, cfg.run_id, role="mirror")
    follow = asyncio.create_task(serving.run())
    c = consumer(endpoints, REQUESTS.topic, group_id=cfg.group(f"mirror-{name}"),
                 auto_offset_reset="latest")  # fmt: skip
    await c.start()
    started = last_said = time.monotonic()
    try:
        async with EventProducer(endpoints) as producer:
            await serving.ready.wait()
            reported = 0
            while len(tally.candidate) < prompts and time.monotonic() - started < timeout_s:
                rows = []
                for records in (await c.getmany(timeout_ms=500, max_records=8)).values():
                    for record in records:
                        try:
                            batch = decode(record.value, record.headers, expect=(REQUESTS.name,))
                        except DecodeError:
                            continue  # the workers' group dead-letters it; a mirror only reads
                        rows += [r for r in batch.to_pylist() if r["run_id"] == cfg.run_id]
                if rows:
                    await asyncio.to_thread(_judge, rows[: prompts - len(tally.candidate)],
                                            candidate, serving.policy, cfg, tally)  # fmt: skip
                    await c.commit()
                due = len(tally.candidate) - reported >= report_every
                if due:
                    reported = len(tally.candidate)
                    await _report(producer, cfg, name, tally, serving.policy.version)
                if due or time.monotonic() - last_said > 5:  # a line a report, or every 5 s
                    last_said = time.monotonic()
                    f = tally.figures()
                    say(f"mirror {name}: {f['mirrored_prompts']}/{prompts} prompts, candidate "
                        f"{f['candidate_greedy']:.3f} vs serving "
                        f"{f['serving_greedy']:.3f}")  # fmt: skip
            if len(tally.candidate) > reported:
                await _report(producer, cfg, name, tally, serving.policy.version)
    finally:
        follow.cancel()
        await c.stop()
    return tally.figures() | {"name": name, "candidate_version": candidate.version}


def _judge(rows: list[dict], candidate: Policy, serving: Policy, cfg: Config, tally: Tally):
    prompts = [prompt_of_row(r) for r in rows]
    tally.candidate += solve(candidate, prompts, cfg)
    tally.serving += solve(serving, prompts, cfg)
    tally.serving_versions.add(serving.version)


async def _report(producer: EventProducer, cfg: Config, name: str, tally: Tally, version: int):
    f = tally.figures()
    metrics = ("candidate_greedy", "serving_greedy", "candidate_minus_serving")
    rows = [{"step": version, "task": f"mirror:{name}", "metric": metric, "value": f[metric],
             "n": f["mirrored_prompts"]} for metric in metrics]  # fmt: skip
    await producer.send(EVAL, rows_to_batch(EVAL, rows, run_id=cfg.run_id, policy_version=version))
