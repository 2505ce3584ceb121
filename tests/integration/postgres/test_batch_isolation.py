"""One wait's slow query or a batch-wide failure never becomes its neighbours' fate.

Everything is counted (polls, statements, errors), never timed: a slow neighbour's waits are
found by the first poll that starts after their row is there, a timed-out batch is re-asked one
wait at a time, and an outage costs one statement per backoff step of the shape, not one per wait.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import asyncpg
import pytest

from airflow_deferrable_kit._postgres.batches import (
    BUDGET_SCALE_MAX,
    PostgresBatches,
    batch_budget,
    close_batches,
    open_batches,
    statement_count,
)
from airflow_deferrable_kit._postgres.client import load_options
from airflow_deferrable_kit.errors import TransientError, WaitError
from airflow_deferrable_kit.leases import held_keys
from airflow_deferrable_kit.testing import run_trigger_payload
from airflow_deferrable_kit.triggers.postgres import PostgresBatchMarkerTrigger

from .helpers import unique, until


class Polls:
    """Every poll of every Postgres wait: who, whether a row was there when it started, what it got."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.epoch = 0  # raised by the test right after it commits rows
        self.polls: list[tuple[int, int, bool]] = []  # (trigger id, epoch at start, found a row)
        self.errors: list[tuple[int, WaitError]] = []
        self.batches: list[int] = []  # distinct values each batched statement carried
        fetch, classify, answer = (
            PostgresBatchMarkerTrigger.fetch_row,
            PostgresBatchMarkerTrigger.classify_error,
            PostgresBatches._answer,
        )

        async def counted_fetch(trigger: PostgresBatchMarkerTrigger) -> Any:
            epoch = self.epoch
            row = await fetch(trigger)
            self.polls.append((id(trigger), epoch, row is not None))
            return row

        def counted_classify(trigger: PostgresBatchMarkerTrigger, exc: Exception) -> WaitError:
            error = classify(trigger, exc)
            self.errors.append((id(trigger), error))
            return error

        async def counted_answer(engine: PostgresBatches, batch: Any, connection: Any) -> None:
            self.batches.append(len(batch.asks))
            await answer(engine, batch, connection)

        monkeypatch.setattr(PostgresBatchMarkerTrigger, "fetch_row", counted_fetch)
        monkeypatch.setattr(PostgresBatchMarkerTrigger, "classify_error", counted_classify)
        monkeypatch.setattr(PostgresBatches, "_answer", counted_answer)

    def of(self, trigger: PostgresBatchMarkerTrigger) -> list[tuple[int, bool]]:
        return [(epoch, found) for who, epoch, found in self.polls if who == id(trigger)]

    def errors_of(self, trigger: PostgresBatchMarkerTrigger) -> list[WaitError]:
        return [error for who, error in self.errors if who == id(trigger)]


@pytest.fixture
async def slow_for(admin: asyncpg.Connection) -> AsyncIterator[str]:
    """A function that takes 6 s for the key 'slow' and no time for any other."""
    name = unique("slow_for")
    await admin.execute(
        f"""CREATE FUNCTION {name}(key text) RETURNS boolean LANGUAGE plpgsql VOLATILE AS $$
            BEGIN IF key = 'slow' THEN PERFORM pg_sleep(6); END IF; RETURN true; END $$"""
    )
    try:
        yield name
    finally:
        await admin.execute(f"DROP FUNCTION {name}(text)")


def test_a_statement_budget_grows_with_its_waits_up_to_a_bound() -> None:
    assert batch_budget(2.0, 1) == 2.0
    assert batch_budget(2.0, 3) == 6.0
    assert batch_budget(2.0, 10_000) == 2.0 * BUDGET_SCALE_MAX
    # Once the shape's batches have answered: what they take, with headroom, within that bound.
    assert batch_budget(30.0, 200, typical=0.02) == 1.0  # the floor, not 120 s
    assert batch_budget(30.0, 200, typical=0.5) == 4.0
    assert batch_budget(2.0, 200, typical=5.0) == 2.0 * BUDGET_SCALE_MAX


async def test_many_waits_of_a_few_tens_of_milliseconds_fit_one_statement(
    conn_id: str, admin: asyncpg.Connection, markers: str
) -> None:
    """20 waits of 0.1 s each need 2 s together: past one wait's 1 s, inside the batch's budget."""
    await admin.execute(
        f"INSERT INTO {markers} (batch_id, status) SELECT 'k' || g, 'done' FROM generate_series(0, 19) g"
    )
    sql = f"SELECT batch_id FROM {markers}, pg_sleep(0.1 + 0 * length($1)) WHERE batch_id = $1 LIMIT 1"
    engine = await open_batches(await load_options(conn_id))
    try:
        await engine.parameter_types(sql, 1.0)
        before = statement_count()
        rows = await asyncio.gather(*(engine.fetch_row(sql, [f"k{i}"], timeout=1.0, window=0.1) for i in range(20)))
        assert [row["batch_id"] for row in rows] == [f"k{i}" for i in range(20)]  # no timeout for anyone
        assert statement_count() - before == 1
    finally:
        await close_batches(engine)


async def test_a_slow_neighbour_times_out_alone_and_the_others_find_their_rows_at_the_next_poll(
    conn_id: str, admin: asyncpg.Connection, markers: str, slow_for: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """40 waits and one whose query takes 6 s (statement_timeout=1, so a batch budget of 4 s).

    The first batch runs past its budget and is re-asked one wait at a time: the slow wait times
    out alone, the 40 others get their answer in that round. From then on the slow wait is asked
    alone beside the batch, so it stretches no later round. Every healthy wait finds its row at
    the first poll that starts after the row is there, and none ever sees a timeout.
    """
    polls = Polls(monkeypatch)
    await admin.execute(f"INSERT INTO {markers} (batch_id, status) VALUES ('slow', 'running')")
    sql = f"SELECT * FROM {markers} WHERE batch_id = $1 AND {slow_for}(batch_id) LIMIT 1"

    def wait(key: str) -> PostgresBatchMarkerTrigger:
        return PostgresBatchMarkerTrigger(
            postgres_conn_id=conn_id,
            sql=sql,
            parameters=[key],
            success=[{"column": "status", "equals": "done"}],
            poll_interval=1.0,
            statement_timeout=1.0,
        )

    healthy = [wait(f"h{i}") for i in range(40)]
    slow = wait("slow")
    tasks = [asyncio.create_task(run_trigger_payload(t, timeout=120)) for t in [*healthy, slow]]
    try:
        # The first round: every wait in one statement, which the slow query holds past its budget.
        await until(lambda: bool(polls.batches) and polls.batches[0] == 41, timeout=30)
        await admin.executemany(
            f"INSERT INTO {markers} (batch_id, status) VALUES ($1, 'done')", [(f"h{i}",) for i in range(20)]
        )
        polls.epoch = 1
        first = await asyncio.gather(*tasks[:20])
        # Later rounds: the 20 left and, beside them, the slow one alone.
        await until(lambda: len(polls.errors_of(slow)) >= 3, timeout=30)
        await admin.executemany(
            f"INSERT INTO {markers} (batch_id, status) VALUES ($1, 'done')", [(f"h{i}",) for i in range(20, 40)]
        )
        polls.epoch = 2
        second = await asyncio.gather(*tasks[20:40])
    finally:
        tasks[-1].cancel()
        await asyncio.gather(tasks[-1], return_exceptions=True)
    assert [p["row"]["batch_id"] for p in [*first, *second]] == [f"h{i}" for i in range(40)]
    for number, trigger in enumerate(healthy):
        inserted = 1 if number < 20 else 2
        late = [found for epoch, found in polls.of(trigger) if epoch >= inserted]
        assert late[:1] in ([], [True]) and late.count(False) == 0, (trigger.parameters, polls.of(trigger))
        assert polls.errors_of(trigger) == [], (trigger.parameters, polls.errors_of(trigger))
    # The slow wait timed out, as it does alone, every time, and only it.
    assert {error.error_type for error in polls.errors_of(slow)} == {"unavailable"}
    assert all("statement_timeout=1.0s" in error.message for error in polls.errors_of(slow))
    # Only the first statement carried the slow wait: later rounds asked it alone.
    assert polls.batches[0] == 41 and max(polls.batches[1:]) <= 40, polls.batches
    assert held_keys() == {}


@pytest.fixture
async def gate(admin: asyncpg.Connection) -> AsyncIterator[str]:
    """A function that fails as a restarting server does (SQLSTATE 57P03) while its table has a row."""
    name = unique("gate")
    await admin.execute(f"CREATE TABLE {name} (down boolean)")
    await admin.execute(
        f"""CREATE FUNCTION {name}() RETURNS boolean LANGUAGE plpgsql VOLATILE AS $$
            BEGIN
              IF EXISTS (SELECT FROM {name}) THEN
                RAISE EXCEPTION 'the database system is starting up' USING ERRCODE = '57P03';
              END IF;
              RETURN true;
            END $$"""
    )
    try:
        yield name
    finally:
        await admin.execute(f"DROP FUNCTION {name}()")
        await admin.execute(f"DROP TABLE {name}")


async def test_a_batch_wide_failure_is_shared_with_one_backoff_not_a_retry_storm(
    conn_id: str, admin: asyncpg.Connection, markers: str, gate: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """30 waits of one shape while every statement fails with a transient server error for 3 s.

    Each wait backing off on its own would send about one statement per wait per backoff (some
    180 here); sharing the failure and one backoff, the shape sends one per backoff step.
    """
    polls = Polls(monkeypatch)
    # Each wait's row is there, not done yet: the gate is asked for it on every poll.
    await admin.executemany(
        f"INSERT INTO {markers} (batch_id, status) VALUES ($1, 'running')", [(f"g{i}",) for i in range(30)]
    )
    sql = f"SELECT * FROM {markers} WHERE batch_id = $1 AND {gate}() LIMIT 1"
    triggers = [
        PostgresBatchMarkerTrigger(
            postgres_conn_id=conn_id,
            sql=sql,
            parameters=[f"g{i}"],
            success=[{"column": "status", "equals": "done"}],
            poll_interval=0.5,
            max_backoff=1.0,
        )
        for i in range(30)
    ]
    tasks = [asyncio.create_task(run_trigger_payload(t, timeout=120)) for t in triggers]
    await until(lambda: len(polls.batches) >= 3, timeout=30)  # healthy rounds first
    await admin.execute(f"INSERT INTO {gate} VALUES (true)")
    before = statement_count()
    await asyncio.sleep(3.0)  # the outage (its length only sets how many steps it has)
    await admin.execute(f"DELETE FROM {gate}")
    during = statement_count() - before
    await admin.execute(f"UPDATE {markers} SET status = 'done'")
    payloads = await asyncio.gather(*tasks)
    assert all(p["status"] == "success" for p in payloads)
    errors = [polls.errors_of(t) for t in triggers]
    assert all(errors), "every wait of the batch shared its failure"
    shared = [error for mine in errors for error in mine]
    print(f"\n30 waits, 3 s of a batch-wide transient error: {during} statements, {len(shared)} errors handed out")
    # One statement per backoff step of the batch, never one per wait. How many steps fit in the
    # outage depends on the machine's load (6 alone, 16 on a busy machine); a statement per wait
    # would be 30 in the first step alone (44 in all when each wait backed off on its own).
    assert 1 <= during < len(triggers), during
    assert all(isinstance(e, TransientError) and e.error_type == "unavailable" for e in shared)
    assert all("shared by the" in e.message and getattr(e, "retry_after", None) for e in shared)
    assert len(shared) >= 2 * during  # each statement's failure reached many waits
    assert held_keys() == {}


async def test_two_hundred_healthy_neighbours_of_a_slow_query_are_answered_while_it_still_runs(
    conn_id: str, admin: asyncpg.Connection, markers: str, slow_for: str
) -> None:
    """One wait's query runs 6 s, past its ``statement_timeout`` of 2 s, in one batch with 200
    healthy ones. Their batch's budget was four statement timeouts (8 s: the slow query even
    finished inside it), so the 200 waited with it, up to two minutes at the default timeout.
    Now the budget is what the shape's batches took, with headroom (a second here), and the
    re-asks run over a few connections: the 200 have their rows while the slow one still runs.
    """
    await admin.executemany(
        f"INSERT INTO {markers} (batch_id, status) VALUES ($1, 'done')",
        [(key,) for key in [*(f"h{i}" for i in range(200)), "slow"]],
    )
    sql = f"SELECT * FROM {markers} WHERE batch_id = $1 AND {slow_for}(batch_id) LIMIT 1"
    keys = [f"h{i}" for i in range(200)]
    engine = await open_batches(await load_options(conn_id))
    try:
        await engine.parameter_types(sql, 2.0)
        warm = await asyncio.gather(*(engine.fetch_row(sql, [key], timeout=2.0, window=0.1) for key in keys))
        assert all(row is not None for row in warm)  # a batch of the shape answered: its time is known
        asks = [asyncio.ensure_future(engine.fetch_row(sql, [key], timeout=2.0, window=0.1)) for key in keys]
        slow = asyncio.ensure_future(engine.fetch_row(sql, ["slow"], timeout=2.0, window=0.1))
        rows = await asyncio.gather(*asks)
        assert not slow.done()  # every neighbour answered while the slow query still runs
        assert [row["batch_id"] for row in rows] == keys
        with pytest.raises(TransientError, match=r"statement_timeout=2\.0s"):
            await slow  # and the slow one ends as it would alone
    finally:
        await close_batches(engine)
    assert held_keys() == {}
