"""A custom query with no condition follows Airflow's SqlSensor: the first cell must be truthy."""

from __future__ import annotations

import asyncpg
import pytest

from airflow_deferrable_kit.testing import run_trigger_payload
from airflow_deferrable_kit.triggers.base import deadline_after
from airflow_deferrable_kit.triggers.postgres import PostgresBatchMarkerTrigger


def query(conn_id: str, sql: str, *parameters: object, seconds: float = 0.5) -> PostgresBatchMarkerTrigger:
    return PostgresBatchMarkerTrigger(
        postgres_conn_id=conn_id,
        sql=sql,
        parameters=list(parameters),
        poll_interval=0.05,
        deadline=deadline_after(seconds),
    )


async def test_a_count_of_zero_is_not_yet_and_a_count_above_zero_is_ready(
    conn_id: str, admin: asyncpg.Connection, markers: str
) -> None:
    sql = f"SELECT count(*) AS loads FROM {markers} WHERE batch_id = $1"
    waiting = await run_trigger_payload(query(conn_id, sql, "b-1"))
    assert waiting["status"] == "timeout"  # was: success at once with {"loads": 0}
    await admin.execute(f"INSERT INTO {markers} (batch_id, status) VALUES ('b-1', 'done')")
    ready = await run_trigger_payload(query(conn_id, sql, "b-1", seconds=10))
    assert ready["status"] == "success" and ready["row"] == {"loads": 1}
    assert ready["matched"]["comparator"] == "first cell is truthy"


@pytest.mark.parametrize(
    ("select", "status"),
    [
        ("SELECT NULL::int", "timeout"),
        ("SELECT false", "timeout"),
        ("SELECT ''::text", "timeout"),
        ("SELECT 0.0::numeric", "timeout"),  # Decimal("0") is falsy as the driver returns it
        ("SELECT 1 WHERE false", "timeout"),  # no row
        ("SELECT 'yes'::text", "success"),
        ("SELECT 2.5::numeric", "success"),
        ("SELECT true, 0", "success"),  # only the first cell counts
    ],
)
async def test_the_first_cell_decides_by_truthiness(conn_id: str, select: str, status: str) -> None:
    payload = await run_trigger_payload(query(conn_id, select, seconds=0.3))
    assert payload["status"] == status


async def test_a_declarative_marker_row_with_no_condition_is_ready_once_it_exists(
    conn_id: str, admin: asyncpg.Connection, markers: str
) -> None:
    await admin.execute(f"INSERT INTO {markers} (batch_id, status) VALUES ('b-2', NULL)")
    trigger = PostgresBatchMarkerTrigger(
        postgres_conn_id=conn_id, table=markers, match={"batch_id": "b-2"}, poll_interval=0.05
    )
    payload = await run_trigger_payload(trigger)
    assert payload["status"] == "success" and payload["row"]["batch_id"] == "b-2"
