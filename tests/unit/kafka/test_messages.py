"""Kafka messages and conditions: sugar, evaluation order, the index keys, decoding problems, caps."""

from __future__ import annotations

import json

import pytest

from airflow_deferrable_kit._kafka.messages import KafkaMessage, canonical_acceptors
from tests.unit.kafka.fakes import record, spec


def test_sugar_becomes_canonical_acceptors() -> None:
    acceptors = canonical_acceptors(
        success=[{"key": "b-1"}, {"header": "event", "equals": "done"}, {"value": ["a", "b"]}],
        failure=[{"path": "state", "in": ["failed"]}],
    )
    assert acceptors == [
        {"state": "failure", "matcher": "path", "comparator": "in", "argument": "state", "expected": ["failed"]},
        {"state": "success", "matcher": "key", "comparator": "equals", "expected": "b-1"},
        {"state": "success", "matcher": "header", "comparator": "equals", "argument": "event", "expected": "done"},
        {"state": "success", "matcher": "value", "comparator": "in", "expected": ["a", "b"]},
    ]
    with pytest.raises(ValueError, match=r"success\[0\]"):
        canonical_acceptors(success=[{"key": "x", "path": "y"}])


def test_evaluation_follows_acceptor_order_and_predicate_rules() -> None:
    message = KafkaMessage(record(b'{"state": "running", "id": 1}', headers=[("e", b"x")]))
    retry_first = spec(
        canonical_acceptors(
            acceptors=[{"state": "retry", "matcher": "path", "argument": "state", "expected": "running"}],
            success=[{"path": "id", "equals": 1}],
        )
    )
    assert retry_first.evaluate(message) is None
    success = spec(canonical_acceptors(success=[{"path": "id", "equals": 1}]))
    outcome = success.evaluate(message)
    assert outcome is not None and outcome[0] == "success"
    with_predicate = spec(canonical_acceptors(success=[{"path": "id", "equals": 1}]), predicate="m:f")
    assert with_predicate.evaluate(message)[0] == "predicate"  # type: ignore[index]
    only_predicate = spec([], predicate="m:f")
    assert only_predicate.evaluate(message) == ("predicate", None)
    assert spec([]).evaluate(message) == ("success", None)  # no condition: any message


def test_index_keys_distinguish_json_types() -> None:
    keys = spec(canonical_acceptors(success=[{"path": "id", "in": [1, True, "1"]}])).index_keys()
    assert keys is not None and len({value for _, value in keys}) == 3
    assert spec(canonical_acceptors(success=[{"path": "id", "exists": True}])).index_keys() is None
    assert spec([], predicate="m:f").index_keys() is None
    assert spec(canonical_acceptors(success=[{"path": "id", "equals": [1]}])).index_keys() is None


def test_message_problems_depend_on_the_format() -> None:
    assert KafkaMessage(record(None)).problem("bytes") == "tombstone"
    assert KafkaMessage(record(b"\xff")).problem("text") == "undecodable"
    assert KafkaMessage(record(b"\xff")).problem("bytes") is None
    assert KafkaMessage(record(b"hello")).problem("json") == "malformed"
    assert KafkaMessage(record(b"hello")).problem("text") is None
    assert KafkaMessage(record(b"Infinity")).problem("json") == "malformed"


def test_payload_caps_escape_heavy_values() -> None:
    value = json.dumps({"text": "\u00e9" * 40_000}, ensure_ascii=False).encode()
    payload = KafkaMessage(record(value, key=b"\xff" * 3000, headers=[("h", b"\x00" * 2000)])).payload("json")
    assert payload["value_truncated"] is True
    assert len(json.dumps(payload)) < 48_000
    assert payload["key"].startswith("\\xff")


def test_key_cap_keeps_what_fits_even_when_every_character_is_escaped() -> None:
    fits, too_long = "\U0001f600" * 85, "\U0001f600" * 86  # 12 characters each once escaped
    assert KafkaMessage(record(b"{}", key=fits.encode())).payload("json")["key"] == fits
    assert KafkaMessage(record(b"{}", key=too_long.encode())).payload("json")["key"] != too_long
