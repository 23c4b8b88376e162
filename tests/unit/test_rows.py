"""Row coercion for publish, deterministic event ids, the registry and topic names."""

from __future__ import annotations

import json

import pyarrow as pa
import pytest

from rlstream.schemas import RowError, coerce_row, get, make_event_id, resolve_topic, rows_to_batch
from rlstream.schemas.registry import register


def test_coerce_converts_csv_strings_and_keeps_extras_in_metadata():
    row = coerce_row(
        get("prompts"),
        {
            "prompt_id": 12,
            "text": "1+1=",
            "task": "add",
            "difficulty": "3",
            "answer": 2,
            "source": "gsm",
        },
    )
    assert row["prompt_id"] == "12" and row["difficulty"] == 3 and row["answer"] == "2"
    assert json.loads(row["metadata"]) == {"source": "gsm"}


@pytest.mark.parametrize(
    ("row", "message"),
    [
        ({"text": "x", "task": "add"}, "missing required field 'prompt_id'"),
        (
            {"prompt_id": "a", "text": "x", "task": "add", "difficulty": "hard"},
            "field 'difficulty'",
        ),
        ({"prompt_id": "a", "text": ["x"], "task": "add"}, "field 'text': expected a string"),
        ({"prompt_id": "a", "text": "x", "task": "add", "difficulty": True}, "boolean"),
    ],
)
def test_coerce_rejects_bad_rows_naming_the_field(row, message):
    with pytest.raises(RowError, match=message):
        coerce_row(get("prompts"), row)


def test_unknown_fields_are_an_error_without_a_metadata_column():
    with pytest.raises(RowError, match="unknown fields \\['colour'\\]"):
        coerce_row(get("corpus"), {"doc_id": "d", "text": "t", "source": "u", "colour": "red"})


def test_event_ids_are_deterministic_from_content():
    rows = [{"prompt_id": "a", "text": "1+1=", "task": "add"}]
    one = rows_to_batch(get("prompts"), rows, produced_at_ms=1)
    two = rows_to_batch(get("prompts"), rows, produced_at_ms=2)
    other = rows_to_batch(get("prompts"), [{**rows[0], "text": "1+2="}])
    assert one.column("event_id").equals(two.column("event_id"))
    assert not one.column("event_id").equals(other.column("event_id"))
    assert make_event_id("a", 1) == make_event_id("a", 1) != make_event_id("a", 2)


def test_registering_twice_is_an_error():
    with pytest.raises(ValueError, match="already registered"):
        register("prompts", 1, [pa.field("prompt_id", pa.string())], key="prompt_id", partitions=1)


def test_topics_resolve_by_short_or_full_name():
    assert resolve_topic("rollouts") is resolve_topic("rl.rollouts.v1") is get("rollouts")
    for bad in ("rollout", "rl.rollouts.v9", "rl.nothing.v1"):
        with pytest.raises(KeyError):
            resolve_topic(bad)
