"""Pure parts of the connectors: endpoints from env, partitioning, files, times, dead letters."""

from __future__ import annotations

import json
from datetime import UTC, datetime

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from aiokafka.structs import ConsumerRecord

from rlstream.connectors.deadletter import dead_letter_batch
from rlstream.connectors.endpoints import Endpoints
from rlstream.connectors.files import UnsupportedFile, read_rows
from rlstream.connectors.kafka import partition_for, split_by_partition
from rlstream.ops.commands.replay import BadTime, parse_time
from rlstream.schemas import NotArrow, decode, encode, get
from tests.unit.samples import sample_batch


def test_endpoints_env_overrides_state_file(tmp_path):
    Endpoints(kafka_bootstrap="127.0.0.1:1111", s3_bucket="from-file").write(tmp_path)
    env = {
        "RLSTREAM_HOME": str(tmp_path),
        "RLSTREAM_KAFKA_BOOTSTRAP": "10.0.0.1:9092",
        "RLSTREAM_S3_SECURE": "true",
        "RLSTREAM_SESSION_TIMEOUT_MS": "6000",
    }
    monkey = pytest.MonkeyPatch()
    monkey.setenv("RLSTREAM_HOME", str(tmp_path))
    try:
        e = Endpoints.from_env(env)
    finally:
        monkey.undo()
    assert e.kafka_bootstrap == "10.0.0.1:9092" and e.s3_bucket == "from-file"
    assert e.s3_secure is True and e.session_timeout_ms == 6000
    assert "secret" not in repr(e) and "s3_secret_key" not in e.public()
    with pytest.raises(ValueError, match="RLSTREAM_S3_SECURE='maybe'"):
        Endpoints.from_env({"RLSTREAM_S3_SECURE": "maybe"})


def test_broker_credentials_come_from_the_environment_and_stay_out_of_reprs(tmp_path):
    env = {"RLSTREAM_KAFKA_SECURITY_PROTOCOL": "SASL_PLAINTEXT",
           "RLSTREAM_KAFKA_SASL_MECHANISM": "SCRAM-SHA-512",
           "RLSTREAM_KAFKA_USERNAME": "trainer", "RLSTREAM_KAFKA_PASSWORD": "pw-0600"}  # fmt: skip
    e = Endpoints.from_env(env)
    assert e.kafka_auth() == {
        "security_protocol": "SASL_PLAINTEXT", "sasl_mechanism": "SCRAM-SHA-512",
        "sasl_plain_username": "trainer", "sasl_plain_password": "pw-0600",
    }  # fmt: skip
    assert "pw-0600" not in repr(e) and "pw-0600" not in json.dumps(e.public())
    assert "RLSTREAM_KAFKA_PASSWORD" in e.as_env()  # children get it by environment only
    assert Endpoints().kafka_auth() == {}  # the embedded broker: PLAINTEXT on loopback
    with pytest.raises(ValueError, match="RLSTREAM_KAFKA_SASL_MECHANISM='MD5'"):
        Endpoints.from_env({"RLSTREAM_KAFKA_SASL_MECHANISM": "MD5"})


def test_a_state_file_others_can_read_is_refused(tmp_path):
    path = Endpoints(s3_secret_key="k").write(tmp_path)
    assert path.stat().st_mode & 0o777 == 0o600
    assert Endpoints.from_state_file(tmp_path).s3_secret_key == "k"
    path.chmod(0o644)
    with pytest.raises(PermissionError, match="chmod 600"):
        Endpoints.from_state_file(tmp_path)


def test_endpoints_are_frozen():
    with pytest.raises(AttributeError):
        Endpoints().kafka_bootstrap = "x"  # type: ignore[misc]


def test_partition_for_matches_the_java_client():
    # Known murmur2 partitions of the Java DefaultPartitioner for 4 partitions.
    assert partition_for(b"", 4) == (0x106E08D9 & 0x7FFFFFFF) % 4
    assert all(0 <= partition_for(f"k{i}", 4) < 4 for i in range(100))
    assert len({partition_for(f"k{i}", 4) for i in range(100)}) == 4


def test_split_by_partition_keeps_each_key_on_one_partition():
    event = get("rewards")
    batch = sample_batch(event, rows=40)
    parts = split_by_partition(event, batch)
    assert sum(p.num_rows for _, p in parts) == 40
    for partition, part in parts:
        assert {partition_for(k, 4) for k in part.column("prompt_id").to_pylist()} == {partition}


def test_read_rows_reports_locations(tmp_path):
    jsonl = tmp_path / "p.jsonl"
    jsonl.write_text('{"a": 1}\n\nnot json\n[1]\n{"a": 2}\n')
    rows = list(read_rows(jsonl))
    assert [(r.where, r.error is None) for r in rows] == [
        ("line 1", True),
        ("line 3", False),
        ("line 4", False),
        ("line 5", True),
    ]
    csv = tmp_path / "p.csv"
    csv.write_text("a,b\n1,\n2,3,4\n")
    rows = list(read_rows(csv))
    assert rows[0].data == {"a": "1"} and rows[1].error and rows[1].where == "line 3"
    pq.write_table(pa.table({"a": [1, None]}), tmp_path / "p.parquet")
    assert [r.data for r in read_rows(tmp_path / "p.parquet")] == [{"a": 1}, {}]
    with pytest.raises(UnsupportedFile, match="use .jsonl, .csv or .parquet"):
        list(read_rows(tmp_path / "p.txt"))


def test_parse_time_forms():
    now = datetime(2026, 11, 30, 12, 0, tzinfo=UTC)
    ms = int(now.timestamp() * 1000)
    assert parse_time("now", now) == ms
    assert parse_time("10m", now) == ms - 600_000
    assert parse_time("2026-11-30T12:00:00", now) == ms
    assert parse_time("2026-11-30T13:00:00+01:00", now) == ms
    assert parse_time(str(ms)) == ms
    with pytest.raises(BadTime, match="cannot read time 'yesterday'"):
        parse_time("yesterday", now)


def test_dead_letter_batch_keeps_source_reason_and_raw_bytes():
    record = ConsumerRecord(
        "rl.rollouts.v1", 2, 41, 0, 0, b"k", b"garbage", None, 7, 1, [("event", b"rollouts")]
    )
    batch = dead_letter_batch(
        record, NotArrow("value is not an Arrow IPC stream: x"), consumer_name="test"
    )
    event = get("dead_letters")
    row = decode(*encode(event, batch)).to_pylist()[0]
    assert (row["source_topic"], row["source_partition"], row["source_offset"]) == (
        "rl.rollouts.v1",
        2,
        41,
    )
    assert row["error_kind"] == "not_arrow" and row["raw_value"] == b"garbage"
    assert json.loads(row["raw_headers"]) == {"event": "rollouts"}
    again = dead_letter_batch(record, NotArrow("other words"), consumer_name="test")
    assert again.column("event_id").equals(batch.column("event_id"))  # idempotent
    other = dead_letter_batch(record, NotArrow("x"), consumer_name="another-consumer")
    assert not other.column("event_id").equals(batch.column("event_id"))  # each consumer's own


def test_request_ids_carry_their_round():
    from rlstream.streams.scheduler import round_of

    assert round_of("loop-it-r000012-003") == 12
    assert round_of("run-20261130-r000000-000") == 0  # run ids may contain dashes
