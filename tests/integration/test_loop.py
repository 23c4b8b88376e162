"""The whole streaming loop (`rlstream run`) on the real broker, S3 server and local Qdrant,
with two rollout workers, for a few RL steps, selecting prompts with the PPM sampler (its
default reads no answer: MiniLM embeddings, the policy's hidden state at the prompt, history,
and neighbourhood pass rates read back from the run's Qdrant collection)."""

from __future__ import annotations

import asyncio
import json
import re
from collections import Counter, defaultdict

import pytest
import yaml

from rlstream.config.selection import FORMAT_TUNING
from rlstream.connectors.endpoints import Endpoints
from rlstream.connectors.objectstore import ObjectStore
from rlstream.ops.launcher.figures import _run_rows
from rlstream.streams.policystore import stored_versions
from rlstream.trainers.selection.trust import STRENGTH_GRID
from tests.integration.conftest import cli

pytestmark = pytest.mark.integration
G, P, STEPS = 4, 8, 4
SMALL = [
    "--set",
    "pretrain.max_steps=60",
    "--set",
    "pretrain.batch=32",  # a quarter of the default: pre-training took 11 s of a 50 s run
    "--set",
    "pretrain.warmup_steps=20",
    "--set",
    "corpus_docs=3000",
    "--set",
    "pool_size=500",
    "--set",
    "eval.prompts=32",
    "--set",
    "eval.interval=2",
    "--set",
    f"prompts_per_step={P}",
    "--set",
    f"group_size={G}",
    "--set",
    "target_in_flight=16",
]


GARBAGE = b"\x00not an arrow stream (loop-it)"


async def _publish_garbage(topics: list[str]) -> None:
    """One undecodable message on each topic (no rlstream code on the producing side)."""
    from aiokafka import AIOKafkaProducer

    producer = AIOKafkaProducer(bootstrap_servers=Endpoints.from_env().kafka_bootstrap)
    await producer.start()
    try:
        for topic in topics:
            await producer.send_and_wait(topic, GARBAGE, key=b"garbage", partition=0)
    finally:
        await producer.stop()


POISON = [  # decodable experience of the run that must never be trained on
    {"reward": float("nan")},
    {"completion_tokens": [1, 10**6], "logprobs": [-0.1, -0.2]},
]


async def _publish_poison(run_id: str) -> None:
    """Experience rows of this run that decode but cannot be trained on, and a request that
    cannot be sampled: the trainer and the workers must dead-letter them, not train on them or
    crash on every redelivery."""
    from rlstream.connectors.kafka import EventProducer
    from rlstream.schemas import get, rows_to_batch

    base = {"event_id": "poison-0", "request_id": "poison", "prompt_id": "poison",
            "sample_idx": 0, "task": "add", "prompt_tokens": [5, 6], "completion_tokens": [7],
            "logprobs": [-0.5], "reward": 1.0, "correct": True}  # fmt: skip
    rows = [
        base | {"event_id": f"poison-{i}", "sample_idx": i} | bad for i, bad in enumerate(POISON)
    ]
    request = {"request_id": "poison-req", "prompt_id": "poison", "text": "1+1=", "task": "add",
               "group_size": 10**6, "sampler": "fuzz"}  # fmt: skip
    async with EventProducer(Endpoints.from_env()) as producer:
        event = get("experience")
        await producer.send(event, rows_to_batch(event, rows, run_id=run_id, policy_version=0))
        event = get("rollout_requests")  # a request no worker can sample (10^6 completions)
        await producer.send(event, rows_to_batch(event, [request], run_id=run_id))


@pytest.fixture(scope="module")
def loop_run(stack_home, tmp_path_factory):
    from rlstream.schemas import get

    out = tmp_path_factory.mktemp("runs")
    summary = out / "summary.json"
    # every consumer of these topics reads them from the start: each must dead-letter this
    asyncio.run(_publish_garbage([get("rewards").topic, get("experience").topic]))
    result = cli(
        "run",
        "--rl-steps",
        str(STEPS),
        "--workers",
        "2",
        "--run-id",
        "loop-it",
        "--sampler",
        "ppm",
        "--out",
        str(out),
        "--summary",
        str(summary),
        *SMALL,
        "--set",
        "checkpoint.keep_policies=2",  # the object store keeps the newest 2 policy versions,
        "--set",
        "checkpoint.keep_policy_every=3",  # version 0 and every 3rd
        timeout=900,
    )
    return json.loads(summary.read_text()), out, result


def _rows_of(run_id: str, event: str) -> list[dict]:
    return asyncio.run(_run_rows(Endpoints.from_env(), event, run_id))


def _rows(event: str) -> list[dict]:
    return _rows_of("loop-it", event)


def test_the_loop_completes_and_reports(loop_run):
    figures, out, result = loop_run
    assert figures["completed"] and figures["rl_steps"] == STEPS
    assert f"report: {figures['report']}" in result.stdout.replace("\n", "")
    # no terminal (captured): plain progress lines as it goes, through pre-training and RL
    progress = [line for line in result.stdout.splitlines() if "| run loop-it | phase" in line]
    assert any("phase pretrain" in line for line in progress), result.stdout[-2000:]
    assert any(f"rl step {STEPS}/{STEPS}" in line for line in progress)
    assert (out / "loop-it" / "curves.png").stat().st_size > 10_000
    for key in (
        "final_accuracy",
        "experience_published",
        "experience_archived",
        "experience_trained",
        "duplicates_trained",
        "stale_dropped",
        "trainer_idle_share",
        "wall_s",
    ):
        assert key in figures, key
    assert figures["experience_trained"] == STEPS * P * G - figures["stale_dropped"] * G
    assert sum(figures["policy_lag_histogram"].values()) == figures["groups_consumed"]
    assert 0 < figures["request_to_experience_p50_ms"] <= figures["request_to_experience_p99_ms"]
    # what a soak run is judged by: each process's memory (and the local broker's and S3
    # server's) over the RL phase, and every checkpoint's size (pre-training's last, step 0;
    # the final one)
    memory = figures["rss_mb_end"]
    assert {"trainer", "scheduler", "processors", "broker", "s3"} <= set(memory), memory
    assert all(mib > 10 for mib in memory.values())
    sizes = dict(figures["checkpoint_sizes"])
    assert {0, STEPS} <= set(sizes) and min(sizes.values()) > 100_000
    assert figures["checkpoint_bytes_end"] == sizes[STEPS]
    assert "| trainer |" in (out / "loop-it" / "report.md").read_text()
    # the policy versions stored are bounded: every version was announced, the pruned ones
    # were deleted as newer ones were published
    announced = {r["version"] for r in _rows("policy_versions")}
    assert announced == set(range(STEPS + 1))  # version 0 is the pre-trained policy
    kept = stored_versions(ObjectStore(Endpoints.from_env()), "loop-it")
    assert set(kept) == {0, 3, STEPS - 1, STEPS}, sorted(kept)
    # Prometheus can scrape the run: one file_sd target per process, where metrics.json says
    served = json.loads((out / "loop-it" / "metrics.json").read_text())
    targets = json.loads((out / "loop-it" / "prometheus-targets.json").read_text())
    assert {t["labels"]["process"] for t in targets} == set(served)
    for t in targets:
        assert t["labels"]["job"] == "rlstream" and t["labels"]["run_id"] == "loop-it"
        assert served[t["labels"]["process"]] == f"http://{t['targets'][0]}/metrics"


def test_undecodable_messages_are_dead_lettered_by_every_consumer(loop_run):
    """The scheduler (rewards), the processors (rewards) and the trainer (experience) each
    record the message they could not decode, with the run's id, and the loop went on."""
    figures, _, _ = loop_run
    letters = [r for r in _rows("dead_letters") if r["raw_value"] == GARBAGE]
    found = {(r["consumer"], r["source_topic"]) for r in letters}
    assert found >= {
        ("rlstream-loop-it-scheduler", "rl.rewards.v1"),
        ("rlstream-loop-it-processors", "rl.rewards.v1"),
        ("rlstream-loop-it-trainer", "rl.experience.v2"),
    }, found
    assert all(r["error_kind"] and r["reason"] for r in letters)
    assert figures["completed"]


def test_no_artifact_of_the_run_holds_the_s3_secret(loop_run):
    """Logs, reports, summaries, configs, plots and metrics files: none carries the S3 key."""
    _, out, result = loop_run
    secret = Endpoints.from_env().s3_secret_key.encode()
    files = [p for p in out.rglob("*") if p.is_file()]
    assert len(files) >= 8 and any(p.suffix == ".log" for p in files)
    leaking = [str(p) for p in files if secret in p.read_bytes()]
    assert not leaking
    assert secret.decode() not in result.stdout + result.stderr


def test_environment_state_is_in_qdrant(loop_run):
    from rlstream.connectors.vectors import VectorStore
    from rlstream.streams.environment_state import collection_name

    figures, _, _ = loop_run
    assert figures["qdrant_prompts"] > 0
    store = VectorStore.open(Endpoints.from_env(), collection_name("loop-it"), 0, create=False)
    try:
        points = store.scroll_all()
    finally:
        store.close()
    assert len(points) == figures["qdrant_prompts"]
    for point in points:
        stats = point.payload
        assert stats["attempts"] % G == 0 and 0 <= stats["successes"] <= stats["attempts"]
        assert stats["pass_rate"] == stats["successes"] / stats["attempts"]


def test_every_request_yields_g_rollouts_g_rewards_and_one_group(loop_run):
    requests = {r["request_id"] for r in _rows("rollout_requests")}
    rollouts, rewards = _rows("rollouts"), _rows("rewards")
    experience = _rows("experience")
    per_request = defaultdict(set)
    for r in rollouts:
        per_request[r["request_id"]].add(r["sample_idx"])
    assert set(per_request) <= requests
    assert all(samples == set(range(G)) for samples in per_request.values())
    rewarded = Counter(
        r["request_id"] for r in {(x["request_id"], x["sample_idx"]): x for x in rewards}.values()
    )
    assert all(n == G for n in rewarded.values()) and set(rewarded) <= set(per_request)
    groups = Counter(r["request_id"] for r in {r["event_id"]: r for r in experience}.values())
    assert all(n == G for n in groups.values())
    assert len(groups) >= STEPS * P  # every update had its groups
    assert set(groups) <= set(rewarded)


def test_archive_holds_exactly_the_published_experience(loop_run):
    figures, _, _ = loop_run
    assert figures["archive_matches_topic"] is True
    assert figures["archive_duplicates"] == 0 and figures["duplicates_trained"] == 0
    assert figures["experience_archived"] == figures["experience_published"] > 0


def test_policy_versions_advance_and_both_workers_use_them(loop_run):
    versions = [r["version"] for r in _rows("policy_versions")]
    assert max(versions) >= STEPS
    rollouts = _rows("rollouts")
    assert {r["worker_id"] for r in rollouts} == {"w1", "w2"}  # two workers shared the load
    assert len({r["policy_version"] for r in rollouts}) >= 2  # workers picked up new weights


def test_filtering_zero_variance_groups_trains_only_informative_ones(stack_home, tmp_path):
    # DAPO's dynamic sampling, streamed: dropped groups count as consumed and get refilled;
    # on chain-of-thought prompts, whose rewards come from the final <answer> tag alone, with
    # the PPM sampler (the filter works under any)
    from rlstream.trainers.envs import Prompt, verify

    summary = tmp_path / "summary.json"
    asyncio.run(_publish_poison("loop-filter"))  # and rows it must refuse, not train on
    cli(
        "run",
        "--rl-steps",
        str(STEPS),
        "--sampler",
        "ppm",
        "--run-id",
        "loop-filter",
        "--out",
        str(tmp_path),
        "--summary",
        str(summary),
        *SMALL,
        "--set",
        "filter_zero_variance=true",
        "--set",
        "filter_max_rounds=2",
        "--format",
        "cot",
        timeout=900,
    )
    figures = json.loads(summary.read_text())
    # --format cot alone makes room for a worked solution (it was 32 tokens of context)
    run_cfg = yaml.safe_load((tmp_path / "loop-filter" / "config.yaml").read_text())
    assert (run_cfg["model"]["block_size"], run_cfg["rl"]["max_new_tokens"]) == (96, 64)
    requests = {r["request_id"]: r for r in _rows_of("loop-filter", "rollout_requests")
                if r["request_id"] != "poison-req"}  # fmt: skip
    assert {r["verifier"] for r in requests.values()} == {"cot:add", "cot:sub"}
    completions = {(r["request_id"], r["sample_idx"]): r["completion"]
                   for r in _rows_of("loop-filter", "rollouts")}  # fmt: skip
    rewards = [r for r in _rows_of("loop-filter", "rewards") if r["request_id"] in requests]
    assert rewards
    for r in rewards:
        q = requests[r["request_id"]]
        prompt = Prompt(q["prompt_id"], q["text"], q["task"], 0, q["answer"], q["verifier"])
        assert r["correct"] == verify(completions[(r["request_id"], r["sample_idx"])], prompt)
    assert figures["completed"] and figures["rl_steps"] == STEPS
    # on chain-of-thought data the default PPM reads the policy's greedy solution's confidence
    assert figures["ppm_features"] == "confidence"
    log = (tmp_path / "loop-filter" / "logs" / "scheduler.log").read_text()
    assert "PPM features confidence" in log and "loaded policy version" in log
    # and screens for informative prompts as chain-of-thought data is tuned to
    # (policy_features.FORMAT_TUNING, through the same build_sampler as the benchmark)
    tuning = FORMAT_TUNING["cot"]
    assert (
        f"128 candidates scored a round, up to {max(128, min(500, tuning['candidate_max']))} "
        "while "
        f"informative ones are scarce; a shortfall filled by {tuning['fill']}"
    ) in log
    assert f"explore share {tuning['explore_share']:g}" in log
    # its first picks follow the policy's confidence before any outcome (selection.ppm_zero_shot)
    assert "the PPM starts from its features' own pass-rate estimate (zero-shot)" in log
    assert figures["scheduler_candidates_per_round"] >= 128
    # this barely pre-trained policy gets most prompts all wrong: the filter drops groups, up
    # to its cap of 2 rounds x P per batch, and then lets zero-variance groups fill the batch
    assert 0 < figures["filtered_groups"] <= STEPS * 2 * P
    trained_groups = figures["experience_trained"] // G + figures["stale_dropped"]
    assert trained_groups == STEPS * P  # every update still had a full batch
    assert figures["groups_consumed"] == trained_groups + figures["filtered_groups"]
    zero = round(figures["zero_variance_share"] * figures["groups_consumed"])
    assert zero >= figures["filtered_groups"]
    poisoned = [r for r in _rows_of("loop-filter", "dead_letters")
                if r["error_kind"] == "untrainable_row"]  # fmt: skip
    reasons = sorted(r["reason"] for r in poisoned)
    assert len(reasons) == 2 and figures["untrainable_rows"] == 2, reasons
    assert "poison-0: reward nan is not finite" in reasons[0]
    assert "poison-1: token id 1000000 is outside the vocabulary" in reasons[1]
    refused = [r["reason"] for r in _rows_of("loop-filter", "dead_letters")
               if r["error_kind"] == "unservable_request"]  # fmt: skip
    assert refused and all("poison-req: group_size 1000000 is outside" in r for r in refused)
    assert figures["restarts"] == {}  # nothing crashed on them


def test_ppo_hybrid_reward_rules_a_trained_bpe_and_a_warm_ppm_reach_the_live_loop(
    loop_run, tmp_path
):
    # the JSON rules (the verifier plus half a point for an all-digit answer) are what
    # score_rollouts applies, so they are what the trainer receives; PPO trains its value head
    # and hybrid mode mixes pre-training loss into every update, all through `rlstream run`;
    # the preset's tokenizer is a byte-level BPE the run trains on its data once, which every
    # process loads and every policy version carries
    from rlstream.trainers.lm import Tokenizer

    rules = tmp_path / "rules.json"
    rules.write_text(
        json.dumps(
            {
                "rules": [
                    {"type": "exact_match"},
                    {"type": "format", "pattern": "[0-9]+", "weight": 0.5},
                ]
            }
        )
    )
    summary = tmp_path / "summary.json"
    run_id = "loop-ppo"
    earlier = sorted((r["event_id"], r["reward"]) for r in _rows("rewards"))
    _, loop_out, _ = loop_run
    cli("run", "--rl-steps", "3", "--algo", "ppo", "--hybrid", "--reward-rules", str(rules),
        "--sampler", "ppm", "--ppm-from", str(loop_out / "loop-it" / "ppm"),
        "--run-id", run_id, "--out", str(tmp_path),
        "--summary", str(summary), *SMALL, "--set", "rl.update_epochs=2",
        "--set", "model.tokenizer=bpe:300", timeout=900)  # fmt: skip
    figures = json.loads(summary.read_text())
    assert figures["completed"] and figures["algo"] == "ppo" and figures["hybrid"]
    rewards = _rows_of(run_id, "rewards")
    rollouts = {
        (r["request_id"], r["sample_idx"]): r["completion"] for r in _rows_of(run_id, "rollouts")
    }
    for r in rewards:
        digits = rollouts[(r["request_id"], r["sample_idx"])].strip().isdigit()
        assert r["reward"] == pytest.approx(float(r["correct"]) + 0.5 * digits)
    assert any(r["reward"] not in (0.0, 1.0) for r in rewards)  # the rules, not the verifier
    trained = {r["event_id"]: r["reward"] for r in _rows_of(run_id, "experience")}
    scored = {(r["request_id"], r["sample_idx"]): r["reward"] for r in rewards}
    assert sorted(trained.values()) == sorted(  # what the trainer consumed carries them
        scored[(r["request_id"], r["sample_idx"])] for r in _rows_of(run_id, "experience")
    )
    metrics = {r["metric"] for r in _rows_of(run_id, "eval_results") if r["task"] == "rl"}
    assert {"value_loss", "lm_loss"} <= metrics  # the value head and the LM share trained
    # this run's processors scored only its own rollouts, not the earlier run's on the topic
    assert sorted((r["event_id"], r["reward"]) for r in _rows("rewards")) == earlier
    config = (tmp_path / run_id / "config.yaml").read_text()
    assert "algo: ppo" in config and "hybrid: true" in config  # the effective config is kept
    # its PPM started from loop-it's: the network, history and prompt collection
    log = (tmp_path / run_id / "logs" / "scheduler.log").read_text()
    # ... and how much its predictions were worth there (the sampler's fitted prior strength)
    assert re.search(r"the PPM starts from \S+loop-it/ppm \(\d+ observations, [1-9]\d* fits, "
                     r"its predictions worth [\d.]+ rollouts\)", log)  # fmt: skip
    assert re.search(r"[1-9]\d* prompt vectors of \S+ join this run's collection", log)
    trained = Tokenizer.load(tmp_path / run_id / "tokenizer")
    assert f"tokenizer: {tmp_path / run_id / 'tokenizer'}" in config
    assert not trained.is_char and trained.eos == "<|endoftext|>"
    exported = tmp_path / "exported"
    cli("export", run_id, "--out", str(exported), "--runs", str(tmp_path))
    assert Tokenizer.load(exported).vocab == trained.vocab  # the policy version's own
    asked = {r["request_id"]: r["text"] for r in _rows_of(run_id, "rollout_requests")}
    for r in _rows_of(run_id, "experience"):  # what the workers sampled, in the BPE's ids
        assert r["prompt_tokens"] == trained.encode(asked[r["request_id"]])
        assert max(r["prompt_tokens"] + r["completion_tokens"]) < trained.vocab_size


def test_the_ppm_scheduler_records_every_decision_and_reads_no_answer(loop_run):
    figures, out, _ = loop_run
    scores = _rows("prompt_scores")
    requested = [r["prompt_id"] for r in _rows("rollout_requests")]
    assert {r["sampler"] for r in scores} == {"ppm"}
    picked = [r for r in scores if r["selected"]]
    assert sorted(r["prompt_id"] for r in picked) == sorted(requested)  # audited one to one
    assert {r["reason"] for r in picked} <= {"informative", "below_threshold_fill", "uniform_share"}
    assert any(r["reason"] == "not_picked" for r in scores)  # candidates were turned down
    assert max(r["ppm_version"] for r in scores) > 0  # the PPM was fitted on rewards
    assert all(0.0 <= r["predicted_pass_rate"] <= 1.0 for r in scores)
    log = (out / "loop-it" / "logs" / "scheduler.log").read_text()
    # the default PPM reads no answer: the policy's confidence in its own greedy answer (so it
    # follows the policy versions), history, and neighbourhoods (MiniLM vectors in Qdrant)
    assert "loaded policy version" in log
    reads = re.search(r"PPM neighbourhood: (\d+) reads from Qdrant, (\d+) from memory", log)
    assert reads and int(reads[1]) > 0 and reads[2] == "0"  # read back from the collection
    assert 0.0 <= figures["zero_variance_share"] <= 1.0 and figures["sampler"] == "ppm"
    assert figures["ppm_features"] == "confidence"  # `auto` on direct answers
    assert "PPM features confidence" in log
    calibration = {r["metric"]: r for r in _rows("eval_results") if r["task"] == "ppm"}
    assert {"brier_unseen", "pearson_r_unseen"} <= set(calibration)  # measured live
    strengths = {m: r["value"] for m, r in calibration.items() if m.startswith("prior_strength_")}
    assert set(calibration) - set(strengths) <= {f"{k}_{w}" for k in ("brier", "pearson_r")
                                                 for w in ("unseen", "uniform")}  # fmt: skip
    # the prior's worth per family, fitted to the outcomes (ppm_prior=fit): within its grid
    assert set(strengths) == {f"prior_strength_{t}" for t in ("add", "sub")}
    assert all(STRENGTH_GRID[0] <= k <= STRENGTH_GRID[-1] for k in strengths.values())
    assert 0.0 <= calibration["brier_unseen"]["value"] <= 1.0
    assert calibration["brier_unseen"]["n"] >= 16  # groups of prompts never rolled out before
    assert (out / "loop-it" / "ppm" / "state.pt").exists()  # what --ppm-from starts from
    # what choosing prompts cost, by part: the policy's features, the fit, the picks
    cost = figures["scheduler_select_ms_per_round"]
    parts = [figures[f"scheduler_{p}_ms_per_round"] for p in ("features", "fit", "pick")]
    assert cost > 0 and cost == pytest.approx(sum(parts), abs=0.05)
    assert figures["scheduler_candidates_per_round"] >= 8  # at least a batch scored a round
    # and in tokens (trainers/selection/compute.py): each candidate's greedy decode, charged
    # against the rollouts' tokens at the prefill cost the scheduler measured on the policy
    assert figures["scheduler_select_decoded"] > 0 and figures["scheduler_select_prefilled"] > 0
    assert 0 < figures["scheduler_prefill_ratio"] < 10
    rows = {r["event_id"]: r for r in _rows("experience")}.values()
    assert figures["rollout_decoded"] == sum(len(r["completion_tokens"]) for r in rows) > 0
    share = figures["selection_compute"] / figures["rollout_compute"]  # both rounded to tokens
    assert figures["selection_compute_share"] == pytest.approx(share, rel=1e-3) and share > 0
    # sampled every few seconds of RL: a run this short may have none (the main job has them)
    assert all(0 <= v <= 1 for v in figures["cpu_share_of_cores_rl"].values())
    if figures["final_accuracy"] > figures["pretrain_accuracy"]:  # RL gained: its 90% mark
        assert 0 < figures["rl_s_to_90pct_mark"] <= figures["wall_s"]


def test_eval_results_arrive(loop_run):
    evals = [r for r in _rows("eval_results") if r["task"] == "all" and r["metric"] == "greedy"]
    assert len({r["step"] for r in evals}) >= 2  # pre-train, periodic, final
    assert all(0.0 <= r["value"] <= 1.0 for r in evals)


def test_replay_of_rewards_matches_the_archive_per_prompt(loop_run, tmp_path):
    import pyarrow.compute as pc
    import pyarrow.parquet as pq

    from rlstream.connectors.objectstore import ObjectStore

    out = tmp_path / "rewards.parquet"
    cli("replay", "rewards", "--out", str(out))
    rewards = pq.read_table(out).to_pylist()
    archive = ObjectStore(Endpoints.from_env()).read_parquet_prefix("loop-it/experience/")
    archived_requests = set(archive.column("request_id").to_pylist())

    def rates(rows) -> dict[str, float]:
        by = defaultdict(dict)
        for r in rows:
            by[r["prompt_id"]][(r["request_id"], r["sample_idx"])] = r["correct"]
        return {p: sum(v.values()) / len(v) for p, v in by.items()}

    replayed = rates(
        [r for r in rewards if r["run_id"] == "loop-it" and r["request_id"] in archived_requests]
    )
    assert replayed == rates(archive.to_pylist()) and replayed
    assert pc.sum(archive.column("correct")).as_py() >= 0


def test_reprocess_rescored_rollouts_without_touching_the_live_group(loop_run, tmp_path):
    from aiokafka import TopicPartition

    from rlstream.connectors.kafka import consumer
    from rlstream.schemas import get

    live_group = "rlstream-loop-it-processors"
    tps = [TopicPartition(get("rollouts").topic, p) for p in range(4)]

    async def committed() -> dict:
        c = consumer(Endpoints.from_env(), group_id=live_group)
        await c.start()
        try:
            return {tp.partition: await c.committed(tp) for tp in tps}
        finally:
            await c.stop()

    before = asyncio.run(committed())
    target = "rl.rewards.v1.rescored-it"
    summary = tmp_path / "reprocess.json"
    cli(
        "reprocess",
        "score_rollouts",
        "--from",
        "rollouts",
        "--to",
        target,
        "--run-id",
        "loop-it",
        "--verifier",
        "v2",
        "--summary",
        str(summary),
    )
    figures = json.loads(summary.read_text())
    original = {(r["request_id"], r["sample_idx"]): r for r in _rows("rewards")}
    rescored = asyncio.run(_topic_rows(target))
    assert figures["rows_out"] == figures["rows_in"] == len(_rows("rollouts")) > 0
    assert {(r["request_id"], r["sample_idx"]) for r in rescored} >= set(original)
    for r in rescored:
        key = (r["request_id"], r["sample_idx"])
        if key in original:  # same verifier logic, new verifier name: same reward, new id
            assert r["reward"] == original[key]["reward"] and r["verifier"] == "v2"
            assert r["event_id"] != original[key]["event_id"]
    assert asyncio.run(committed()) == before
    again = cli(
        "reprocess",
        "score_rollouts",
        "--from",
        "rollouts",
        "--to",
        target,
        "--run-id",
        "loop-it",
        "--summary",
        str(summary),
    )
    assert json.loads(summary.read_text())["rows_in"] == 0, again.stdout  # resumes its own group
    bad = cli("reprocess", "score_rollouts", "--to", "rl.rewards.v1", check=False)
    assert bad.returncode == 2 and "a live topic" in bad.stderr

    # the derived topic is first-class: listed with its event, tailed, replayed
    infos = {i["topic"]: i for i in json.loads(cli("topics", "--json").stdout)}
    assert infos[target]["event"] == "rewards v1" and infos[target]["messages"] > 0
    assert infos["rl.rewards.v1"]["event"] == "rewards v1"
    tailed = [json.loads(line) for line in cli("tail", target, "--json").stdout.splitlines()]
    assert {(r["request_id"], r["sample_idx"]) for r in tailed} == {
        (r["request_id"], r["sample_idx"]) for r in rescored
    }
    assert {r["verifier"] for r in tailed if r["run_id"] == "loop-it"} == {"v2"}
    out = tmp_path / "rescored.parquet"
    cli("replay", target, "--out", str(out))
    import pyarrow.parquet as pq

    replayed = pq.read_table(out)
    assert replayed.num_rows == len(rescored) and "reward" in replayed.column_names
    missing = cli("tail", "rl.rewards.v1.nothing-here", check=False)
    assert missing.returncode == 2 and "unknown topic" in missing.stderr
    assert "Traceback" not in missing.stderr


async def _topic_rows(topic: str) -> list[dict]:
    from rlstream.connectors.reading import ReadRange, read_topic
    from rlstream.schemas import decode

    rows = []
    async for record in read_topic(Endpoints.from_env(), topic, ReadRange()):
        rows += decode(record.value, record.headers).to_pylist()
    return rows


def test_ctrl_c_stops_the_run_its_children_and_its_embedded_stack_and_resume_finishes_it(
    tmp_path,
):
    """The README's main command's path: `rlstream run` with no stack running starts its own
    (here durable, `loop.durable_stack`: the broker's log in the stack's S3 server). SIGINT to
    the run's process group, as a terminal's Ctrl-C sends it: the run exits with 130 and leaves
    no process behind, neither of the loop nor of the stack (children are stopped together).
    `--resume` starts the stack again on the same directory, finds the run's topics and offsets
    there, and continues from the last checkpoint to the end, training nothing twice."""
    import os
    import signal
    import subprocess
    import sys
    import time

    import psutil

    from rlstream.connectors.endpoints import ENDPOINT_VARIABLES
    from rlstream.ops.launcher.childrun import Live

    env = {k: v for k, v in os.environ.items() if k not in ENDPOINT_VARIABLES}
    env |= {"RLSTREAM_HOME": str(tmp_path / "home"), "RLSTREAM_SESSION_TIMEOUT_MS": "6000"}
    run_id, steps = "loop-ctrl-c", 8
    args = [sys.executable, "-m", "rlstream.cli", "run", "--rl-steps", str(steps), "--run-id",
            run_id, "--out", str(tmp_path), *SMALL, "--set", "checkpoint.every=2",
            "--set", "loop.durable_stack=true"]  # fmt: skip
    run = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                           start_new_session=True, env=env)  # fmt: skip
    live = Live(tmp_path / run_id / "live.json")
    try:
        deadline = time.monotonic() + 400
        while time.monotonic() < deadline and run.poll() is None:
            if live.phase() == "rl" and live.step() >= 2:
                break
            time.sleep(0.5)
        kids = psutil.Process(run.pid).children(recursive=True)
        names = {_kind(p) for p in kids}
        modules = ("trainer", "scheduler", "worker", "rollout_worker")
        broker = "java" if os.environ.get("RLSTREAM_STACK_BROKER") == "kafka" else "tansu"
        assert {broker, "weed"} | {f"rlstream.streams.{m}" for m in modules} <= names, names
        (server,) = [p for p in kids if _kind(p) == "rlstream.ops.launcher.forkserver"]
        forked = {_kind(p) for p in server.children()}  # loop.fork_server: torch's processes
        assert forked == {f"rlstream.streams.{m}" for m in modules if m != "worker"}, forked
        secret = json.loads((tmp_path / run_id / "stack" / "secrets.json").read_text())
        assert not any(secret["secret_key"] in " ".join(p.cmdline()) for p in kids)  # by env
        interrupted = time.monotonic()
        os.killpg(run.pid, signal.SIGINT)
        assert run.wait(60) == 130, run.stderr.read()[-3000:]
        print(f"stopped {time.monotonic() - interrupted:.1f} s after Ctrl-C")
        stderr = run.stderr.read()
        assert "interrupted" in stderr and f"--resume {run_id}" in stderr
        assert not [p for p in kids if _alive(p.pid)]
    finally:
        if run.poll() is None:
            os.killpg(run.pid, signal.SIGKILL)
    summary = tmp_path / "resumed.json"
    resumed_run = subprocess.run([sys.executable, "-m", "rlstream.cli", "run", "--resume", run_id,
                                  "--out", str(tmp_path), "--summary", str(summary)],
                                 capture_output=True, text=True, timeout=600, env=env)  # fmt: skip
    assert resumed_run.returncode == 0, resumed_run.stderr[-3000:]
    resumed = json.loads(summary.read_text())
    assert resumed["completed"] and resumed["rl_steps"] == steps and resumed["embedded_stack"]
    assert resumed["pretrain_steps"] == 60  # SMALL's, not pre-trained again
    assert resumed["duplicates_trained"] == 0 and resumed["archive_matches_topic"]
    log = (tmp_path / run_id / "logs" / "trainer.log").read_text()
    assert "resumed at step" in log
    missing = cli("run", "--resume", "no-such-run", "--out", str(tmp_path), check=False)
    assert missing.returncode == 2 and "no run 'no-such-run'" in missing.stderr


def _kind(p) -> str:
    """A process's kind: its rlstream module, else its program's name (no version suffix)."""
    from pathlib import Path

    from rlstream.ops.stack.procs import command_line

    cmd = command_line(p)
    return next((a for a in cmd if a.startswith("rlstream.")), Path(cmd[0]).name.split("-")[0])


def _alive(pid: int) -> bool:
    import psutil

    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False
