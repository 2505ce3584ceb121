"""The Kafka trigger's kwargs: round trip, the fixed start moment, validation, and error mapping."""

from __future__ import annotations

import json
from typing import Any

import pytest
from aiokafka import errors

from airflow_deferrable_kit._kafka.consumers import classify_kafka_error
from airflow_deferrable_kit._kafka.messages import canonical_acceptors
from airflow_deferrable_kit.errors import FatalError, TransientError
from airflow_deferrable_kit.triggers.kafka import KafkaMessageTrigger


def test_round_trip_is_exact_and_json_only() -> None:
    trigger = KafkaMessageTrigger(
        topics="orders",
        kafka_conn_id="kafka_prod",
        acceptors=canonical_acceptors(success=[{"key": "batch-42"}], failure=[{"path": "state", "in": ["failed"]}]),
        predicate="tests.integration.kafka.predicates:total_over_100",
        start_from="committed",
        group_id="airflow-waits",
        start_after_ms=1_700_000_000_000,
        poll_interval=5,
        deadline="2030-01-01T00:00:00+00:00",
    )
    classpath, kwargs = trigger.serialize()
    assert classpath == "airflow_deferrable_kit.triggers.kafka.KafkaMessageTrigger"
    assert kwargs["topics"] == ["orders"]
    again = KafkaMessageTrigger(**json.loads(json.dumps(kwargs)))
    assert again == trigger and again.serialize() == (classpath, kwargs)


def test_start_moment_is_fixed_when_built_and_kept_in_kwargs() -> None:
    trigger = KafkaMessageTrigger(topics=["t"])
    assert isinstance(trigger.start_after_ms, int) and trigger.start_after_ms > 1_600_000_000_000
    assert KafkaMessageTrigger(**trigger.serialize()[1]).start_after_ms == trigger.start_after_ms
    assert KafkaMessageTrigger(topics=["t"], start_from="earliest").start_after_ms is None


def test_start_offsets_travel_as_json_with_string_partitions() -> None:
    trigger = KafkaMessageTrigger(topics=["t", "u"], start_offsets={"t": {0: 5, "1": 7}})
    assert trigger.start_offsets == {"t": {"0": 5, "1": 7}} and trigger.start_after_ms is None
    kwargs = json.loads(json.dumps(trigger.serialize()[1]))
    assert kwargs["start_offsets"] == {"t": {"0": 5, "1": 7}}
    assert KafkaMessageTrigger(**kwargs) == trigger


@pytest.mark.parametrize(
    ("kwargs", "argument"),
    [
        ({"topics": []}, "topics"),
        ({"topics": 7}, "^topics"),
        ({"topics": None}, "^topics"),
        ({"topics": {"orders": 1}}, "^topics"),
        ({"topics": ["a"], "kafka_conn_id": "   "}, "^kafka_conn_id"),
        ({"topics": ["a", "a"]}, "topics"),
        ({"topics": [" a"]}, "topics"),
        ({"topics": ["a"], "kafka_conn_id": ""}, "kafka_conn_id"),
        ({"topics": ["a"], "value_format": "avro"}, "value_format"),
        ({"topics": ["a"], "start_from": "latest"}, "start_from"),
        ({"topics": ["a"], "start_from": "committed"}, "group_id"),
        ({"topics": ["a"], "start_after_ms": -1}, "start_after_ms"),
        ({"topics": ["a"], "start_after_ms": True}, "start_after_ms"),
        ({"topics": ["a"], "start_offsets": {"a": {"0": -1}}}, "start_offsets"),
        ({"topics": ["a"], "start_offsets": {"a": {"p0": 1}}}, "start_offsets"),
        ({"topics": ["a"], "start_offsets": {"a": [1, 2]}}, "start_offsets"),
        ({"topics": ["a"], "start_offsets": {"a": {"0": True}}}, "start_offsets"),
        ({"topics": ["a"], "start_offsets": [1]}, "start_offsets"),
        ({"topics": ["a"], "start_offsets": {}, "start_after_ms": 1}, "not both"),
        ({"topics": ["a"], "start_offsets": {}, "start_from": "earliest"}, "start_offsets"),
        ({"topics": ["a"], "predicate": "not a path"}, "predicate"),
        ({"topics": ["a"], "acceptors": [{"state": "success", "matcher": "offset", "expected": 1}]}, "matcher"),
        (
            {"topics": ["a"], "acceptors": [{"state": "failure", "matcher": "key", "expected": "x"}]},
            "could never succeed",
        ),
        (
            {
                "topics": ["a"],
                "value_format": "bytes",
                "acceptors": canonical_acceptors(success=[{"path": "a", "equals": 1}]),
            },
            "value_format",
        ),
        (
            {
                "topics": ["a"],
                "value_format": "text",
                "acceptors": canonical_acceptors(success=[{"path": "a", "equals": 1}]),
            },
            "value_format 'json'",
        ),
        ({"topics": ["a"], "wait_for_topic": "yes"}, "wait_for_topic"),
        ({"topics": ["a"], "predicate": "m.f", "predicate_receives": "record"}, "^predicate_receives"),
        ({"topics": ["a"], "predicate": "m.f", "predicate_args": {"a": 1}}, "^predicate_args must be a list"),
        ({"topics": ["a"], "predicate": "m.f", "predicate_kwargs": [1]}, "^predicate_kwargs must be a dict"),
        ({"topics": ["a"], "predicate_kwargs": {"a": 1}}, "give predicate too"),
    ],
)
def test_bad_input_names_the_argument(kwargs: dict[str, Any], argument: str) -> None:
    with pytest.raises(ValueError, match=argument):
        KafkaMessageTrigger(**kwargs)


def test_the_trigger_maps_kafka_errors_and_falls_back_to_the_base_for_others() -> None:
    assert classify_kafka_error(ValueError("x")) is None
    refused = KafkaMessageTrigger(topics=["t"]).classify_error(errors.SaslAuthenticationFailed("bad password"))
    assert isinstance(refused, FatalError) and refused.error_type == "authentication"
    assert isinstance(KafkaMessageTrigger(topics=["t"]).classify_error(ConnectionResetError()), TransientError)


def test_a_confluent_style_message_shows_the_record_as_confluent_kafka_does() -> None:
    from types import SimpleNamespace

    from airflow_deferrable_kit._kafka.messages import ConfluentStyleMessage, KafkaMessage

    record = SimpleNamespace(
        topic="orders", partition=2, offset=7, timestamp=1_700_000_000_000, key=b"k1", value=b'{"n": 5}', headers=[]
    )
    message = ConfluentStyleMessage(KafkaMessage(record))
    assert (message.topic(), message.partition(), message.offset()) == ("orders", 2, 7)
    assert (message.key(), message.value(), len(message)) == (b"k1", b'{"n": 5}', 8)
    assert message.headers() is None and message.error() is None  # confluent: None when there are none
    assert message.timestamp() == (ConfluentStyleMessage.TIMESTAMP_CREATE_TIME, 1_700_000_000_000)
    unstamped = ConfluentStyleMessage(KafkaMessage(SimpleNamespace(**{**vars(record), "timestamp": None})))
    assert unstamped.timestamp() == (ConfluentStyleMessage.TIMESTAMP_NOT_AVAILABLE, -1)
