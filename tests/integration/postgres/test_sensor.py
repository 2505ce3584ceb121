"""The sensor: poke mode through the same check, deferral, templates, and the example DAG."""

from __future__ import annotations

import importlib.util
import json
import threading
from typing import Any

import pytest
from airflow.sdk.exceptions import AirflowSensorTimeout

from airflow_deferrable_kit.sensors.base import WaitFailedError
from airflow_deferrable_kit.sensors.postgres import PostgresBatchMarkerSensor
from airflow_deferrable_kit.testing import assert_defers, make_context
from airflow_deferrable_kit.triggers.postgres import PostgresBatchMarkerTrigger
from scripts import services
from tests import REPO

from .helpers import ConnSetter, unique

EXAMPLE_DAG = REPO / "dags" / "example_postgres.py"


@pytest.fixture
def table(postgres_server: services.Postgres) -> Any:
    name = unique("sensor_markers")
    postgres_server.psql(f"CREATE TABLE {name} (batch_id text, batch_date date, status text)")
    yield name
    postgres_server.psql(f"DROP TABLE {name}")


def sensor(conn_id: str, table: str, **kwargs: Any) -> PostgresBatchMarkerSensor:
    arguments: dict[str, Any] = {
        "task_id": "wait_marker",
        "postgres_conn_id": conn_id,
        "table": table,
        "match": {"batch_id": "orders"},
        "status_column": "status",
        "ready_values": ["done"],
        "failed_values": ["failed"],
        "poke_interval": 0.1,
        "timeout": 30,
    }
    arguments.update(kwargs)
    return PostgresBatchMarkerSensor(**arguments)


def test_poke_mode_waits_for_the_row_through_the_same_check(
    postgres_server: services.Postgres, conn_id: str, table: str
) -> None:
    task = sensor(conn_id, table, deferrable=False)
    assert task.poke(make_context(task)) is False
    outcome: dict[str, Any] = {}

    def run() -> None:
        outcome["xcom"] = task.execute(make_context(task))

    worker = threading.Thread(target=run)
    worker.start()
    postgres_server.psql(f"INSERT INTO {table} VALUES ('orders', '2024-01-31', 'running')")
    postgres_server.psql(f"UPDATE {table} SET status = 'done'")
    worker.join(timeout=30)
    assert not worker.is_alive()
    assert outcome["xcom"]["status"] == "success"
    assert outcome["xcom"]["row"] == {"batch_id": "orders", "batch_date": "2024-01-31", "status": "done"}


def test_poke_mode_fails_on_a_failed_marker_even_with_soft_fail(
    postgres_server: services.Postgres, conn_id: str, table: str
) -> None:
    postgres_server.psql(f"INSERT INTO {table} VALUES ('orders', null, 'failed')")
    task = sensor(conn_id, table, deferrable=False, soft_fail=True)
    with pytest.raises(WaitFailedError, match="condition_failed"):
        task.execute(make_context(task))


def test_poke_mode_times_out(conn_id: str, table: str) -> None:
    task = sensor(conn_id, table, deferrable=False, timeout=0.3)
    with pytest.raises(AirflowSensorTimeout):
        task.execute(make_context(task))


def test_deferrable_sensor_defers_with_no_secret_in_the_trigger_kwargs(
    connect: ConnSetter, table: str, postgres_server: services.Postgres
) -> None:
    conn_id = connect(password="hunter2-very-secret")
    task = sensor(conn_id, table, deferrable=True, notify_channel="adk_markers")
    trigger = assert_defers(task, PostgresBatchMarkerTrigger)
    _, kwargs = trigger.serialize()
    text = json.dumps(kwargs)
    assert "hunter2" not in text and "password" not in text and str(postgres_server.port) not in text
    assert kwargs["postgres_conn_id"] == conn_id and kwargs["notify_channel"] == "adk_markers"
    assert trigger.deadline is not None and kwargs["poll_interval"] == 0.1
    # Already there? The look before deferring finishes in the worker, no trigger round trip.
    postgres_server.psql(f"INSERT INTO {table} VALUES ('orders', null, 'done')")
    assert task.execute(make_context(task))["row"]["status"] == "done"


def test_error_event_fails_the_task_even_with_soft_fail(conn_id: str, table: str) -> None:
    task = sensor(conn_id, table, deferrable=True, soft_fail=True)
    event = {
        "status": "error",
        "error_type": "not_found",
        "sqlstate": "42P01",
        "condition": "undefined_table",
        "message": "relation does not exist",
    }
    with pytest.raises(WaitFailedError, match="not_found: relation does not exist"):
        task.execute_complete(make_context(task), event)


def test_templates_render_and_dates_bind(postgres_server: services.Postgres, conn_id: str, table: str) -> None:
    postgres_server.psql(f"INSERT INTO {table} VALUES ('orders', '2024-01-31', 'done')")
    task = sensor(
        conn_id,
        "{{ params.table }}",
        match={"batch_id": "orders", "batch_date": "{{ ds }}"},
        deferrable=False,
        params={"table": table},
    )
    context = make_context(task, ds="2024-01-31", params={"table": table})
    task.render_template_fields(context)
    assert task.table == table and task.match == {"batch_id": "orders", "batch_date": "2024-01-31"}
    assert task.execute(context)["row"]["batch_date"] == "2024-01-31"


def test_a_rendered_identifier_is_still_validated(conn_id: str) -> None:
    task = sensor(conn_id, "{{ params.table }}", deferrable=False)
    context = make_context(task, params={"table": "x; DROP TABLE y"})
    task.render_template_fields(context)
    with pytest.raises(ValueError, match="table"):
        task.execute(context)


def test_example_dag_parses_without_a_network() -> None:
    spec = importlib.util.spec_from_file_location("example_postgres", EXAMPLE_DAG)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    dag = module.dag
    sensors = [t for t in dag.tasks if isinstance(t, PostgresBatchMarkerSensor)]
    assert len(sensors) == 2 and all(s.deferrable for s in sensors)
    assert {t.task_id for t in dag.tasks} >= {"wait_for_orders_marker", "wait_for_clicks_load"}
