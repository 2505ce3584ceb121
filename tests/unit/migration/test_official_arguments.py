"""Official sensors' parameter names: aliases translated, the rest refused at parse with the fix.

Each case builds the real sensor, as a DAG file ported by changing its import would.
"""

from __future__ import annotations

import datetime as dt
from typing import Any

import pytest

from airflow_deferrable_kit.sensors.http import HttpBatchReadySensor
from airflow_deferrable_kit.sensors.kafka import KafkaMessageSensor
from airflow_deferrable_kit.sensors.postgres import PostgresBatchMarkerSensor
from airflow_deferrable_kit.sensors.s3 import S3KeySensor
from airflow_deferrable_kit.sensors.temporal import DateTimeSensor

KEY = "s3://kit-bucket/data/ready.csv"


# ----------------------------------------------------------------------------------- aliases
def test_http_official_names_reach_the_trigger() -> None:
    sensor = HttpBatchReadySensor(
        task_id="http",
        endpoint="batches/1",
        request_params={"day": "2026-01-01"},
        response_error_codes_allowlist=["404", "409"],
    )
    trigger = sensor.build_trigger(deadline=None)
    assert trigger.query == {"day": "2026-01-01"}
    assert trigger.not_yet_codes == [404, 409]
    assert "request_params" not in sensor._BaseOperator__init_kwargs  # type: ignore[attr-defined]


def test_http_official_response_check_ports_unchanged_and_keeps_deferring() -> None:
    sensor = HttpBatchReadySensor(
        task_id="http",
        endpoint="batches/1",
        request_params={"day": "2026-01-01"},
        response_check=lambda response: response.json()["state"] == "ready",
        response_error_codes_allowlist=["404"],
        deferrable=True,
    )
    assert sensor.checks_in_worker() == "response_check"
    trigger = sensor.build_trigger(deadline=None)
    assert trigger.include_response is True  # the event carries the response for the worker
    assert trigger.not_yet_codes == [404]
    with pytest.raises(ValueError, match=r"end_from_trigger=True cannot be combined with.*response_check"):
        HttpBatchReadySensor(task_id="http", endpoint="x", response_check=bool, end_from_trigger=True)
    with pytest.raises(TypeError, match="response_check must be a callable taking the response"):
        HttpBatchReadySensor(task_id="http", endpoint="x", response_check=42)
    with pytest.raises(ValueError, match=r"response_check 'pkg\.mod:fn' cannot be imported"):
        HttpBatchReadySensor(task_id="http", endpoint="x", response_check="pkg.mod:fn")  # judged in the triggerer


def test_sql_conn_id_is_postgres_conn_id() -> None:
    sensor = PostgresBatchMarkerSensor(task_id="sql", conn_id="warehouse", sql="SELECT count(*) FROM t")
    assert sensor.postgres_conn_id == "warehouse"
    assert sensor.build_trigger(deadline=None).postgres_conn_id == "warehouse"


def test_an_alias_and_its_own_name_together_are_refused() -> None:
    with pytest.raises(TypeError, match=r"query= and its official name request_params= are the same parameter"):
        HttpBatchReadySensor(task_id="http", endpoint="x", query={"a": 1}, request_params={"a": 2})


def test_aliases_are_templated_like_their_own_names() -> None:
    sensor = HttpBatchReadySensor(task_id="http", endpoint="x", request_params={"day": "{{ ds }}"})
    assert "query" in sensor.template_fields
    assert sensor.query == {"day": "{{ ds }}"}


# -------------------------------------------------------------- official defaults are no-ops
@pytest.mark.parametrize(
    ("sensor_class", "required", "official_defaults"),
    [
        (
            HttpBatchReadySensor,
            {"endpoint": "x"},
            {
                "headers": None,
                "extra_options": {},
                "request_kwargs": None,
                "tcp_keep_alive": True,
                "tcp_keep_alive_idle": 120,
                "tcp_keep_alive_count": 20,
                "tcp_keep_alive_interval": 30,
            },
        ),
        (PostgresBatchMarkerSensor, {"sql": "SELECT 1"}, {"fail_on_empty": False, "hook_params": None}),
        (KafkaMessageSensor, {"topics": ["orders"]}, {"commit_offset": False, "poll_timeout": 1}),
        (
            S3KeySensor,
            {"bucket_key": KEY},
            {"verify": None, "use_regex": False, "metadata_keys": None, "region_name": None, "botocore_config": None},
        ),
        (S3KeySensor, {"bucket_key": KEY}, {"verify": True}),
        (
            DateTimeSensor,
            {"target_time": "2030-01-01T00:00:00+00:00"},
            {"start_from_trigger": False, "trigger_kwargs": None},
        ),
    ],
)
def test_official_defaults_spelt_out_are_accepted(
    sensor_class: type[Any], required: dict[str, Any], official_defaults: dict[str, Any]
) -> None:
    sensor = sensor_class(task_id="ported", **required, **official_defaults)
    kept = set(sensor._BaseOperator__init_kwargs) & set(official_defaults)
    assert kept <= sensor_class.accepted_parameter_names()


# ------------------------------------------------------------------------------- refusals
REFUSED = [
    (
        HttpBatchReadySensor,
        {"endpoint": "x", "headers": {"X-Token": "t"}},
        r"headers= of the official HttpSensor.*plain text in the trigger table",
    ),
    (
        HttpBatchReadySensor,
        {"endpoint": "x", "extra_options": {"verify": False}},
        r"extra_options=.*connection extras \('verify'",
    ),
    (HttpBatchReadySensor, {"endpoint": "x", "request_kwargs": {"data": "x"}}, r"request_kwargs=.*json_body="),
    (HttpBatchReadySensor, {"endpoint": "x", "tcp_keep_alive": False}, r"tcp_keep_alive=.*no equivalent"),
    (HttpBatchReadySensor, {"endpoint": "x", "tcp_keep_alive_idle": 5}, r"tcp_keep_alive_idle=.*no equivalent"),
    (
        PostgresBatchMarkerSensor,
        {"sql": "SELECT 1 FROM t WHERE a = %s AND b = %(b)s", "parameters": [1, 2]},
        r"write the statement as 'SELECT 1 FROM t WHERE a = \$1 AND b = \$2'",
    ),
    (
        PostgresBatchMarkerSensor,
        {"sql": "SELECT 1 FROM t WHERE a = $1", "parameters": {"a": 1}},
        r"parameters is a list bound to \$1, \$2.*\('a'\)",
    ),
    (
        PostgresBatchMarkerSensor,
        {"sql": "SELECT 1", "success": bool},
        r"success= of the official SqlSensor.*predicate=",
    ),
    (
        PostgresBatchMarkerSensor,
        {"sql": "SELECT 1", "failure": bool},
        r"failure= of the official SqlSensor.*failure=\[\{'column'",
    ),
    (
        PostgresBatchMarkerSensor,
        {"sql": "SELECT 1", "selector": lambda row: row[1]},
        r"selector=.*success=\[\{'column': 'name'",
    ),
    (PostgresBatchMarkerSensor, {"sql": "SELECT 1", "fail_on_empty": True}, r"fail_on_empty=.*no row means 'not yet'"),
    (
        PostgresBatchMarkerSensor,
        {"sql": "SELECT 1", "hook_params": {"log_sql": False}},
        r"hook_params=.*postgres_conn_id",
    ),
    (
        KafkaMessageSensor,
        {"topics": ["orders"], "commit_offset": True},
        r"commit_offset= of the official AwaitMessageSensor.*group_id='\.\.\.' and commit_on_match=True",
    ),
    (
        KafkaMessageSensor,
        {"topics": ["orders"], "event_triggered_function": print},
        r"event_triggered_function=.*AwaitMessageTriggerFunctionSensor never ends.*AssetWatcher",
    ),
    (KafkaMessageSensor, {"topics": "^orders-.*"}, r"topics=.*'\^orders-\.\*' is a topic pattern.*list the topic"),
    (KafkaMessageSensor, {"topics": ["orders"], "poll_timeout": -1}, r"poll_timeout=.*a number >= 0\), got -1"),
    (S3KeySensor, {"bucket_key": KEY, "use_regex": True}, r"use_regex=.*wildcard_match=True"),
    (S3KeySensor, {"bucket_key": KEY, "metadata_keys": ["*"]}, r"metadata_keys=.*etag"),
    (S3KeySensor, {"bucket_key": KEY, "verify": False}, r"verify=.*extras of the aws connection"),
    (S3KeySensor, {"bucket_key": KEY, "verify": "/etc/ssl/ca.pem"}, r"verify=.*extras of the aws connection"),
    (S3KeySensor, {"bucket_key": KEY, "region_name": "eu-west-1"}, r"region_name=.*'region_name' in the extras"),
    (S3KeySensor, {"bucket_key": KEY, "botocore_config": {"retries": {}}}, r"botocore_config=.*config_kwargs"),
]


@pytest.mark.parametrize(("sensor_class", "arguments", "message"), REFUSED)
def test_official_parameters_without_an_equivalent_are_refused_naming_the_fix(
    sensor_class: type[Any], arguments: dict[str, Any], message: str
) -> None:
    with pytest.raises(TypeError, match=message) as refused:
        sensor_class(task_id="ported", **arguments)
    assert f"{sensor_class.__name__} (task_id='ported')" in str(refused.value)
    assert "Invalid arguments" not in str(refused.value)


def test_percent_signs_in_literals_and_comments_are_not_placeholders() -> None:
    sql = "SELECT 1 FROM t WHERE name LIKE '%sales%' AND id = $1 -- was %s\n/* %(x)s */ AND \"%s\" IS NOT NULL"
    sensor = PostgresBatchMarkerSensor(task_id="sql", sql=sql, parameters=[1])
    assert sensor.sql == sql


def test_kit_conditions_under_official_names_stay_accepted() -> None:
    sensor = PostgresBatchMarkerSensor(
        task_id="sql", sql="SELECT state FROM runs", success=[{"column": "state", "equals": "done"}]
    )
    assert sensor.success == [{"column": "state", "equals": "done"}]


def test_official_names_from_a_dag_are_translated_within_it() -> None:
    from airflow.sdk import DAG

    with DAG("ported", schedule=None, start_date=dt.datetime(2026, 1, 1)):
        sensor = PostgresBatchMarkerSensor(task_id="sql", conn_id="warehouse", sql="SELECT 1")
    assert sensor.postgres_conn_id == "warehouse"


def test_kafka_official_names_reach_the_trigger() -> None:
    sensor = KafkaMessageSensor(
        task_id="kafka",
        kafka_config_id="events",
        topics=["orders"],
        apply_function="my_dags.checks.is_ready",
        apply_function_args=("a",),
        apply_function_kwargs={"prefix": "{{ ds }}"},
        poll_interval=5,
        poll_timeout=1,
        xcom_push_key="retrieved_message",
    )
    trigger = sensor.build_trigger(deadline=None)
    assert (trigger.kafka_conn_id, trigger.predicate, trigger.predicate_receives) == (
        "events",
        "my_dags.checks.is_ready",
        "message",
    )
    assert (trigger.predicate_args, trigger.predicate_kwargs) == (["a"], {"prefix": "{{ ds }}"})
    assert sensor.poke_interval == 5
    assert sensor.xcom_push_key == "retrieved_message"
    assert {"predicate", "predicate_args", "predicate_kwargs"} <= set(sensor.template_fields)


@pytest.mark.parametrize(
    ("arguments", "message"),
    [
        ({"apply_function": print}, r"apply_function must be a dotted path string.*builtin_function_or_method"),
        ({"apply_function": "m.f", "predicate": "m.g"}, r"give predicate= .* or the official apply_function="),
        ({"xcom_push_key": "k", "end_from_trigger": True}, r"xcom_push_key needs the task to resume in a worker"),
    ],
)
def test_kafka_official_names_that_cannot_hold_are_refused(arguments: dict[str, Any], message: str) -> None:
    with pytest.raises((TypeError, ValueError), match=message):
        KafkaMessageSensor(task_id="kafka", topics=["orders"], **arguments)
