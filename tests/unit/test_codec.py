"""The codec: every schema round-trips; every kind of bad message gets its own error."""

from __future__ import annotations

import pyarrow as pa
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from rlstream.schemas import (
    MissingRequiredValues,
    NotArrow,
    OversizeMessage,
    SchemaMismatch,
    UnknownEvent,
    UnknownVersion,
    all_events,
    decode,
    encode,
    event_from_headers,
    get,
)
from tests.unit.samples import sample_batch

EVENTS = all_events()


def test_every_topic_in_the_design_is_registered():
    names = {e.name for e in EVENTS}
    assert names == {
        "prompts",
        "prompt_scores",
        "rollout_requests",
        "rollouts",
        "rewards",
        "experience",
        "policy_versions",
        "eval_results",
        "corpus",
        "dead_letters",
    }
    for e in EVENTS:
        assert e.topic == f"rl.{e.name}.v{e.version}"
        assert e.schema.names[:4] == ["event_id", "run_id", "policy_version", "produced_at"]
    experience = get("experience")
    assert experience.topic == "rl.experience.v2"  # v2 dropped the unread advantage column
    assert "advantage" not in experience.schema.names and "reward" in experience.schema.names


@pytest.mark.parametrize("event", EVENTS, ids=lambda e: e.topic)
def test_every_schema_round_trips(event):
    batch = sample_batch(event)
    value, headers = encode(event, batch)
    version = str(event.version).encode()
    assert dict(headers) == {"event": event.name.encode(), "schema_version": version}
    decoded = decode(value, headers)
    assert decoded.event is event
    assert decoded.batch.equals(batch)
    assert decoded.to_pylist() == batch.to_pylist()


def _good():
    event = get("rollouts")
    return event, *encode(event, sample_batch(event))


def test_not_arrow_is_rejected():
    _, _, headers = _good()
    with pytest.raises(NotArrow, match="not an Arrow IPC stream"):
        decode(b"this is not arrow", headers)


def test_truncated_arrow_is_rejected_as_not_arrow():
    _, value, headers = _good()
    with pytest.raises(NotArrow):
        decode(value[: len(value) // 2], headers)


def test_missing_and_unknown_event_headers_are_rejected():
    _, value, headers = _good()
    with pytest.raises(UnknownEvent, match="no 'event' header"):
        decode(value, [h for h in headers if h[0] != "event"])
    with pytest.raises(UnknownEvent, match="unknown event 'bananas'"):
        decode(value, [("event", b"bananas"), ("schema_version", b"1")])


def test_unknown_version_is_rejected():
    _, value, _ = _good()
    with pytest.raises(UnknownVersion, match="no schema version 9"):
        decode(value, [("event", b"rollouts"), ("schema_version", b"9")])
    with pytest.raises(UnknownVersion, match="expected an integer"):
        decode(value, [("event", b"rollouts"), ("schema_version", b"x")])


def test_schema_mismatch_is_rejected_with_the_difference():
    _, value, _ = _good()  # a rollouts stream labelled as rewards
    with pytest.raises(SchemaMismatch, match="missing fields"):
        decode(value, [("event", b"rewards"), ("schema_version", b"1")])
    event = get("eval_results")
    batch = sample_batch(event)
    wrong = batch.set_column(
        batch.schema.get_field_index("value"), "value", pa.array(["x"] * batch.num_rows)
    )
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, wrong.schema) as w:
        w.write_batch(wrong)
    with pytest.raises(SchemaMismatch, match="value: string \\(expected double\\)"):
        decode(sink.getvalue().to_pybytes(), [("event", b"eval_results"), ("schema_version", b"1")])


def test_missing_required_values_are_rejected():
    event = get("prompts")
    batch = sample_batch(event)
    i = batch.schema.get_field_index("text")
    nullable = batch.schema.set(i, pa.field("text", pa.string(), nullable=True))
    holed = pa.RecordBatch.from_arrays(
        [*batch.columns[:i], pa.array(["a", None, "c"]), *batch.columns[i + 1 :]], schema=nullable
    )
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, holed.schema) as w:
        w.write_batch(holed)
    with pytest.raises(MissingRequiredValues, match="'text' has 1 null value"):
        decode(sink.getvalue().to_pybytes(), [("event", b"prompts"), ("schema_version", b"1")])
    with pytest.raises(MissingRequiredValues):
        encode(event, holed)


def test_oversize_is_rejected_before_parsing():
    _, value, headers = _good()
    with pytest.raises(OversizeMessage, match="over the 100-byte limit"):
        decode(value, headers, max_bytes=100)


def test_each_error_kind_is_distinct():
    kinds = [
        c.kind
        for c in (
            NotArrow,
            UnknownEvent,
            UnknownVersion,
            SchemaMismatch,
            MissingRequiredValues,
            OversizeMessage,
        )
    ]
    assert len(set(kinds)) == len(kinds)


def test_encode_casts_compatible_types_and_rejects_missing_columns():
    event = get("eval_results")
    batch = sample_batch(event)
    as_int64 = pa.Table.from_batches([batch]).to_pydict()
    table = pa.table(as_int64)  # step/n inferred int64, value double: castable
    value, headers = encode(event, table)
    assert decode(value, headers).batch.equals(batch)
    with pytest.raises(SchemaMismatch, match="missing fields \\['metric'\\]"):
        encode(event, pa.table(as_int64).drop_columns(["metric"]))


def _rows_strategy(event):
    def field_strategy(type_):
        if pa.types.is_string(type_):
            return st.text(max_size=20)
        if pa.types.is_int8(type_):
            return st.integers(-(2**7), 2**7 - 1)
        if pa.types.is_int32(type_):
            return st.integers(-(2**31), 2**31 - 1)
        if pa.types.is_integer(type_):
            return st.integers(-(2**63), 2**63 - 1)
        if pa.types.is_float32(type_):
            return st.floats(width=32, allow_nan=False)
        if pa.types.is_floating(type_):
            return st.floats(allow_nan=False)
        if pa.types.is_boolean(type_):
            return st.booleans()
        if pa.types.is_binary(type_):
            return st.binary(max_size=40)
        if pa.types.is_list(type_):
            return st.lists(field_strategy(type_.value_type), max_size=8)
        raise TypeError(type_)

    fields = {}
    for f in event.payload_fields:
        s = field_strategy(f.type)
        fields[f.name] = s if not f.nullable else st.one_of(st.none(), s)
    return st.lists(st.fixed_dictionaries(fields), min_size=0, max_size=20)


@pytest.mark.parametrize("event", EVENTS, ids=lambda e: e.topic)
def test_random_batches_round_trip(event):
    from rlstream.schemas import rows_to_batch

    @settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
    @given(rows=_rows_strategy(event), version=st.integers(0, 2**40))
    def check(rows, version):
        batch = rows_to_batch(event, rows, run_id="prop", policy_version=version)
        value, headers = encode(event, batch)
        decoded = decode(value, headers)
        assert decoded.batch.equals(batch)
        assert decoded.batch.num_rows == len(rows)

    check()


def test_an_event_on_a_derived_topic_keeps_its_schema_and_headers():
    rewards = get("rewards")
    derived = rewards.on_topic("rl.rewards.v1.rescored")
    assert derived.topic == "rl.rewards.v1.rescored" and rewards.topic == "rl.rewards.v1"
    assert derived.schema == rewards.schema and derived.required == rewards.required
    assert rewards.on_topic(rewards.topic) is rewards
    value, headers = encode(derived, sample_batch(derived))
    assert event_from_headers(headers) is rewards  # decoded as the registered event
    assert decode(value, headers).event is rewards


def test_a_message_without_optional_columns_decodes_with_nulls():
    """Compatible evolution within a version: an older producer (or a plain one) that leaves
    out optional columns, here prompts' `dataset` and `split`, is still valid; a missing
    required column is not."""
    event = get("prompts")
    batch = sample_batch(event)
    old = batch.drop_columns(["dataset", "split", "difficulty"])
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, old.schema) as w:
        w.write_batch(old)
    decoded = decode(
        sink.getvalue().to_pybytes(), [("event", b"prompts"), ("schema_version", b"1")]
    )
    assert decoded.batch.schema.names == event.schema.names
    assert decoded.batch.column("dataset").null_count == batch.num_rows
    assert decoded.batch.column("text").equals(batch.column("text"))
    value, _ = encode(event, old)  # producers may omit them too
    assert decode(value, [("event", b"prompts"), ("schema_version", b"1")]).batch.num_rows
    with pytest.raises(SchemaMismatch, match="missing fields \\['text'\\]"):
        encode(event, batch.drop_columns(["text"]))
