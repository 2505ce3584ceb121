"""Waits of one shape poll as one statement per round, and each is judged on its own row.

The statement counts come from the engine (every statement a Postgres wait sends is counted
there) and, for the batched statement, from what the server saw in ``pg_stat_activity``.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import decimal
import time
from typing import Any

import asyncpg
import pytest

from airflow_deferrable_kit._postgres import batches
from airflow_deferrable_kit._postgres.batches import (
    PostgresBatches,
    ask_key,
    batched_statement,
    close_batches,
    open_batches,
    rewrite_placeholders,
    statement_count,
)
from airflow_deferrable_kit._postgres.client import load_options
from airflow_deferrable_kit.leases import held_keys
from airflow_deferrable_kit.testing import run_trigger_payload
from airflow_deferrable_kit.triggers.postgres import PostgresBatchMarkerTrigger

from .helpers import ConnSetter, unique, until


def marker(conn_id: str, table: str, batch_id: Any, **kwargs: Any) -> PostgresBatchMarkerTrigger:
    defaults: dict[str, Any] = {
        "status_column": "status",
        "ready_values": ["done"],
        "failed_values": ["failed"],
        "poll_interval": 0.5,
    }
    return PostgresBatchMarkerTrigger(
        postgres_conn_id=conn_id, table=table, match={"batch_id": batch_id}, **{**defaults, **kwargs}
    )


class Sent:
    """Every batch the engine answers: (connection id, SQL, number of distinct waits' values)."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.batches: list[tuple[str, str, int]] = []
        original = PostgresBatches._answer

        async def answer(engine: PostgresBatches, batch: Any, connection: Any) -> None:
            self.batches.append((engine.conn_id, batch.sql, len(batch.asks)))
            await original(engine, batch, connection)

        monkeypatch.setattr(PostgresBatches, "_answer", answer)


# ------------------------------------------------------------------- the statement itself
def test_placeholders_are_rewritten_only_outside_literals_comments_and_names() -> None:
    sql = (
        "SELECT '$1', E'it\\'s $1', $tag$ $1 $tag$, $$ $2 $$, \"col$1\", a$1 -- $1\n"
        "/* $1 /* nested $2 */ $1 */ FROM t WHERE x = $1 AND y = $2::date AND z = $12"
    )
    out = rewrite_placeholders(sql, lambda n: f"<{n}>")
    assert out == (
        "SELECT '$1', E'it\\'s $1', $tag$ $1 $tag$, $$ $2 $$, \"col$1\", a$1 -- $1\n"
        "/* $1 /* nested $2 */ $1 */ FROM t WHERE x = <1> AND y = <2>::date AND z = <12>"
    )


def test_values_that_compare_equal_but_read_differently_are_asked_apart() -> None:
    assert ask_key(("a", 1)) == ("a", 1)
    assert ask_key((decimal.Decimal("1.0"),)) != ask_key((decimal.Decimal("1"),))
    assert ask_key((True,)) != ask_key((1,)) and ask_key((1.0,)) != ask_key((1,))
    assert ask_key((dt.date(2024, 1, 31), None)) == ask_key((dt.date(2024, 1, 31), None))
    with pytest.raises(TypeError):
        ask_key(({"a": 1},))


def test_shapes_with_array_or_json_parameters_are_not_batched() -> None:
    class T:
        def __init__(self, name: str, kind: str = "scalar") -> None:
            self.name, self.kind, self.schema = name, kind, "pg_catalog"

    assert batched_statement("SELECT $1", []) is None
    assert batched_statement("SELECT 1 WHERE x = ANY($1)", [T("_int4", "array")]) is None
    assert batched_statement("SELECT 1 WHERE $1::jsonb ? 'a'", [T("jsonb")]) is None
    assert batched_statement("SELECT 1 WHERE x = $1", [T("int4")]) == (
        'SELECT "adk$row".*, "adk$args"."adk$wait" FROM unnest($1::"pg_catalog"."int4"[], $2::int4[]) '
        'AS "adk$args"(a1, "adk$wait") CROSS JOIN LATERAL (SELECT * FROM (SELECT 1 WHERE x = ("adk$args".a1)) '
        'AS "adk$first" LIMIT 1) AS "adk$row"'
    )


# ------------------------------------------------------------------------------ the engine
async def test_one_statement_answers_a_window_and_cancelling_one_ask_leaves_the_others(
    conn_id: str, admin: asyncpg.Connection, markers: str
) -> None:
    await admin.executemany(
        f"INSERT INTO {markers} (batch_id, status) VALUES ($1, $2)", [("a", "done"), ("b", "running"), ("b", "done")]
    )
    engine = await open_batches(await load_options(conn_id))
    try:
        sql = f"SELECT batch_id, status FROM {markers} WHERE batch_id = $1 ORDER BY status = 'done' DESC LIMIT 1"
        await engine.parameter_types(sql, 10)
        before = statement_count()
        asks = {
            key: asyncio.ensure_future(engine.fetch_row(sql, [key], timeout=10, window=0.5))
            for key in ("a", "b", "c", "a", "gone")
        }
        await asyncio.sleep(0)
        asks["gone"].cancel()
        rows = await asyncio.gather(*(asks[k] for k in ("a", "b", "c")))
        assert [None if r is None else dict(r.items()) for r in rows] == [
            {"batch_id": "a", "status": "done"},
            {"batch_id": "b", "status": "done"},  # the first row of the wait's own ORDER BY
            None,
        ]
        assert statement_count() - before == 1
        assert asks["gone"].cancelled()

        # Cancelled while the statement is in flight: the others still get their rows.
        slow = f"SELECT batch_id FROM {markers}, pg_sleep(0.3) WHERE batch_id = $1 LIMIT 1"
        await engine.parameter_types(slow, 10)
        first, second = (asyncio.ensure_future(engine.fetch_row(slow, [k], timeout=10, window=0.05)) for k in "ab")
        await until(lambda: bool(engine._lanes))
        await asyncio.sleep(0.1)
        first.cancel()
        assert (await second)["batch_id"] == "b"
        assert first.cancelled()
    finally:
        await close_batches(engine)
    assert held_keys() == {}


# ------------------------------------------------------------------------ the trigger loop
async def test_1000_waits_cost_a_bounded_number_of_statements_per_round(
    conn_id: str, admin: asyncpg.Connection, markers: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    sent = Sent(monkeypatch)
    poll = 1.0  # sharing window 0.1 s: at most ~10 windows per round, whatever the phases
    triggers = [marker(conn_id, markers, f"b{i}", poll_interval=poll) for i in range(1000)]
    tasks = [asyncio.create_task(run_trigger_payload(t, timeout=120)) for t in triggers]
    await asyncio.sleep(2.5)  # first polls, then every wait at its random phase
    before, started = statement_count(), time.monotonic()
    await asyncio.sleep(3.0)
    statements = statement_count() - before
    rounds = (time.monotonic() - started) / poll
    assert not any(t.done() for t in tasks)
    print(f"\n1,000 waits: {statements} statements in {rounds:.1f} rounds ({statements / rounds:.1f} per round)")
    # One per round once the waits keep their shape's beat (a round's wake-ups may straddle a
    # window now and then); 1,000 unbatched, and up to 10 (one per window) without the beat.
    assert statements / rounds <= 3
    assert max(size for _, _, size in sent.batches) > 50  # the statements carried many waits each
    await admin.executemany(
        f"INSERT INTO {markers} (batch_id, status) VALUES ($1, 'done')", [(f"b{i}",) for i in range(1000)]
    )
    payloads = await asyncio.gather(*tasks)
    assert sorted(p["row"]["batch_id"] for p in payloads) == sorted(f"b{i}" for i in range(1000))
    assert held_keys() == {}


async def test_waits_spread_over_20_tables_cost_one_statement_per_table_per_round(
    conn_id: str, admin: asyncpg.Connection
) -> None:
    tables = [unique("spread") for _ in range(20)]
    for table in tables:
        await admin.execute(f"CREATE TABLE {table} (id serial PRIMARY KEY, batch_id text, status text)")
    try:
        poll = 1.0
        triggers = [marker(conn_id, tables[i % 20], f"s{i}", poll_interval=poll) for i in range(200)]
        tasks = [asyncio.create_task(run_trigger_payload(t, timeout=60)) for t in triggers]
        await asyncio.sleep(3.5)  # first polls, the random phase, then the beat of each table
        before, started = statement_count(), time.monotonic()
        await asyncio.sleep(3.0)
        per_round = (statement_count() - before) / ((time.monotonic() - started) / poll)
        print(f"\n200 waits over 20 tables: {per_round:.1f} statements per round")
        assert per_round <= 20 * 1.5  # 200 unbatched; 10 waits of a table share one statement
        for table in tables:
            await admin.execute(
                f"INSERT INTO {table} (batch_id, status) SELECT 's' || g, 'done' FROM generate_series(0, 199) g"
            )
        payloads = await asyncio.gather(*tasks)
    finally:
        for table in tables:
            await admin.execute(f"DROP TABLE {table}")
    assert all(p["status"] == "success" for p in payloads)
    assert held_keys() == {}


async def test_mixed_outcomes_in_one_batch_each_wait_judged_on_its_own_row(
    conn_id: str, admin: asyncpg.Connection, markers: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    await admin.executemany(
        f"INSERT INTO {markers} (batch_id, status) VALUES ($1, $2)",
        [("ready", "done"), ("broken", "failed"), ("buggy", "done"), ("slow", "running")],
    )
    sent = Sent(monkeypatch)
    triggers = {
        "ready": marker(conn_id, markers, "ready"),
        "broken": marker(conn_id, markers, "broken"),
        "missing": marker(conn_id, markers, "missing"),
        "slow": marker(conn_id, markers, "slow"),
        # The same query; its row is ready, so the predicate decides, and raises.
        "buggy": marker(conn_id, markers, "buggy", predicate="tests.integration.postgres.predicates:explode"),
        # A value the column's type refuses: this wait alone fails, before it reaches a batch.
        "typo": PostgresBatchMarkerTrigger(
            postgres_conn_id=conn_id, table=markers, match={"batch_id": "x", "batch_date": "not-a-date"}
        ),
    }
    tasks = {name: asyncio.create_task(run_trigger_payload(t, timeout=30)) for name, t in triggers.items()}
    done = {name: await tasks[name] for name in ("ready", "broken", "buggy", "typo")}
    assert done["ready"]["status"] == "success" and done["ready"]["row"]["batch_id"] == "ready"
    assert done["broken"]["status"] == "error" and done["broken"]["error_type"] == "condition_failed"
    assert done["broken"]["row"]["batch_id"] == "broken"
    assert done["buggy"]["status"] == "error" and done["buggy"]["error_type"] == "predicate_error"
    assert "cannot judge row" in done["buggy"]["message"]
    assert done["typo"]["status"] == "error" and done["typo"]["error_type"] == "bad_configuration"
    assert "match['batch_date']" in done["typo"]["message"]
    await admin.execute(f"UPDATE {markers} SET status = 'done' WHERE batch_id = 'slow'")
    await admin.execute(f"INSERT INTO {markers} (batch_id, status) VALUES ('missing', 'failed')")
    slow, missing = await tasks["slow"], await tasks["missing"]
    assert slow["status"] == "success" and slow["row"]["status"] == "done"
    assert missing["status"] == "error" and missing["error_type"] == "condition_failed"
    # The five waits of one shape shared their first statement; the two left, every later one.
    assert [size for _, _, size in sent.batches[:2]] == [5, 2], sent.batches[:3]
    assert held_keys() == {}


async def test_a_value_that_breaks_the_batch_fails_only_its_own_wait(
    conn_id: str, admin: asyncpg.Connection, markers: str, classified: list[Any]
) -> None:
    await admin.executemany(f"INSERT INTO {markers} (batch_id, status) VALUES ($1, 'done')", [("one",), ("two",)])
    sql = f"SELECT * FROM {markers} WHERE id = $1 OR batch_id = $2 LIMIT 1"

    def wait(parameters: list[Any]) -> PostgresBatchMarkerTrigger:
        return PostgresBatchMarkerTrigger(postgres_conn_id=conn_id, sql=sql, parameters=parameters, poll_interval=5)

    # 2**40 converts to an int (the type check passes) but does not fit int4: the batch statement
    # fails as a whole, so each wait is asked alone and only the one at fault gets the error.
    triggers = [wait([0, "one"]), wait([2**40, "two"]), wait([0, "two"])]
    before = statement_count()
    payloads = await asyncio.gather(*(run_trigger_payload(t, timeout=30) for t in triggers))
    assert [p["status"] for p in payloads] == ["success", "error", "success"]
    assert payloads[0]["row"]["batch_id"] == "one" and payloads[2]["row"]["batch_id"] == "two"
    assert payloads[1]["error_type"] in ("bad_configuration", "internal"), payloads[1]
    assert "2**40" not in payloads[1]["message"] and str(2**40) in payloads[1]["message"]
    assert 2 + 1 + 3 <= statement_count() - before <= 2 + 1 + 3 + 2  # prepares, the batch, one each


async def test_custom_queries_batch_and_keep_the_first_cell_rule(
    conn_id: str, admin: asyncpg.Connection, markers: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    sent = Sent(monkeypatch)
    await admin.execute(f"INSERT INTO {markers} (batch_id, batch_date) VALUES ('a', '2024-01-31'), ('b', NULL)")
    sql = f"SELECT count(*) AS n, max(batch_date) AS day FROM {markers} WHERE batch_id = $1 AND batch_date = $2"
    triggers = [
        PostgresBatchMarkerTrigger(postgres_conn_id=conn_id, sql=sql, parameters=[key, "2024-01-31"], poll_interval=0.5)
        for key in ("a", "b", "c")
    ]
    tasks = [asyncio.create_task(run_trigger_payload(t, timeout=30)) for t in triggers]
    first = await tasks[0]
    assert first["status"] == "success" and first["row"] == {"n": 1, "day": "2024-01-31"}
    await asyncio.sleep(1.2)
    assert not tasks[1].done() and not tasks[2].done()  # count 0: not yet (Airflow's SqlSensor rule)
    await admin.execute(f"UPDATE {markers} SET batch_date = '2024-01-31' WHERE batch_id = 'b'")
    await admin.execute(f"INSERT INTO {markers} (batch_id, batch_date) VALUES ('c', '2024-01-31')")
    rest = await asyncio.gather(*tasks[1:])
    assert [p["row"]["n"] for p in rest] == [1, 1]
    assert max(size for _, _, size in sent.batches) >= 2  # the same text, different values: one statement


async def test_different_tables_and_connections_are_never_batched_together(
    connect: ConnSetter, admin: asyncpg.Connection, monkeypatch: pytest.MonkeyPatch
) -> None:
    tables = [unique("markers"), unique("markers")]
    for table in tables:
        await admin.execute(f"CREATE TABLE {table} (id serial PRIMARY KEY, batch_id text, status text)")
    conns = [connect(), connect()]
    sent = Sent(monkeypatch)
    try:
        triggers = [marker(c, t, f"k{i}") for c in conns for t in tables for i in range(5)]
        tasks = [asyncio.create_task(run_trigger_payload(t, timeout=30)) for t in triggers]
        await until(lambda: len(sent.batches) >= 12)
        for table in tables:
            await admin.executemany(
                f"INSERT INTO {table} (batch_id, status) VALUES ($1, 'done')", [(f"k{i}",) for i in range(5)]
            )
        payloads = await asyncio.gather(*tasks)
    finally:
        for table in tables:
            await admin.execute(f"DROP TABLE {table}")
    assert all(p["status"] == "success" for p in payloads)
    for payload, trigger in zip(payloads, triggers, strict=True):
        assert payload["table"] == trigger.table and payload["postgres_conn_id"] == trigger.postgres_conn_id
    shapes = {(c, next(t for t in tables if t in sql)) for c, sql, _ in sent.batches}
    assert shapes == {(c, t) for c in conns for t in tables}
    assert all(sum(t in sql for t in tables) == 1 for _, sql, _ in sent.batches)
    assert max(size for _, _, size in sent.batches) == 5  # the five waits of a shape, no more
    assert held_keys() == {}


async def test_notify_wakes_every_wait_of_a_batch_with_one_statement(
    conn_id: str, admin: asyncpg.Connection, markers: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    sent = Sent(monkeypatch)
    triggers = [marker(conn_id, markers, f"n{i}", notify_channel="adk_batch_wake", poll_interval=60) for i in range(50)]
    tasks = [asyncio.create_task(run_trigger_payload(t, timeout=30)) for t in triggers]
    await until(lambda: sum(size for _, _, size in sent.batches) >= 50)  # every wait polled once
    await asyncio.sleep(1.5)  # and all sleep their 60 s
    assert not any(t.done() for t in tasks)
    polled = len(sent.batches)
    await admin.executemany(
        f"INSERT INTO {markers} (batch_id, status) VALUES ($1, 'done')", [(f"n{i}",) for i in range(50)]
    )
    started = time.monotonic()
    await admin.execute("NOTIFY adk_batch_wake")
    payloads = await asyncio.gather(*tasks)
    took = time.monotonic() - started
    assert all(p["status"] == "success" for p in payloads)
    assert took < 10  # far inside the 60 s poll interval
    woken = sent.batches[polled:]
    assert sum(size for _, _, size in woken) == 50 and len(woken) <= 2, woken


async def test_cancelling_one_wait_does_not_cancel_its_batch(
    conn_id: str, admin: asyncpg.Connection, markers: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    sent = Sent(monkeypatch)
    triggers = [marker(conn_id, markers, f"c{i}", poll_interval=0.5) for i in range(20)]
    tasks = [asyncio.create_task(run_trigger_payload(t, timeout=30)) for t in triggers]
    await until(lambda: len(sent.batches) >= 3)
    tasks[0].cancel()
    await asyncio.gather(tasks[0], return_exceptions=True)
    await admin.executemany(
        f"INSERT INTO {markers} (batch_id, status) VALUES ($1, 'done')", [(f"c{i}",) for i in range(20)]
    )
    payloads = await asyncio.gather(*tasks[1:])
    assert [p["row"]["batch_id"] for p in payloads] == [f"c{i}" for i in range(1, 20)]
    assert tasks[0].cancelled()
    assert held_keys() == {}


async def test_a_connection_the_server_closes_mid_batch_is_not_used_for_the_next_batch(
    connect: ConnSetter, admin: asyncpg.Connection, markers: str
) -> None:
    """asyncpg hands a connection the server closed back to its pool on its own, and every call
    on it then fails with "connection has been released back to the pool": the next batch of
    the same lane must be asked on a fresh connection, not fail as an internal error.

    Two shapes (two aliases of one query) sleep while a gate table is empty, so whichever batch
    the lane sends first is the one in flight; its server session is terminated, the gate opened.
    """
    conn_id = connect(extra={"pool_max_size": 1})  # one lane: the two shapes' batches share a connection
    gate = unique("gate")
    await admin.execute(f"CREATE TABLE {gate} (open boolean)")
    await admin.execute(f"INSERT INTO {markers} (batch_id, status) VALUES ('a', 'done')")
    sleep = f"pg_sleep(CASE WHEN EXISTS (SELECT FROM {gate}) THEN 0 ELSE 30 END)"
    shapes = [f"SELECT {alias}.batch_id FROM {markers} AS {alias}, {sleep} WHERE {alias}.batch_id = $1 LIMIT 1"
              for alias in ("m1", "m2")]  # fmt: skip
    engine = await open_batches(await load_options(conn_id))
    try:
        for sql in shapes:
            await engine.parameter_types(sql, 60)
        lanes_before = len(engine._lanes)
        asks = [asyncio.ensure_future(engine.fetch_row(sql, ["a"], timeout=60, window=0.2)) for sql in shapes]
        rows: list[asyncpg.Record] = []
        for _ in range(200):
            # Sleeping already (its 30 s worked out while the gate was shut), not merely sent: a
            # batch the server had not started yet would find the gate open and not sleep at all.
            rows = await admin.fetch(
                "SELECT pid FROM pg_stat_activity WHERE application_name = $1 AND state = 'active' "
                "AND query LIKE '%pg_sleep%' AND wait_event = 'PgSleep'",
                conn_id,
            )
            if rows:
                break
            await asyncio.sleep(0.05)
        assert len(rows) == 1, "one batch in flight on the one connection"
        assert len(engine._lanes) - lanes_before == 1  # both batches are the one lane's
        await admin.execute(f"INSERT INTO {gate} VALUES (true)")
        await admin.execute("SELECT pg_terminate_backend($1)", rows[0]["pid"])
        outcomes = await asyncio.wait_for(asyncio.gather(*asks, return_exceptions=True), 20)
    finally:
        await close_batches(engine)
        await admin.execute(f"DROP TABLE {gate}")
    errors = [o for o in outcomes if isinstance(o, BaseException)]
    answered = [dict(o.items()) for o in outcomes if not isinstance(o, BaseException)]
    assert len(errors) == 1 and batches._is_transient(errors[0]), outcomes  # the one in flight
    assert answered == [{"batch_id": "a"}]  # the one after it, on a fresh connection
    assert held_keys() == {}


def test_the_engine_counts_every_statement() -> None:
    before = statement_count()
    batches._count(3)
    assert statement_count() == before + 3
