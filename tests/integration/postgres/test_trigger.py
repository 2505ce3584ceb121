"""The trigger against the real PostgreSQL: rows appearing, statuses, custom SQL, errors."""

from __future__ import annotations

import asyncio
import base64
import json
from typing import Any

import asyncpg
import pytest

from airflow_deferrable_kit.connections import get_connection
from airflow_deferrable_kit.errors import FatalError, TransientError, WaitError
from airflow_deferrable_kit.leases import held_keys
from airflow_deferrable_kit.testing import run_trigger_payload, watch_blocking
from airflow_deferrable_kit.triggers.base import deadline_after
from airflow_deferrable_kit.triggers.postgres import PostgresBatchMarkerTrigger

from .helpers import ConnSetter, backends, unique, until

FAST = {"poll_interval": 0.05}


def marker(conn_id: str, table: str, **kwargs: Any) -> PostgresBatchMarkerTrigger:
    arguments: dict[str, Any] = {"postgres_conn_id": conn_id, "table": table, **FAST}
    arguments.update(kwargs)
    return PostgresBatchMarkerTrigger(**arguments)


async def later(delay: float, admin: asyncpg.Connection, *statements: str) -> None:
    await asyncio.sleep(delay)
    for statement in statements:
        await admin.execute(statement)


async def test_the_row_appears_and_the_payload_is_the_json_safe_row(
    conn_id: str, admin: asyncpg.Connection, markers: str, classified: list[WaitError]
) -> None:
    trigger = marker(conn_id, f"public.{markers}", match={"batch_id": "orders", "batch_date": "2024-01-31"})
    insert = (
        f"INSERT INTO {markers} (batch_id, batch_date, status, meta, created_at) VALUES "
        "('orders', '2024-01-30', 'done', null, '2024-01-30T00:00:00Z'), "
        "('orders', '2024-01-31', 'done', '{\"rows\": 12, \"files\": [\"a.csv\"]}', '2024-01-31T05:06:07.25Z')"
    )
    await get_connection(conn_id)  # first lookup in a process imports Airflow's supervisor module
    writer = asyncio.create_task(later(0.3, admin, insert))
    with watch_blocking(0.05) as blocked:
        payload = await run_trigger_payload(trigger, timeout=20)
    await writer
    assert payload["status"] == "success"
    assert payload["row"] == {
        "id": 2,
        "batch_id": "orders",
        "batch_date": "2024-01-31",
        "status": "done",
        "meta": {"rows": 12, "files": ["a.csv"]},
        "created_at": "2024-01-31T05:06:07.250000+00:00",
    }
    assert payload["table"] == f"public.{markers}" and payload["postgres_conn_id"] == conn_id
    assert "matched" not in payload
    assert classified == []
    assert blocked == []
    assert held_keys() == {}


async def test_exotic_column_types_become_json(conn_id: str) -> None:
    sql = (
        "SELECT 12.500::numeric AS amount, '00000000-0000-0000-0000-000000000001'::uuid AS id, "
        "'\\x00ff10'::bytea AS raw, '10.0.0.1'::inet AS host, interval '90 minutes' AS took, "
        "ARRAY[1,2,3] AS parts, 'NaN'::float8 AS nan, '2024-01-31 10:00'::timestamp AS local_time, "
        "'[1,5)'::int4range AS span, B'101' AS bits, point(1.5, 2) AS spot, '{\"k\": [1, {\"v\": null}]}'::json AS doc"
    )
    payload = await run_trigger_payload(PostgresBatchMarkerTrigger(postgres_conn_id=conn_id, sql=sql), timeout=20)
    row = payload["row"]
    assert row["amount"] == "12.500"
    assert row["id"] == "00000000-0000-0000-0000-000000000001"
    assert base64.b64decode(row["raw"]) == b"\x00\xff\x10"
    assert row["host"] == "10.0.0.1"
    assert row["took"] == 5400.0
    assert row["parts"] == [1, 2, 3]
    assert row["nan"] == "nan"
    assert row["local_time"] == "2024-01-31T10:00:00"
    assert row["span"] == {"lower": 1, "upper": 5, "lower_inc": True, "upper_inc": False, "empty": False}
    assert row["bits"] == "101" and row["spot"] == [1.5, 2.0]
    assert row["doc"] == {"k": [1, {"v": None}]}
    json.dumps(payload)


async def test_ready_status_decides_and_running_is_not_yet(
    conn_id: str, admin: asyncpg.Connection, markers: str
) -> None:
    trigger = marker(
        conn_id,
        markers,
        match={"batch_id": "orders"},
        status_column="status",
        ready_values=["done", "published"],
        failed_values=["failed"],
    )
    await admin.execute(f"INSERT INTO {markers} (batch_id, status) VALUES ('orders', 'running')")
    task = asyncio.create_task(run_trigger_payload(trigger, timeout=20))
    await asyncio.sleep(0.4)
    assert not task.done()  # a running marker is "not yet"
    await admin.execute(f"UPDATE {markers} SET status = 'published'")
    payload = await task
    assert payload["status"] == "success"
    assert payload["row"]["status"] == "published"
    assert payload["matched"] == {
        "state": "success",
        "matcher": "column",
        "argument": "status",
        "comparator": "in",
        "expected": ["done", "published"],
        "actual": "published",
    }


async def test_failed_status_ends_with_an_error_event_at_once(
    conn_id: str, admin: asyncpg.Connection, markers: str, classified: list[WaitError]
) -> None:
    await admin.execute(f"INSERT INTO {markers} (batch_id, status) VALUES ('orders', 'failed')")
    trigger = marker(
        conn_id,
        markers,
        match={"batch_id": "orders"},
        status_column="status",
        ready_values=["done"],
        failed_values=["failed"],
        poll_interval=30,
    )
    payload = await run_trigger_payload(trigger, timeout=20)
    assert payload["status"] == "error"
    assert payload["error_type"] == "condition_failed"
    assert "reports failure" in payload["message"] and "(saw 'failed')" in payload["message"]
    assert payload["row"]["status"] == "failed"
    assert payload["matched"]["actual"] == "failed"
    assert [type(e) for e in classified] == [type(classified[0])] and classified[0].error_type == "condition_failed"


async def test_a_ready_attempt_wins_over_a_failed_one_unless_order_by_says_otherwise(
    conn_id: str, admin: asyncpg.Connection, markers: str
) -> None:
    await admin.execute(
        f"INSERT INTO {markers} (batch_id, status, created_at) VALUES "
        "('orders', 'done', '2024-01-01'), ('orders', 'failed', '2024-01-02'), ('orders', 'running', '2024-01-03')"
    )
    common: dict[str, Any] = {
        "match": {"batch_id": "orders"},
        "status_column": "status",
        "ready_values": ["done"],
        "failed_values": ["failed"],
    }
    payload = await run_trigger_payload(marker(conn_id, markers, **common), timeout=20)
    assert (payload["status"], payload["row"]["status"]) == ("success", "done")
    newest = marker(conn_id, markers, **common, order_by=["created_at desc"], deadline=deadline_after(0.6))
    payload = await run_trigger_payload(newest, timeout=20)
    assert payload["status"] == "timeout"  # the newest attempt is still running
    await admin.execute(f"UPDATE {markers} SET status = 'failed' WHERE created_at = '2024-01-03'")
    payload = await run_trigger_payload(marker(conn_id, markers, **common, order_by=["created_at desc"]), timeout=20)
    assert (payload["status"], payload["row"]["created_at"]) == ("error", "2024-01-03T00:00:00+00:00")


async def test_match_lists_nulls_and_hostile_values_are_bound_not_spliced(
    conn_id: str, admin: asyncpg.Connection, markers: str
) -> None:
    hostile = "x'); DROP TABLE " + markers + "; --"
    await admin.execute(
        f"INSERT INTO {markers} (batch_id, status, batch_date) VALUES ($1, 'done', null), ('eu', 'done', '2024-02-01')",
        hostile,
    )
    payload = await run_trigger_payload(
        marker(conn_id, markers, match={"batch_id": ["us", hostile], "batch_date": None}), timeout=20
    )
    assert payload["row"]["batch_id"] == hostile
    assert await admin.fetchval(f"SELECT count(*) FROM {markers}") == 2  # the table survived


async def test_custom_sql_with_parameters_and_acceptors(conn_id: str, admin: asyncpg.Connection, markers: str) -> None:
    sql = f"""
        SELECT batch_id, count(*) AS files, max(status) AS state, max(meta ->> 'phase') AS phase,
               bool_and(meta @> $2::jsonb) AS tagged
        FROM {markers} WHERE batch_id = $1 GROUP BY batch_id;
    """
    trigger = PostgresBatchMarkerTrigger(
        postgres_conn_id=conn_id,
        sql=sql,
        parameters=["orders", {"tag": "x"}],
        success=[{"column": "files", "equals": 2}],
        retry=[{"column": "phase", "equals": "loading"}],
        failure=[{"column": "state", "equals": "zz-failed"}],
        **FAST,
    )
    task = asyncio.create_task(run_trigger_payload(trigger, timeout=20))
    insert = f"INSERT INTO {markers} (batch_id, status, meta) VALUES ('orders', $1, $2)"
    await admin.execute(insert, "a", '{"tag": "x", "phase": "loading"}')
    await asyncio.sleep(0.3)
    assert not task.done()  # one file, and the retry acceptor says loading
    await admin.execute(insert, "b", '{"tag": "x", "phase": "x"}')
    payload = await task
    assert payload["status"] == "success"
    assert payload["row"] == {"batch_id": "orders", "files": 2, "state": "b", "phase": "x", "tagged": True}
    assert payload["matched"]["argument"] == "files" and payload["sql"].startswith("SELECT batch_id")

    failing_only: dict[str, Any] = {
        "postgres_conn_id": conn_id,
        "sql": f"SELECT status, meta FROM {markers} WHERE batch_id = $1 ORDER BY id DESC",
        "parameters": ["orders"],
        "failure": [{"path": "meta.phase", "equals": "x"}],
        **FAST,
    }
    with pytest.raises(ValueError, match="could never succeed"):  # failure= alone can never be met
        PostgresBatchMarkerTrigger(**failing_only)
    failing = PostgresBatchMarkerTrigger(**failing_only, success=[{"column": "status", "equals": "zz-never"}])
    payload = await run_trigger_payload(failing, timeout=20)
    assert payload["status"] == "error" and payload["error_type"] == "condition_failed"
    assert payload["matched"]["matcher"] == "path"


async def test_a_query_without_conditions_is_ready_once_its_first_cell_is_truthy(
    conn_id: str, admin: asyncpg.Connection, markers: str
) -> None:
    # Airflow's SqlSensor rule: no row, or 0 / NULL / false / '' / 0.0 in the first cell, is not yet.
    for falsy in ("0", "NULL::int", "false", "''", "0.0::numeric"):
        query = PostgresBatchMarkerTrigger(postgres_conn_id=conn_id, sql=f"SELECT {falsy} AS first, 1 AS second")
        assert await query.poll_once() is None, falsy
    no_row = PostgresBatchMarkerTrigger(postgres_conn_id=conn_id, sql="SELECT 1 AS one WHERE false")
    assert await no_row.poll_once() is None
    counting = PostgresBatchMarkerTrigger(
        postgres_conn_id=conn_id,
        sql=f"SELECT count(*) AS n FROM {markers} WHERE batch_id = $1",
        parameters=["orders"],
        **FAST,
    )
    assert await counting.poll_once() is None  # a count of 0 is not yet
    task = asyncio.create_task(run_trigger_payload(counting, timeout=20))
    await asyncio.sleep(0.3)
    assert not task.done()
    await admin.execute(f"INSERT INTO {markers} (batch_id) VALUES ('orders')")
    payload = await task
    assert payload["status"] == "success" and payload["row"] == {"n": 1}
    assert payload["matched"]["matcher"] == "default"


async def test_templated_dates_are_bound_as_dates(conn_id: str, admin: asyncpg.Connection, markers: str) -> None:
    await admin.execute(f"INSERT INTO {markers} (batch_id, batch_date, status) VALUES ('orders', '2024-01-31', 'done')")
    by_date = marker(conn_id, markers, match={"batch_date": "2024-01-31"})
    assert (await run_trigger_payload(by_date, timeout=20))["row"]["batch_date"] == "2024-01-31"
    since = PostgresBatchMarkerTrigger(
        postgres_conn_id=conn_id,
        sql=f"SELECT id FROM {markers} WHERE created_at >= $1 AND batch_date = ANY($2)",
        parameters=["2020-01-01T00:00:00+00:00", ["2024-01-31", "2024-02-01"]],
    )
    assert (await run_trigger_payload(since, timeout=20))["row"] == {"id": 1}


async def test_options_from_the_connection_reach_the_server(connect: ConnSetter, admin: asyncpg.Connection) -> None:
    schema = unique("adk_schema")
    await admin.execute(f"CREATE SCHEMA {schema}; CREATE TABLE {schema}.flags (name text, ready bool)")
    await admin.execute(f"INSERT INTO {schema}.flags VALUES ('orders', true)")
    try:
        conn_id = connect(extra={"options": f"-c search_path={schema}"})
        trigger = PostgresBatchMarkerTrigger(
            postgres_conn_id=conn_id, table="flags", success=[{"column": "ready", "equals": True}]
        )
        payload = await run_trigger_payload(trigger, timeout=20)
        assert payload["row"] == {"name": "orders", "ready": True}
    finally:
        await admin.execute(f"DROP SCHEMA {schema} CASCADE")


async def test_a_slow_query_is_cancelled_by_the_statement_timeout(
    conn_id: str, admin: asyncpg.Connection, classified: list[WaitError]
) -> None:
    trigger = PostgresBatchMarkerTrigger(
        postgres_conn_id=conn_id,
        sql="SELECT pg_sleep(30) AS slept",
        statement_timeout=0.3,
        poll_interval=0.1,
        max_backoff=0.2,
        deadline=deadline_after(1.5),
    )
    payload = await run_trigger_payload(trigger, timeout=20)
    assert payload["status"] == "timeout"
    assert classified and all(isinstance(e, TransientError) for e in classified)
    assert {e.error_type for e in classified} == {"unavailable"}
    assert all("the query ran longer than statement_timeout=0.3s" in e.message for e in classified)
    for _ in range(50):  # the server is told to cancel; wait for the backends to go idle
        active = [b for b in await backends(admin, conn_id) if b["state"] == "active"]
        if not active:
            break
        await asyncio.sleep(0.1)
    assert active == []


async def test_a_predicate_decides_when_no_acceptor_did(conn_id: str, admin: asyncpg.Connection, markers: str) -> None:
    await admin.execute(f"INSERT INTO {markers} (batch_id, status, meta) VALUES ('orders', 'x', '{{\"rows\": 5}}')")
    trigger = marker(conn_id, markers, predicate="tests.integration.postgres.predicates:enough_rows")
    payload = await run_trigger_payload(trigger, timeout=20)
    assert payload["status"] == "success" and payload["row"]["meta"] == {"rows": 5}


# --------------------------------------------------------------------------- transient
async def test_too_many_connections_is_transient(
    connect: ConnSetter, admin: asyncpg.Connection, markers: str, classified: list[WaitError]
) -> None:
    role = unique("adk_limited")
    await admin.execute(f"CREATE ROLE {role} LOGIN CONNECTION LIMIT 0; GRANT SELECT ON {markers} TO {role}")
    await admin.execute(f"INSERT INTO {markers} (batch_id) VALUES ('orders')")
    try:
        trigger = marker(connect(login=role), markers, poll_interval=0.05, max_backoff=0.1)
        task = asyncio.create_task(run_trigger_payload(trigger, timeout=20))
        await until(lambda: len(classified) >= 2)
        await admin.execute(f"ALTER ROLE {role} CONNECTION LIMIT 10")
        payload = await task
        assert payload["status"] == "success"
        assert {(e.error_type, e.details.get("condition")) for e in classified} == {
            ("unavailable", "too_many_connections")
        }
        assert all(isinstance(e, TransientError) for e in classified)
    finally:
        await admin.execute(f"DROP OWNED BY {role}; DROP ROLE {role}")


async def test_serialization_failures_are_transient(
    conn_id: str, admin: asyncpg.Connection, classified: list[WaitError]
) -> None:
    name = unique("adk_flaky")
    await admin.execute(
        f"""CREATE TABLE {name}_flag (fail bool);
        INSERT INTO {name}_flag VALUES (true);
        CREATE FUNCTION {name}() RETURNS int LANGUAGE plpgsql AS $$
        BEGIN
          IF (SELECT fail FROM {name}_flag) THEN
            RAISE EXCEPTION 'could not serialize access' USING ERRCODE = 'serialization_failure';
          END IF;
          RETURN 1;
        END $$"""
    )
    try:
        trigger = PostgresBatchMarkerTrigger(
            postgres_conn_id=conn_id, sql=f"SELECT {name}() AS ok", poll_interval=0.05, max_backoff=0.1
        )
        task = asyncio.create_task(run_trigger_payload(trigger, timeout=20))
        await until(lambda: len(classified) >= 2)
        await admin.execute(f"UPDATE {name}_flag SET fail = false")
        payload = await task
        assert payload == {**payload, "status": "success", "row": {"ok": 1}}
        assert {(e.error_type, e.details.get("condition")) for e in classified} == {
            ("unavailable", "serialization_failure")
        }
    finally:
        await admin.execute(f"DROP FUNCTION {name}(); DROP TABLE {name}_flag")


# ------------------------------------------------------------------------------ fatal
async def _fails_at_once(trigger: PostgresBatchMarkerTrigger, classified: list[WaitError]) -> dict[str, Any]:
    payload = await run_trigger_payload(trigger, timeout=20)
    assert payload["status"] == "error", payload
    assert len(classified) == 1 and isinstance(classified[0], FatalError)  # no retry happened
    return payload


async def test_syntax_error_is_fatal(conn_id: str, classified: list[WaitError]) -> None:
    payload = await _fails_at_once(PostgresBatchMarkerTrigger(postgres_conn_id=conn_id, sql="SELEC 1"), classified)
    assert payload["error_type"] == "bad_request" and "42601" in payload["message"]
    assert (payload["condition"], payload["sqlstate"]) == ("syntax_error", "42601")


async def test_two_statements_are_refused(conn_id: str, classified: list[WaitError]) -> None:
    trigger = PostgresBatchMarkerTrigger(postgres_conn_id=conn_id, sql="SELECT 1; SELECT 2")
    payload = await _fails_at_once(trigger, classified)
    assert payload["error_type"] == "bad_request" and "multiple commands" in payload["message"]
    assert payload["condition"] == "syntax_error"


async def test_undefined_table_is_fatal(conn_id: str, classified: list[WaitError]) -> None:
    payload = await _fails_at_once(marker(conn_id, "adk_no_such_table"), classified)
    assert payload["error_type"] == "not_found" and "adk_no_such_table" in payload["message"]
    assert (payload["condition"], payload["sqlstate"]) == ("undefined_table", "42P01")


async def test_undefined_column_is_fatal(conn_id: str, markers: str, classified: list[WaitError]) -> None:
    payload = await _fails_at_once(marker(conn_id, markers, match={"no_such_column": 1}), classified)
    assert payload["error_type"] == "bad_request" and "no_such_column" in payload["message"]
    assert (payload["condition"], payload["sqlstate"]) == ("undefined_column", "42703")


async def test_permission_denied_is_fatal(
    connect: ConnSetter, admin: asyncpg.Connection, markers: str, classified: list[WaitError]
) -> None:
    role = unique("adk_noperm")
    await admin.execute(f"CREATE ROLE {role} LOGIN")
    try:
        payload = await _fails_at_once(marker(connect(login=role), markers), classified)
        assert payload["error_type"] == "authorization" and "42501" in payload["message"]
        assert (payload["condition"], payload["sqlstate"]) == ("permission_denied", "42501")
    finally:
        await admin.execute(f"DROP ROLE {role}")


async def test_unknown_role_and_unknown_database_are_fatal(connect: ConnSetter, classified: list[WaitError]) -> None:
    payload = await _fails_at_once(marker(connect(login="adk_ghost_role"), "t"), classified)
    assert payload["error_type"] == "authentication" and "adk_ghost_role" in payload["message"]
    assert payload["condition"] == "authentication_failed"
    classified.clear()
    payload = await _fails_at_once(marker(connect(schema="adk_no_such_db"), "t"), classified)
    assert payload["error_type"] == "not_found"
    assert (payload["condition"], payload["sqlstate"]) == ("unknown_database", "3D000")


async def test_unknown_connection_id_is_fatal(classified: list[WaitError]) -> None:
    payload = await _fails_at_once(marker("adk_not_defined_anywhere", "t"), classified)
    assert payload["error_type"] == "connection_not_found"


async def test_a_query_that_writes_is_refused(conn_id: str, markers: str, classified: list[WaitError]) -> None:
    trigger = PostgresBatchMarkerTrigger(
        postgres_conn_id=conn_id, sql=f"INSERT INTO {markers} (batch_id) VALUES ('x') RETURNING id"
    )
    payload = await _fails_at_once(trigger, classified)
    assert payload["error_type"] == "bad_request" and "read-only" in payload["message"]
    assert (payload["condition"], payload["sqlstate"]) == ("read_only", "25006")


async def test_bad_bound_values_are_fatal(conn_id: str, markers: str, classified: list[WaitError]) -> None:
    payload = await _fails_at_once(marker(conn_id, markers, match={"batch_date": "yesterday-ish"}), classified)
    assert payload["error_type"] == "bad_configuration" and "match['batch_date']" in payload["message"]
    classified.clear()
    trigger = PostgresBatchMarkerTrigger(
        postgres_conn_id=conn_id, sql="SELECT $1::int AS a, $2::int AS b", parameters=[1]
    )
    payload = await _fails_at_once(trigger, classified)
    assert payload["error_type"] == "bad_configuration"


async def test_poll_once_is_the_same_check(conn_id: str, admin: asyncpg.Connection, markers: str) -> None:
    trigger = marker(conn_id, markers, match={"batch_id": "orders"}, status_column="status", ready_values=["done"])
    assert await trigger.poll_once() is None
    await admin.execute(f"INSERT INTO {markers} (batch_id, status) VALUES ('orders', 'done')")
    payload = await trigger.poll_once()
    assert payload is not None and payload["status"] == "success" and payload["row"]["status"] == "done"
    assert held_keys() == {}


async def test_a_fraction_for_an_integer_placeholder_is_refused_naming_the_parameter(
    conn_id: str, admin: asyncpg.Connection
) -> None:
    """1.5 against ``int`` used to be truncated to 1 and match the wrong row; 2.0 is the integer 2."""
    table = unique("counts")
    await admin.execute(f"CREATE TABLE {table} (id int PRIMARY KEY, state text)")
    await admin.execute(f"INSERT INTO {table} VALUES (1, 'ready'), (2, 'ready')")
    sql = f"SELECT id, state FROM {table} WHERE id = $1"
    payload = await run_trigger_payload(
        PostgresBatchMarkerTrigger(postgres_conn_id=conn_id, sql=sql, parameters=[1.5], **FAST), timeout=20
    )
    assert payload["status"] == "error" and payload["error_type"] == "bad_configuration"
    assert "parameters[0]=1.5 is not a valid int4 value: not a whole number" in payload["message"]
    payload = await run_trigger_payload(
        PostgresBatchMarkerTrigger(postgres_conn_id=conn_id, sql=sql, parameters=[2.0], **FAST), timeout=20
    )
    assert payload["status"] == "success" and payload["row"] == {"id": 2, "state": "ready"}
    payload = await run_trigger_payload(
        PostgresBatchMarkerTrigger(postgres_conn_id=conn_id, table=table, match={"id": 1.5}, **FAST), timeout=20
    )
    assert payload["status"] == "error" and "1.5 is not a valid int4 value" in payload["message"]
