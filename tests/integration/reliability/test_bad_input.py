"""Bad input: every sensor rejects it when the DAG is parsed, with an error naming the argument.

One table of (sensor, argument, bad value, words the error must contain). Unknown connection ids
cannot be known at parse time: they end the wait at run time with one clear ``error`` event naming
the argument. A missing extra fails at construction with the ``pip install`` command.
"""

from __future__ import annotations

import datetime as dt
import importlib.util
from typing import Any

import pytest

from airflow_deferrable_kit.extras import MissingExtraError
from airflow_deferrable_kit.sensors.base import DeferrableSensor
from airflow_deferrable_kit.sensors.http import HttpBatchReadySensor
from airflow_deferrable_kit.sensors.kafka import KafkaMessageSensor
from airflow_deferrable_kit.sensors.postgres import PostgresBatchMarkerSensor
from airflow_deferrable_kit.sensors.s3 import S3KeySensor
from airflow_deferrable_kit.sensors.temporal import DateTimeSensor
from airflow_deferrable_kit.testing import assert_defers, make_context, run_trigger

from .conftest import Waits

VALID: dict[type[DeferrableSensor], dict[str, Any]] = {
    S3KeySensor: {"bucket_key": "s3://bucket-ok/key"},
    HttpBatchReadySensor: {"endpoint": "v1/x", "success": [{"path": "state", "equals": "ready"}]},
    PostgresBatchMarkerSensor: {
        "table": "etl.markers",
        "match": {"batch_id": "b"},
        "status_column": "status",
        "ready_values": ["done"],
    },
    KafkaMessageSensor: {"topics": "t", "success": [{"key": "k"}]},
    DateTimeSensor: {"target_time": "2030-01-01T00:00:00+00:00"},
}

# (sensor, overrides, words the message must contain: the argument's name and the bad value)
CASES: list[tuple[type[DeferrableSensor], dict[str, Any], tuple[str, ...]]] = [
    # malformed URIs / endpoints
    (S3KeySensor, {"bucket_key": "s3:/bucket/key"}, ("bucket_key", "s3:/bucket/key")),
    (S3KeySensor, {"bucket_key": "s3://"}, ("bucket_key", "s3://")),
    (S3KeySensor, {"bucket_key": "s3://bucket-ok/"}, ("bucket_key", "s3://bucket-ok/")),
    (S3KeySensor, {"bucket_key": "key/only"}, ("bucket_key", "bucket_name")),
    (HttpBatchReadySensor, {"endpoint": "http://[::1"}, ("endpoint", "http://[::1")),
    (HttpBatchReadySensor, {"endpoint": "https://evil.example/steal"}, ("endpoint", "evil.example")),
    # empty bucket / conn ids
    (S3KeySensor, {"bucket_key": "k", "bucket_name": ""}, ("bucket_name", "''")),
    (S3KeySensor, {"aws_conn_id": ""}, ("aws_conn_id", "''")),
    (HttpBatchReadySensor, {"http_conn_id": ""}, ("http_conn_id", "''")),
    (HttpBatchReadySensor, {"http_conn_id": "   "}, ("http_conn_id", "'   '")),
    (PostgresBatchMarkerSensor, {"postgres_conn_id": ""}, ("postgres_conn_id", "''")),
    (PostgresBatchMarkerSensor, {"postgres_conn_id": "   "}, ("postgres_conn_id", "'   '")),
    (S3KeySensor, {"aws_conn_id": "   "}, ("aws_conn_id", "'   '")),
    (S3KeySensor, {"min_size": -1}, ("min_size", "-1")),
    # SQL injection in identifiers
    (PostgresBatchMarkerSensor, {"table": "markers; drop table x"}, ("table", "drop table")),
    (PostgresBatchMarkerSensor, {"table": '"x"."y"; --'}, ("table",)),
    (PostgresBatchMarkerSensor, {"match": {"batch_id; --": "b"}}, ("match", "batch_id; --")),
    (PostgresBatchMarkerSensor, {"status_column": "status OR 1=1"}, ("status_column", "OR 1=1")),
    (PostgresBatchMarkerSensor, {"order_by": ["created_at; drop table x"]}, ("order_by", "drop table")),
    # bad JSON paths / conditions
    (HttpBatchReadySensor, {"success": [{"path": "state[", "equals": "ready"}]}, ("success[0]", "state[")),
    (HttpBatchReadySensor, {"success": [{"path": "", "equals": "ready"}]}, ("success[0]", "path")),
    (KafkaMessageSensor, {"success": [{"path": "a[", "equals": 1}]}, ("success[0]", "a[")),
    (HttpBatchReadySensor, {"success": [{"path": "$..state", "equals": "ready"}]}, ("success[0]", "$..state")),
    (HttpBatchReadySensor, {"success": [{"path": "items[*].state", "equals": 1}]}, ("success[0]", "[*]")),
    (HttpBatchReadySensor, {"select": ["@.rows"]}, ("select", "@.rows")),
    (PostgresBatchMarkerSensor, {"success": [{"path": "$[?(@.ok)]", "equals": 1}]}, ("success[0]", "$[?(@.ok)]")),
    (HttpBatchReadySensor, {"failure": [{"status": 99}]}, ("failure[0]", "99")),
    (PostgresBatchMarkerSensor, {"success": [{"column": "rows"}]}, ("success[0]",)),
    # bucket names S3 refuses
    (S3KeySensor, {"bucket_key": "s3://bucket..name/k"}, ("bucket_key", "bucket..name", "adjacent dots")),
    (S3KeySensor, {"bucket_key": "k", "bucket_name": "192.168.5.4"}, ("bucket_name", "192.168.5.4", "IP")),
    (S3KeySensor, {"bucket_key": "k", "bucket_name": "Exports"}, ("bucket_name", "Exports", "lowercase")),
    (HttpBatchReadySensor, {"method": "FETCH"}, ("method", "FETCH")),
    (KafkaMessageSensor, {"topics": ""}, ("topics",)),
    (KafkaMessageSensor, {"start_from": "latest-ish"}, ("start_from", "latest-ish")),
    # unparsable datetimes
    (DateTimeSensor, {"target_time": "not a date"}, ("target_time", "not a date")),
    (DateTimeSensor, {"target_time": "9999-12-31T23:00:00-05:00"}, ("target_time", "9999-12-31T23:00:00-05:00")),
    (KafkaMessageSensor, {"start_after": "yesterday"}, ("start_after", "yesterday")),
    (KafkaMessageSensor, {"start_after": -5}, ("start_after", "-5")),
    # zero / negative intervals and budgets
    (DateTimeSensor, {"poke_interval": 0}, ("poke_interval",)),
    (S3KeySensor, {"poke_interval": 0}, ("poke_interval",)),
    (KafkaMessageSensor, {"poke_interval": -1}, ("poke_interval",)),
    (DateTimeSensor, {"timeout": -1}, ("timeout",)),
    (DateTimeSensor, {"timeout": 1e12}, ("timeout", "1000000000000.0")),
    (S3KeySensor, {"timeout": float("inf")}, ("timeout", "inf")),
    (HttpBatchReadySensor, {"timeout": float("nan")}, ("timeout", "nan")),
    (KafkaMessageSensor, {"timeout": True}, ("timeout", "True")),
    (PostgresBatchMarkerSensor, {"timeout": "3600"}, ("timeout", "'3600'")),
    (DateTimeSensor, {"poke_interval": float("inf")}, ("poke_interval", "inf")),
    (S3KeySensor, {"poke_interval": 1e12}, ("poke_interval", "1000000000000.0")),
    (HttpBatchReadySensor, {"max_backoff": float("inf")}, ("max_backoff", "inf")),
    (PostgresBatchMarkerSensor, {"max_backoff": 0}, ("max_backoff", "0")),
    (HttpBatchReadySensor, {"request_timeout": 0}, ("request_timeout", "0")),
    (PostgresBatchMarkerSensor, {"statement_timeout": -1}, ("statement_timeout", "-1")),
]


@pytest.mark.parametrize(
    ("sensor", "overrides", "words"),
    CASES,
    ids=[f"{c[0].__name__}-{'-'.join(c[1])}-{i}" for i, c in enumerate(CASES)],
)
def test_rejected_at_construction_naming_the_argument(
    sensor: type[DeferrableSensor], overrides: dict[str, Any], words: tuple[str, ...]
) -> None:
    with pytest.raises((ValueError, TypeError)) as caught:
        sensor(task_id="bad_input", deferrable=True, **{**VALID[sensor], **overrides})
    for word in words:
        assert word in str(caught.value), (word, str(caught.value))


def test_the_valid_baseline_is_accepted() -> None:
    """The table's base arguments are fine: each case fails because of its one bad argument."""
    for sensor, arguments in VALID.items():
        sensor(task_id="good_input", deferrable=True, **arguments)


@pytest.mark.parametrize(
    ("sensor", "overrides", "argument"),
    [
        (S3KeySensor, {"bucket_key": "k", "bucket_name": "ab"}, "bucket_name"),
        (S3KeySensor, {"bucket_key": "s3://Bad_Bucket!/k"}, "bucket"),
        (KafkaMessageSensor, {"topics": "bad topic!"}, "topics"),
    ],
)
def test_invalid_bucket_and_topic_names_are_rejected_at_construction(
    sensor: type[DeferrableSensor], overrides: dict[str, Any], argument: str
) -> None:
    with pytest.raises(ValueError, match=argument):
        sensor(task_id="bad_name", deferrable=True, **{**VALID[sensor], **overrides})


def test_naive_datetimes_are_read_in_the_default_timezone_not_guessed() -> None:
    """By design (like every Airflow date) a naive moment is read in ``[core] default_timezone``
    (UTC here), never in the machine's local time; the trigger always carries an aware UTC time."""
    for value in ("2030-01-01T00:00:00", dt.datetime(2030, 1, 1)):
        sensor = DateTimeSensor(task_id="naive", deferrable=True, target_time=value)
        trigger = sensor.build_trigger(deadline=None)
        assert trigger.serialize()[1]["target_time"] == "2030-01-01T00:00:00+00:00"


ARGUMENT = {"s3": "aws_conn_id", "http": "http_conn_id", "postgres": "postgres_conn_id", "kafka": "kafka_conn_id"}


@pytest.mark.parametrize("kind", list(ARGUMENT))
async def test_unknown_conn_id_ends_with_one_clear_error_event(kind: str, waits: Waits) -> None:
    sensor = waits.sensor(kind, ready=True)
    setattr(sensor, ARGUMENT[kind], f"no_such_conn_{kind}")
    trigger = assert_defers(sensor, sensor.trigger_class, context=make_context(sensor))

    payload = (await run_trigger(trigger, timeout=60)).payload

    assert payload["status"] == "error", payload
    assert payload["error_type"] == "connection_not_found", payload
    assert f"{ARGUMENT[kind]}='no_such_conn_{kind}'" in payload["message"], payload


@pytest.mark.parametrize("sensor", [S3KeySensor, HttpBatchReadySensor, PostgresBatchMarkerSensor, KafkaMessageSensor])
def test_a_missing_extra_fails_at_construction_with_the_install_command(
    sensor: type[DeferrableSensor], monkeypatch: pytest.MonkeyPatch
) -> None:
    missing = set(sensor.trigger_class.extra_modules)
    assert missing
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name in missing else real(name, *a))
    with pytest.raises(MissingExtraError) as caught:
        sensor(task_id="no_extra", deferrable=True, **VALID[sensor])
    message = str(caught.value)
    assert f"airflow-deferrable-kit[{sensor.trigger_class.extra}]" in message, message
    assert sensor.__name__ in message, message
