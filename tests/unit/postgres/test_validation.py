"""Construction-time checks, the compiled SQL, serialization, and the pure helpers (no server)."""

from __future__ import annotations

import json
from typing import Any

import pytest

from airflow_deferrable_kit.payload import MAX_PAYLOAD_BYTES, build_payload
from airflow_deferrable_kit.sensors.postgres import PostgresBatchMarkerSensor
from airflow_deferrable_kit.triggers.postgres import (
    PostgresBatchMarkerTrigger,
    cap_row,
    compile_marker_query,
    value_in_row,
)

DECLARATIVE: dict[str, Any] = {
    "postgres_conn_id": "warehouse",
    "table": "etl.batch_markers",
    "match": {"batch_id": "orders", "batch_date": "2024-01-31"},
    "status_column": "status",
    "ready_values": ["done", "published"],
    "failed_values": ["failed"],
}
CUSTOM: dict[str, Any] = {
    "postgres_conn_id": "warehouse",
    "sql": "SELECT state, rows FROM etl.batches WHERE name = $1 AND day = $2",
    "parameters": ["orders", "2024-01-31"],
    "success": [{"column": "state", "equals": "ready"}],
    "failure": [{"column": "state", "in": ["failed", "cancelled"]}],
    "retry": [{"path": "rows", "equals": 0}],
}

INJECTIONS = [
    "markers; DROP TABLE users",
    'markers" OR 1=1 --',
    "markers--",
    "1markers",
    "a.b.c",
    "",
    "mark ers",
    "markers/*x*/",
]


@pytest.mark.parametrize("table", INJECTIONS)
def test_injection_in_table_is_rejected_by_the_trigger_and_the_sensor(table: str) -> None:
    with pytest.raises(ValueError, match="table"):
        PostgresBatchMarkerTrigger(table=table)
    with pytest.raises(ValueError, match="table"):
        PostgresBatchMarkerSensor(task_id="t", table=table)


@pytest.mark.parametrize(
    ("arguments", "named"),
    [
        ({"match": {"id = 1 OR 1=1 --": 1}}, "match key"),
        ({"match": {'batch"; DROP TABLE x; --': 1}}, "match key"),
        ({"status_column": "status; DELETE FROM x", "ready_values": ["done"]}, "status_column"),
        ({"order_by": ["created_at; DROP TABLE x"]}, r"order_by\[0\]"),
        ({"order_by": ["created_at desc nulls first"]}, r"order_by\[0\]"),
        ({"notify_channel": "chan; NOTIFY other"}, "notify_channel"),
    ],
)
def test_injection_in_other_identifiers_is_rejected(arguments: dict[str, Any], named: str) -> None:
    with pytest.raises(ValueError, match=named):
        PostgresBatchMarkerTrigger(table="markers", **arguments)
    with pytest.raises(ValueError, match=named):
        PostgresBatchMarkerSensor(task_id="t", table="markers", **arguments)


def test_identifiers_are_checked_at_parse_even_when_other_arguments_are_templates() -> None:
    # A template elsewhere postpones the full check to run time; identifiers are still checked now.
    with pytest.raises(ValueError, match="match key"):
        PostgresBatchMarkerSensor(task_id="t", table="markers", match={"day; DROP TABLE x": "{{ ds }}"})
    with pytest.raises(ValueError, match="status_column"):
        PostgresBatchMarkerSensor(
            task_id="t", table="markers", match={"day": "{{ ds }}"}, status_column="x y", ready_values=["ok"]
        )
    sensor = PostgresBatchMarkerSensor(task_id="t", table="markers_{{ ds_nodash }}", match={"day": "{{ ds }}"})
    assert sensor.table == "markers_{{ ds_nodash }}"


@pytest.mark.parametrize(
    ("arguments", "named"),
    [
        ({}, "exactly one of table"),
        ({"table": "m", "sql": "select 1"}, "exactly one of table"),
        ({"sql": "  ;  "}, "sql must be a non-empty"),
        ({"table": "m", "parameters": [1]}, "parameters is only used with sql"),
        ({"sql": "select 1", "match": {"a": 1}}, "match is only used with table"),
        ({"sql": "select 1", "status_column": "s"}, "status_column is only used with table"),
        ({"table": "m", "status_column": "s"}, "status_column needs ready_values"),
        ({"table": "m", "ready_values": ["ok"]}, "ready_values needs status_column"),
        ({"table": "m", "status_column": "s", "ready_values": "ok"}, "ready_values must be a list"),
        ({"table": "m", "status_column": "s", "ready_values": [{"a": 1}]}, r"ready_values\[0\]"),
        ({"table": "m", "match": {"a": {"b": 1}}}, r"match\['a'\]"),
        ({"table": "m", "match": {"a": []}}, "empty list"),
        ({"table": "m", "match": ["a"]}, "match must be an object"),
        ({"table": "m", "order_by": "created_at"}, "order_by must be a list"),
        ({"table": "m", "statement_timeout": 0}, "statement_timeout"),
        ({"table": "m", "postgres_conn_id": ""}, "postgres_conn_id"),
        ({"table": "m", "predicate": "not a path"}, "predicate"),
        ({"table": "m", "success": [{"column": "state"}]}, r"success\[0\]"),
        ({"table": "m", "failure": [{"header": "x", "equals": 1}]}, r"failure\[0\]"),
        ({"sql": "select 1", "parameters": "abc"}, "parameters must be a list"),
        ({"sql": "select 1", "success": {"column": "a", "equals": 1}}, "success must be a list"),
    ],
)
def test_bad_arguments_fail_at_construction_naming_the_argument(arguments: dict[str, Any], named: str) -> None:
    with pytest.raises(ValueError, match=named):
        PostgresBatchMarkerTrigger(**arguments)


def test_sensor_reports_bad_arguments_when_the_dag_is_parsed() -> None:
    with pytest.raises(ValueError, match="status_column needs ready_values"):
        PostgresBatchMarkerSensor(task_id="t", table="m", status_column="status")
    with pytest.raises(TypeError, match="Invalid arguments"):
        PostgresBatchMarkerSensor(task_id="t", table="m", dsn="postgresql://u:p@h/db")  # type: ignore[call-arg]


@pytest.mark.parametrize("arguments", [DECLARATIVE, CUSTOM], ids=["declarative", "custom"])
def test_serialize_round_trips_exactly_and_is_json(arguments: dict[str, Any]) -> None:
    trigger = PostgresBatchMarkerTrigger(**arguments, notify_channel="batches", poll_interval=5.0)
    classpath, kwargs = trigger.serialize()
    assert classpath == "airflow_deferrable_kit.triggers.postgres.PostgresBatchMarkerTrigger"
    assert json.loads(json.dumps(kwargs)) == kwargs
    rebuilt = PostgresBatchMarkerTrigger(**json.loads(json.dumps(kwargs)))
    assert rebuilt == trigger
    assert rebuilt.serialize() == (classpath, kwargs)


def test_declarative_form_compiles_to_quoted_identifiers_and_bound_values() -> None:
    sql, args, labels = compile_marker_query(
        table="etl.batch_markers",
        match={"batch_id": "o'rders; DROP TABLE x", "region": ["eu", "us"], "deleted_at": None},
        status_column="status",
        ready_values=["done"],
        failed_values=["failed", "aborted"],
    )
    assert sql == (
        'SELECT * FROM "etl"."batch_markers" WHERE "batch_id" = $1 AND "region" IN ($2, $3) '
        'AND "deleted_at" IS NULL ORDER BY CASE WHEN "status" IN ($4) THEN 0 '
        'WHEN "status" IN ($5, $6) THEN 1 ELSE 2 END LIMIT 1'
    )
    assert args == ["o'rders; DROP TABLE x", "eu", "us", "done", "failed", "aborted"]
    assert labels[0] == "match['batch_id']" and labels[5] == "failed_values[1]"
    sql, args, _ = compile_marker_query(
        table="m", match={"a": 1}, status_column="s", ready_values=["ok"], order_by=["created_at desc", "id"]
    )
    assert sql == 'SELECT * FROM "m" WHERE "a" = $1 ORDER BY "created_at" DESC, "id" ASC LIMIT 1'
    assert args == [1]


def test_declarative_status_becomes_acceptors_ahead_of_user_ones() -> None:
    trigger = PostgresBatchMarkerTrigger(**DECLARATIVE, success=[{"path": "meta.ok", "equals": True}])
    assert [a.as_dict() for a in trigger._conditions.acceptors] == [
        {"state": "failure", "matcher": "column", "argument": "status", "comparator": "in", "expected": ["failed"]},
        {
            "state": "success",
            "matcher": "column",
            "argument": "status",
            "comparator": "in",
            "expected": ["done", "published"],
        },
        {"state": "success", "matcher": "path", "argument": "meta.ok", "comparator": "equals", "expected": True},
    ]


def test_a_huge_row_is_capped_to_fit_the_payload() -> None:
    row = {"id": 1, "blob": "x" * 200_000, **{f"c{i}": "y" * 1500 for i in range(40)}}
    capped, truncated, omitted = cap_row(row)
    assert truncated == ["blob"]
    assert capped["id"] == 1 and capped["blob"].startswith("xxx") and "more characters" in capped["blob"]
    assert omitted and omitted[-1] == "c39"
    payload = build_payload("success", {"row": capped, "truncated_columns": truncated, "omitted_columns": omitted})
    assert len(json.dumps(payload)) < MAX_PAYLOAD_BYTES
    small = {"id": 1, "status": "done"}
    assert cap_row(small) == (small, [], [])


def test_missing_asyncpg_is_a_clear_error_at_construction(monkeypatch: pytest.MonkeyPatch) -> None:
    import importlib.util

    from airflow_deferrable_kit.extras import MissingExtraError

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "asyncpg" else real(name, *a))
    with pytest.raises(MissingExtraError, match=r"airflow-deferrable-kit\[postgres\]"):
        PostgresBatchMarkerSensor(task_id="t", table="m")


@pytest.mark.parametrize(
    ("conditions", "named"),
    [
        ({"success": [{"column": "rows"}]}, "success[0] needs one of equals, in, exists"),
        ({"failure": [{"column": "error", "equals": 1, "bogus": 2}]}, "failure[0]: unexpected keys ['bogus']"),
        ({"success": [{"column": "rows", "equals": 1}, {"path": "$..ok", "equals": 1}]}, "success[1]: argument"),
    ],
)
def test_a_bad_condition_next_to_status_column_is_named_by_the_users_own_entry(
    conditions: dict[str, Any], named: str
) -> None:
    """The rules derived from status_column used to be put at index 0 of success / failure first,
    so the user's ``success[0]`` was reported as ``success[1]``."""
    for build in (PostgresBatchMarkerTrigger, lambda **kw: PostgresBatchMarkerSensor(task_id="t", **kw)):
        with pytest.raises(ValueError) as caught:
            build(**DECLARATIVE, **conditions)
        assert str(caught.value).startswith(named), str(caught.value)


def test_status_column_rules_still_come_first_in_their_groups() -> None:
    trigger = PostgresBatchMarkerTrigger(
        **DECLARATIVE,
        success=[{"path": "meta.ok", "equals": True}],
        failure=[{"column": "error", "exists": True}],
        retry=[{"column": "rows", "equals": 0}],
    )
    order = [(a.state, a.matcher, a.argument) for a in trigger._conditions.acceptors]
    assert order == [
        ("failure", "column", "status"),
        ("failure", "column", "error"),
        ("retry", "column", "rows"),
        ("success", "column", "status"),
        ("success", "path", "meta.ok"),
    ]


def test_a_jsonpath_rooted_path_reaches_into_the_row() -> None:
    """``$.meta.state`` used to be read as the column "$" and never matched."""
    trigger = PostgresBatchMarkerTrigger(sql="SELECT * FROM m", success=[{"path": "$.meta.state", "equals": "done"}])
    (acceptor,) = trigger._conditions.acceptors
    assert value_in_row({"meta": {"state": "done"}}, acceptor) == "done"
