"""publish, tail and replay through the real broker, driven through the CLI."""

from __future__ import annotations

import asyncio
import json
import os
import queue
import random
import subprocess
import threading
import time

import pyarrow.parquet as pq
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from rlstream.schemas import get
from tests.integration.conftest import RLSTREAM, cli

pytestmark = pytest.mark.integration


def _prompt_rows(n: int, run: str) -> list[dict]:
    rng = random.Random(n)
    rows = []
    for i in range(n):
        a, b = rng.randrange(1000), rng.randrange(1000)
        rows.append(
            {
                "prompt_id": f"{run}-{i}",
                "text": f"{a:03d}+{b:03d}=",
                "task": "add",
                "difficulty": len(str(max(a, b))),
                "answer": str(a + b),
                "split": rng.choice(["train", "heldout"]),
            }
        )
    return rows


def _write_jsonl(path, rows):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def test_publish_10k_rows_and_read_back_the_same_rows(stack_home, tmp_path):
    run_id = f"bulk-{time.time_ns()}"
    rows = _prompt_rows(10_000, run_id)
    source = _write_jsonl(tmp_path / "prompts.jsonl", rows)
    summary = tmp_path / "publish.json"
    cli("publish", str(source), "--run-id", run_id, "--summary", str(summary))
    figures = json.loads(summary.read_text())
    assert figures["rows_published"] == 10_000 and figures["bad_rows"] == 0

    out = tmp_path / "back.parquet"
    cli("replay", "prompts", "--out", str(out))
    table = pq.read_table(out).to_pylist()
    mine = [r for r in table if r["run_id"] == run_id]
    fields = ["prompt_id", "text", "task", "difficulty", "answer", "split"]
    got = sorted(tuple(r[f] for f in fields) for r in mine)
    want = sorted(tuple(r[f] for f in fields) for r in rows)
    assert got == want  # the same content, each row exactly once
    assert len({r["event_id"] for r in mine}) == 10_000


def test_publish_reports_bad_rows_and_still_publishes_good_ones(stack_home, tmp_path):
    run_id = f"bad-{time.time_ns()}"
    good = _prompt_rows(3, run_id)
    source = tmp_path / "mixed.jsonl"
    source.write_text(
        json.dumps(good[0])
        + "\n{oops\n"
        + json.dumps({"text": "no task"})
        + "\n"
        + json.dumps(good[1])
        + "\n"
        + json.dumps({**good[2], "difficulty": "hard"})
        + "\n"
    )
    result = cli("publish", str(source), "--run-id", run_id, "--summary", str(tmp_path / "s.json"))
    assert "line 2: not valid JSON" in result.stderr
    assert "line 3: missing required field 'task'" in result.stderr
    assert "line 5: field 'difficulty': expected an integer, got 'hard'" in result.stderr
    figures = json.loads((tmp_path / "s.json").read_text())
    assert (figures["rows_published"], figures["bad_rows"]) == (2, 3)
    lines = cli("tail", "prompts", "--json", "--where", f"run_id = '{run_id}'").stdout
    rows = [json.loads(x) for x in lines.splitlines()]  # and earlier tests' garbage, shown
    assert sorted(r["prompt_id"] for r in rows if "_error" not in r) == [
        good[0]["prompt_id"],
        good[1]["prompt_id"],
    ]


@pytest.mark.timeout(90)
def test_tail_follow_shows_a_new_event_within_one_second(stack_home, tmp_path):
    run_id = f"follow-{time.time_ns()}"
    tail = subprocess.Popen(
        [*RLSTREAM, "tail", "prompts", "--follow", "--json", "--where", f"run_id = '{run_id}'"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=os.environ.copy(),
    )
    lines: queue.Queue[str] = queue.Queue()
    threading.Thread(target=lambda: [lines.put(x) for x in tail.stdout], daemon=True).start()
    try:
        # Warm up until the tail shows an event, so we time delivery, not start-up.
        for attempt in range(30):
            _publish_one(f"warm-{attempt}", run_id)
            try:
                warm = json.loads(lines.get(timeout=1.0))
                break
            except queue.Empty:
                continue
        else:
            raise AssertionError(
                f"tail showed nothing: {tail.stderr.read() if tail.poll() else ''}"
            )
        assert warm["prompt_id"].startswith("warm-")
        while not lines.empty():
            lines.get_nowait()

        acked = _publish_one("new", run_id)
        shown_line = lines.get(timeout=5)
        shown = time.monotonic()
        assert json.loads(shown_line)["prompt_id"] == "new"
        print(f"tail --follow latency after ack: {shown - acked:.3f}s")
        assert shown - acked < 1.0
    finally:
        tail.terminate()
        tail.wait(10)


def _publish_one(prompt_id: str, run_id: str) -> float:
    """Publish one prompt in-process; return the monotonic time of the broker's ack."""
    from rlstream.connectors.endpoints import Endpoints
    from rlstream.connectors.kafka import EventProducer
    from rlstream.schemas import rows_to_batch

    async def publish() -> float:
        async with EventProducer(Endpoints.from_env()) as producer:
            rows = [{"prompt_id": prompt_id, "text": prompt_id, "task": "t"}]
            await producer.send(get("prompts"), rows_to_batch(get("prompts"), rows, run_id=run_id))
            return time.monotonic()

    return asyncio.run(publish())


def test_replay_of_a_time_range_equals_what_was_produced_in_it(stack_home, tmp_path):
    run_id = f"range-{time.time_ns()}"
    batches = [_prompt_rows(50, f"{run_id}-{k}") for k in range(3)]
    marks = []
    for k, rows in enumerate(batches):
        if k:
            time.sleep(0.05)
        marks.append(int(time.time() * 1000))
        time.sleep(0.05)
        cli("publish", str(_write_jsonl(tmp_path / f"b{k}.jsonl", rows)), "--run-id", run_id)
    time.sleep(0.05)
    marks.append(int(time.time() * 1000))
    out = tmp_path / "range.parquet"
    cli(
        "replay",
        "prompts",
        "--since",
        str(marks[1]),
        "--until",
        str(marks[2] - 1),
        "--out",
        str(out),
    )
    got = sorted(r["prompt_id"] for r in pq.read_table(out).to_pylist())
    assert got == sorted(r["prompt_id"] for r in batches[1])


def test_replay_from_offset_skips_earlier_messages(stack_home, tmp_path):
    out_all, out_from = tmp_path / "all.parquet", tmp_path / "from.parquet"
    cli("replay", "prompts", "--out", str(out_all))
    cli("replay", "prompts", "--from-offset", "2", "--out", str(out_from))
    everything = pq.read_table(out_all).to_pylist()
    later = pq.read_table(out_from).to_pylist()
    assert later and all(r["_offset"] >= 2 for r in later)
    assert len(later) == sum(1 for r in everything if r["_offset"] >= 2)


def test_topics_lists_every_topic_with_counts(stack_home, tmp_path):
    infos = json.loads(cli("topics", "--json").stdout)
    by_name = {i["topic"]: i for i in infos}
    for event in ("prompts", "rollouts", "dead_letters", "experience"):
        assert get(event).topic in by_name
    assert by_name["rl.rollouts.v1"]["partitions"] == 4
    assert by_name["rl.prompts.v1"]["messages"] > 0


def test_topics_reports_consumer_group_lag(stack_home, tmp_path):
    from rlstream.connectors.endpoints import Endpoints
    from rlstream.connectors.kafka import consumer

    group = f"g-lag-{time.time_ns()}"
    corpus = get("corpus")

    async def commit_at_end() -> None:
        from aiokafka import TopicPartition

        from rlstream.connectors.kafka import highwaters

        tps = [TopicPartition(corpus.topic, p) for p in range(corpus.partitions)]
        offsets = await highwaters(Endpoints.from_env(), tps)
        c = consumer(Endpoints.from_env(), group_id=group)
        await c.start()
        try:
            c.assign(tps)
            await c.commit(offsets)
        finally:
            await c.stop()

    rows = [{"doc_id": f"lag-{i}", "text": "x", "source": "test"} for i in range(6)]
    cli("publish", str(_write_jsonl(tmp_path / "seed.jsonl", rows[:1])), "--topic", "corpus")
    asyncio.run(commit_at_end())
    cli(
        "publish",
        str(_write_jsonl(tmp_path / "more.jsonl", rows[1:])),
        "--topic",
        "corpus",
        "--batch-rows",
        "1",
    )
    infos = {i["topic"]: i for i in json.loads(cli("topics", "--json").stdout)}
    assert infos[corpus.topic]["lag"][group] == 5


_VALUES = st.one_of(
    st.none(), st.booleans(), st.integers(-(2**70), 2**70), st.floats(allow_nan=True),
    st.text(max_size=30), st.lists(st.integers(), max_size=3),
    st.dictionaries(st.text(max_size=5), st.integers(), max_size=2),
)  # fmt: skip
_ROWS = st.fixed_dictionaries(
    {},
    optional={
        "prompt_id": _VALUES, "text": st.one_of(st.text(max_size=40), _VALUES),
        "task": st.one_of(st.sampled_from(["numeric", "exact", "add", "nope"]), _VALUES),
        "answer": _VALUES, "difficulty": _VALUES, "split": _VALUES, "dataset": _VALUES,
        "verifier": _VALUES, "extra": _VALUES,
    },
)  # fmt: skip


@settings(
    max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(rows=st.lists(_ROWS, min_size=1, max_size=30), fmt=st.sampled_from(["jsonl", "csv"]))
def test_any_user_file_is_published_or_reported_row_by_row(stack_home, tmp_path, rows, fmt):
    """Property: whatever rows a JSONL or CSV file holds, `publish_file` never raises; every
    row is published or reported with a reason, and what was published reads back as valid
    events of the dataset."""
    import csv

    from rlstream.connectors.endpoints import Endpoints
    from rlstream.connectors.reading import read_rows_where
    from rlstream.ops.commands.publish import publish_file, verifier_check

    dataset = f"prop-{os.urandom(5).hex()}"  # (hypothesis seeds `random`: names would repeat)
    path = tmp_path / f"{dataset}.{fmt}"
    if fmt == "jsonl":
        path.write_text("".join(json.dumps(r, default=str) + "\n" for r in rows))
    else:
        with open(path, "w", newline="") as f:
            writer = csv.DictWriter(f, fieldnames=sorted({k for r in rows for k in r}) or ["x"])
            writer.writeheader()
            writer.writerows({k: "" if v is None else v for k, v in r.items()} for r in rows)
    event, endpoints = get("prompts"), Endpoints.from_env()
    report = asyncio.run(publish_file(endpoints, path, event, dataset=dataset,
                                      check=verifier_check(event)))  # fmt: skip
    assert report.rows_published + len(report.bad_rows) == report.rows_read == len(rows)
    assert all(reason for _, reason in report.bad_rows)
    if report.rows_published:
        back = asyncio.run(
            read_rows_where(endpoints, event.topic, lambda r: r["dataset"] == dataset)
        )
        assert len(back) == report.rows_published
        assert all(r["text"] is not None and r["task"] for r in back)
