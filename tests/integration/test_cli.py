"""CLI behaviour a user sees: one-line errors, summaries, the broker benchmark."""

from __future__ import annotations

import json

import pytest

from tests.integration.conftest import cli

pytestmark = pytest.mark.integration


def test_unknown_topic_is_a_one_line_error(stack_home):
    result = cli("tail", "bananas", check=False)
    assert result.returncode == 2
    assert "unknown topic 'bananas'" in result.stderr and "Traceback" not in result.stderr


def test_bad_where_and_bad_time_are_one_line_errors(stack_home):
    result = cli("tail", "prompts", "--where", "no_such_column > 1", check=False)
    assert result.returncode == 2 and "--where" in result.stderr
    assert "Traceback" not in result.stderr
    result = cli(
        "replay", "prompts", "--out", "/tmp/x.parquet", "--since", "yesterday", check=False
    )
    assert result.returncode == 2 and "cannot read time 'yesterday'" in result.stderr


def test_bad_run_settings_are_one_line_errors(tmp_path):
    # checked before anything starts: no stack, no processes
    for args, words in (
        (["--sampler", "dapo"], "rl.filter_zero_variance=true"),
        (["--sampler", "ppm", "--set", "ppm_features=pixels"], "selection.ppm_features"),
        (["--set", "rl.lrr=1"], "rl.lrr: unknown setting"),
        (["--set", "lr=1"], "ambiguous; use one of pretrain.lr, rl.lr"),
        (["--algo", "ppx"], "rl.algo: 'ppx' is not one of grpo, ppo"),
        (["--reward-rules", str(tmp_path / "missing.json")], "rl.reward_rules: no such file"),
    ):
        result = cli("run", "--out", str(tmp_path), *args, check=False)
        assert result.returncode == 2 and words in result.stderr, result.stderr
        assert "Traceback" not in result.stderr


def test_a_run_whose_broker_log_was_in_memory_is_not_resumed_and_says_why(tmp_path):
    # the embedded stack's broker keeps its log in memory by default: it ends with the run
    import os
    import subprocess
    import sys

    from rlstream.config import Config
    from rlstream.connectors.endpoints import ENDPOINT_VARIABLES

    env = {k: v for k, v in os.environ.items() if k not in ENDPOINT_VARIABLES}
    env["RLSTREAM_HOME"] = str(tmp_path / "home")  # no running stack: an embedded one
    env["RLSTREAM_STACK_BROKER"] = "tansu"  # whose log is in memory (Kafka's is on disk)
    (tmp_path / "mem").mkdir()
    Config(run_id="mem").write(tmp_path / "mem" / "config.json")
    args = [sys.executable, "-m", "rlstream.cli", "run", "--resume", "mem", "--out", str(tmp_path)]
    result = subprocess.run(args, capture_output=True, text=True, env=env, timeout=120)
    assert result.returncode == 2 and "Traceback" not in result.stderr, result.stderr
    assert "run 'mem' cannot be resumed" in result.stderr
    assert "--set loop.durable_stack=true" in result.stderr


def test_unreachable_broker_is_a_one_line_error(tmp_path):
    lines = tmp_path / "p.jsonl"
    lines.write_text('{"prompt_id": "a", "text": "t", "task": "x"}\n')
    result = cli(
        "publish",
        str(lines),
        check=False,
        timeout=120,
        env={"RLSTREAM_HOME": str(tmp_path), "RLSTREAM_KAFKA_BOOTSTRAP": "127.0.0.1:1"},
    )
    assert result.returncode == 2, result.stderr
    assert "cannot reach the Kafka broker at 127.0.0.1:1" in result.stderr
    assert "Traceback" not in result.stderr


def test_bench_broker_prints_its_table_and_summary(stack_home, tmp_path):
    summary = tmp_path / "bench.json"
    result = cli(
        "bench", "broker", "--repeats", "2", "--messages", "100", "--summary", str(summary)
    )
    assert "codec+broker" in result.stdout and "raw bytes" in result.stdout
    figures = json.loads(summary.read_text())
    assert figures["codec_broker_rows_per_s"] > 0 and figures["raw_bytes_rows_per_s"] > 0
    assert figures["codec_encode_rows_per_s"] > 0 and figures["codec_vs_raw_ratio"] > 0


def test_run_publishes_reads_back_replays_and_archives(stack_home, tmp_path):
    summary = tmp_path / "run.json"
    result = cli(
        "run",
        "--data-only",
        "--out",
        str(tmp_path / "runs"),
        "--run-id",
        "it-run",
        "--summary",
        str(summary),
    )
    figures = json.loads(summary.read_text())
    assert figures["prompts_published"] == 240 == figures["read_back"]
    assert figures["replayed_rows"] >= 240 and figures["bad_rows"] == 0
    assert f"report: {figures['report']}" in result.stdout.replace("\n", "")
    assert (tmp_path / "runs" / "it-run" / "prompts.parquet").exists()
    from rlstream.connectors.endpoints import Endpoints
    from rlstream.connectors.objectstore import ObjectStore

    names = ObjectStore(Endpoints.from_env()).list("it-run/")
    assert names == ["it-run/replays/prompts.parquet", "it-run/reports/report.md"]


def test_tail_and_replay_show_an_undecodable_message_with_its_reason(stack_home, tmp_path):
    import asyncio

    from rlstream.connectors.endpoints import Endpoints
    from rlstream.connectors.kafka import EventProducer
    from rlstream.schemas import get, rows_to_batch

    corpus = get("corpus")

    async def produce() -> int:
        async with EventProducer(Endpoints.from_env()) as producer:
            await producer.send(
                corpus,
                rows_to_batch(corpus, [{"doc_id": "before", "text": "1+1=2", "source": "test"}]),
            )
            meta = await (
                await producer.raw.send(
                    corpus.topic,
                    b"not arrow",
                    partition=0,
                    headers=[("event", b"corpus"), ("schema_version", b"1")],
                )
            )
            await producer.send(
                corpus,
                rows_to_batch(corpus, [{"doc_id": "after", "text": "2+2=4", "source": "test"}]),
            )
            return meta.offset

    offset = asyncio.run(produce())
    lines = [json.loads(x) for x in cli("tail", "corpus", "--json").stdout.splitlines()]
    bad = [x for x in lines if x.get("_error")]
    assert any(x["_offset"] == offset and x["_kind"] == "not_arrow" for x in bad)
    assert {"before", "after"} <= {x.get("doc_id") for x in lines}
    table = cli("tail", "corpus")
    assert f"undecodable p0@{offset}: value is not an Arrow IPC stream" in table.stderr
    summary = tmp_path / "replay.json"
    cli("replay", "corpus", "--out", str(tmp_path / "c.parquet"), "--summary", str(summary))
    assert json.loads(summary.read_text())["bad_messages"] >= 1


LIGHT_CLI = """
import atexit, sys
HEAVY = ("torch", "transformers", "sentence_transformers")
atexit.register(lambda: print("heavy:", [m for m in HEAVY if m in sys.modules], file=sys.stderr))
from rlstream.cli import main
sys.argv = ["rlstream", *sys.argv[1:]]
main()
"""


def test_stream_commands_run_without_torch_or_transformers(stack_home, tmp_path):
    """`--help`, `stack`, `publish`, `topics` and `tail` start light (no torch to import)."""
    import subprocess
    import sys

    rows = tmp_path / "light.jsonl"
    rows.write_text(json.dumps({"text": "12+7=", "task": "numeric", "answer": "19"}) + "\n")
    for args in (
        ["--help"],
        ["stack", "status"],
        ["publish", str(rows), "--dataset", "light"],
        ["topics"],
        ["tail", "prompts", "--limit", "1"],
    ):
        result = subprocess.run([sys.executable, "-c", LIGHT_CLI, *args], capture_output=True,
                                text=True, timeout=120)  # fmt: skip
        assert result.returncode == 0, (args, result.stderr)
        assert "heavy: []" in result.stderr, (args, result.stderr.splitlines()[-1])
