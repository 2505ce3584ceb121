"""PostgresRowEventTrigger against a real PostgreSQL: one event per new accepted row, in order,
the cursor in the asset state store across restarts, NOTIFY wake-ups, one query a round for a
hundred watchers of one table (counted by the server in pg_stat_user_tables).

Triggers run through Airflow's own ``SharedStreamManager`` (``WatcherHarness``).
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Iterator
from typing import Any

import asyncpg
import pytest
from airflow.sdk import Asset, AssetWatcher

from airflow_deferrable_kit._event_streams import live_boards
from airflow_deferrable_kit.leases import held_keys
from airflow_deferrable_kit.payload import json_size
from airflow_deferrable_kit.testing import watch_blocking
from airflow_deferrable_kit.testing_events import WatcherHarness
from airflow_deferrable_kit.triggers.postgres_events import PostgresRowEventTrigger

from . import predicates
from .helpers import backends, unique, until

FAST = 0.1


@pytest.fixture
async def loads(admin: asyncpg.Connection) -> AsyncIterator[str]:
    """A fresh table of loads: an id, a dataset, a status, a timestamp that can repeat."""
    name = unique("loads")
    await admin.execute(
        f"""CREATE TABLE {name} (
            id serial PRIMARY KEY,
            dataset text NOT NULL,
            status text,
            meta jsonb,
            loaded_at timestamptz NOT NULL DEFAULT '2030-01-01T00:00:00Z'
        )"""
    )
    try:
        yield name
    finally:
        await admin.execute(f"DROP TABLE IF EXISTS {name}")


#: These tests are about what fires, not how events are spaced (see
#: tests/integration/s3/test_events.py::test_one_look_is_one_event_and_events_are_min_event_interval_apart).
QUICK_EVENTS = 0.5


def watcher(conn_id: str, table: str, **kwargs: Any) -> PostgresRowEventTrigger:
    kwargs.setdefault("min_event_interval", QUICK_EVENTS)
    kwargs.setdefault("order_column", "id")
    kwargs.setdefault("poll_interval", FAST)
    return PostgresRowEventTrigger(postgres_conn_id=conn_id, table=table, **kwargs)


async def insert(admin: asyncpg.Connection, table: str, *datasets: str, status: str = "done", **columns: Any) -> None:
    extra = "".join(f", {name}" for name in columns)
    values = "".join(f", ${i + 3}" for i in range(len(columns)))
    await admin.executemany(
        f"INSERT INTO {table} (dataset, status{extra}) VALUES ($1, $2{values})",
        [(dataset, status, *columns.values()) for dataset in datasets],
    )


def ids(payloads: list[dict[str, Any]]) -> list[int]:
    return [p["row"]["id"] for p in payloads]


async def quiet(seconds: float = 0.5) -> None:
    await asyncio.sleep(seconds)


# ---------------------------------------------------------------------------- events
def test_it_is_an_asset_watcher_trigger_that_round_trips() -> None:
    trigger = PostgresRowEventTrigger(
        postgres_conn_id="warehouse", table="etl.loads", order_column="loaded_at", key_column="id", backfill=True
    )
    Asset(name="loads", watchers=[AssetWatcher(name="new_loads", trigger=trigger)])
    classpath, kwargs = trigger.serialize()
    assert classpath == "airflow_deferrable_kit.triggers.postgres_events.PostgresRowEventTrigger"
    assert PostgresRowEventTrigger(**json.loads(json.dumps(kwargs))) == trigger
    assert "'; drop" not in trigger.stream_identity()["query"]
    with pytest.raises(ValueError, match="order_column must be a plain identifier"):
        PostgresRowEventTrigger(table="t", order_column="id; drop table t")
    with pytest.raises(ValueError, match="order_column must be a plain identifier"):
        PostgresRowEventTrigger(table="t")
    with pytest.raises(ValueError, match="order_by says which row decides a wait"):
        PostgresRowEventTrigger(table="t", order_column="id", order_by=["id desc"])
    with pytest.raises(ValueError, match="key_column must differ"):
        PostgresRowEventTrigger(table="t", order_column="id", key_column="id")
    with pytest.raises(ValueError, match="give exactly one of table"):  # the wait's own validation
        PostgresRowEventTrigger(order_column="id")


async def test_each_new_accepted_row_fires_once_in_order_and_old_rows_never(
    conn_id: str, admin: asyncpg.Connection, loads: str
) -> None:
    await insert(admin, loads, "orders", "orders")
    trigger = watcher(conn_id, loads, match={"dataset": "orders"}, success=[{"column": "status", "equals": "done"}])
    async with WatcherHarness() as triggerer:
        with watch_blocking(0.1) as blocked:
            watch = await triggerer.start(trigger)
            await quiet()
            assert watch.items == []  # the rows already there are the starting point
            await insert(admin, loads, "orders", "orders")
            await insert(admin, loads, "orders", status="running")  # not accepted: no event
            await insert(admin, loads, "customers")  # not matched: no event
            await insert(admin, loads, "orders")
            await watch.wait_for_items(3)
            await quiet()
        assert ids(watch.items) == [3, 4, 7]
        first = watch.items[0]
        assert first["row"]["dataset"] == "orders" and first["table"] == loads
        assert first["cursor"] == [3] and first["event_id"] == f"{loads}@[3]"
        assert first["matched"]["argument"] == "status"
        assert blocked == []
    assert held_keys() == {} and live_boards() == {}
    await no_sessions(admin, conn_id)  # the pool closed with the last watcher


async def test_backfill_fires_the_rows_already_there(conn_id: str, admin: asyncpg.Connection, loads: str) -> None:
    await insert(admin, loads, "a", "b", "c")
    async with WatcherHarness() as triggerer:
        watch = await triggerer.start(watcher(conn_id, loads, backfill=True, batch_size=2))  # two pages
        await watch.wait_for_items(3)
        await quiet()
        assert ids(watch.items) == [1, 2, 3]
        assert watch.items[0]["matched"]["comparator"] == "every new row"


async def test_equal_timestamps_are_told_apart_by_the_key_column(
    conn_id: str, admin: asyncpg.Connection, loads: str
) -> None:
    async with WatcherHarness() as triggerer:
        watch = await triggerer.start(watcher(conn_id, loads, order_column="loaded_at", key_column="id"))
        await quiet()
        await insert(admin, loads, "a", "b")  # both at 2030-01-01T00:00:00Z
        await watch.wait_for_items(2)
        await insert(admin, loads, "c")  # the same timestamp again, after the cursor moved there
        await watch.wait_for_items(3)
        await quiet()
        assert ids(watch.items) == [1, 2, 3]
        assert watch.items[2]["cursor"] == ["2030-01-01T00:00:00+00:00", 3]


async def test_a_restart_fires_what_arrived_while_down_and_a_crash_before_storing_fires_again(
    conn_id: str, admin: asyncpg.Connection, loads: str
) -> None:
    async with WatcherHarness() as first:
        watch = await first.start(watcher(conn_id, loads))
        await quiet()
        await insert(admin, loads, "a")
        await watch.wait_for_items(1)
        await until(lambda: first.stores.get("asset").writes >= 2)  # baseline, then row 1 (stored)
    await insert(admin, loads, "b")  # while no triggerer runs
    second = WatcherHarness(stores=first.stores, auto_store=False)
    async with second:
        watch = await second.start(watcher(conn_id, loads))
        await watch.wait_for_items(1)
        assert ids(watch.items) == [2]
        # dies before the event is stored
    async with WatcherHarness(stores=second.stores) as third:
        watch = await third.start(watcher(conn_id, loads))
        await watch.wait_for_items(1)
        await quiet()
        assert ids(watch.items) == [2]  # fired again, never lost; row 1 not again


async def test_a_row_that_cannot_be_judged_holds_back_the_rows_after_it_never_skips_them(
    conn_id: str, admin: asyncpg.Connection, loads: str
) -> None:
    trigger = watcher(conn_id, loads, predicate="tests.integration.postgres.predicates:enough_rows")
    async with WatcherHarness() as triggerer:
        watch = await triggerer.start(trigger)
        await quiet()
        await insert(admin, loads, "a", meta=json.dumps({"rows": 9}))
        await insert(admin, loads, "b", meta=json.dumps({"rows": "many"}))  # the predicate raises
        await insert(admin, loads, "c", meta=json.dumps({"rows": 7}))
        await watch.wait_for_items(1)
        await quiet()
        assert ids(watch.items) == [1]
        await admin.execute(f"UPDATE {loads} SET meta = '{{\"rows\": 1}}' WHERE id = 2")  # fixed: not enough
        await watch.wait_for_items(2)
        assert ids(watch.items) == [1, 3]


async def test_a_text_order_column_is_refused_and_nothing_fires(
    conn_id: str, admin: asyncpg.Connection, loads: str
) -> None:
    async with WatcherHarness() as triggerer:
        watch = await triggerer.start(watcher(conn_id, loads, order_column="dataset", backfill=True, max_backoff=0.2))
        await insert(admin, loads, "a")
        await quiet()
        assert watch.items == []
        assert watch.task is not None and not watch.task.done()  # logged and retried, never ended


async def test_a_notification_wakes_the_watchers_long_before_the_poll_interval(
    conn_id: str, admin: asyncpg.Connection, loads: str
) -> None:
    channel = unique("loads_changed")
    async with WatcherHarness() as triggerer:
        watch = await triggerer.start(watcher(conn_id, loads, poll_interval=60, notify_channel=channel))
        await quiet(1.0)  # the first look, and the LISTEN connection
        started = asyncio.get_running_loop().time()
        await insert(admin, loads, "a")
        await admin.execute(f"NOTIFY {channel}")
        await watch.wait_for_items(1, timeout=10)
        assert asyncio.get_running_loop().time() - started < 5


async def test_a_watcher_that_leaves_a_shared_channel_is_no_longer_woken_by_it(
    conn_id: str, admin: asyncpg.Connection, loads: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Two tables, one channel: one listener; the watcher of the first leaves, the other stays woken."""
    from airflow_deferrable_kit.triggers import postgres_events

    started: list[Any] = []
    real_start = postgres_events.start_listener

    async def recording(conn_id: str, channel: str) -> Any:
        started.append(await real_start(conn_id, channel))
        return started[-1]

    monkeypatch.setattr(postgres_events, "start_listener", recording)
    other = unique("loads")
    await admin.execute(f"CREATE TABLE {other} (id serial PRIMARY KEY, dataset text NOT NULL, status text)")
    channel = unique("loads_changed")
    try:
        async with WatcherHarness() as triggerer:
            leaving = await triggerer.start(watcher(conn_id, loads, poll_interval=60, notify_channel=channel))
            staying = await triggerer.start(watcher(conn_id, other, poll_interval=60, notify_channel=channel))
            await quiet(1.0)
            [listener] = started  # one listener for the channel, whatever the table
            assert len(listener._waiters) == 2
            assert leaving.task is not None
            leaving.task.cancel()
            await asyncio.gather(leaving.task, return_exceptions=True)
            await until(lambda: len(listener._waiters) == 1, timeout=10)
            await insert(admin, other, "b")
            await admin.execute(f"NOTIFY {channel}")
            await staying.wait_for_items(1, timeout=10)  # still woken, long before its 60 s poll
    finally:
        await admin.execute(f"DROP TABLE IF EXISTS {other}")


# ------------------------------------------------------------------------ one query
async def test_a_hundred_watchers_of_one_table_cost_one_query_per_round(
    conn_id: str, admin: asyncpg.Connection, loads: str
) -> None:
    rounds: list[float] = []

    class Counted(PostgresRowEventTrigger):
        async def poll(self, board: Any) -> Any:
            rounds.append(asyncio.get_running_loop().time())
            return await super().poll(board)

    await insert(admin, loads, *(f"old-{i}" for i in range(20)))
    before = await scans(admin, loads)
    watchers = [
        Counted(postgres_conn_id=conn_id, table=loads, order_column="id", poll_interval=0.2,
                success=[{"column": "dataset", "equals": f"d{i:03d}"}])
        for i in range(100)
    ]  # fmt: skip
    assert len({w.shared_stream_key() for w in watchers}) == 1
    async with WatcherHarness() as triggerer:
        watches = [await triggerer.start(w, assets=(f"asset-{i}",)) for i, w in enumerate(watchers)]
        await until(lambda: len(rounds) >= 5)
        await insert(admin, loads, *(f"d{i:03d}" for i in range(100)))
        for watch in watches:
            await watch.wait_for_items(1)
        await quiet()
    polls = len(rounds)
    await no_sessions(admin, conn_id)  # the pool closed: its sessions reported their scans on exit
    scanned = await scans(admin, loads) - before
    for i, watch in enumerate(watches):
        assert [p["row"]["dataset"] for p in watch.items] == [f"d{i:03d}"]
    # Each round reads the table once (plus, at the start, one look at where the rows end);
    # each watcher on its own would read it a hundred times a round.
    print(f"\n100 watchers: {polls} polls, {scanned} scans of the table")
    assert polls - 1 <= scanned <= polls + 2, (scanned, polls)
    assert 5 <= polls <= (rounds[-1] - rounds[0]) / 0.2 + 3


async def no_sessions(admin: asyncpg.Connection, conn_id: str) -> None:
    for _ in range(100):
        if not await backends(admin, conn_id):
            return
        await asyncio.sleep(0.05)
    raise AssertionError(f"sessions of {conn_id} still open")


async def scans(admin: asyncpg.Connection, table: str) -> int:
    """Sequential and index scans the server counted on ``table`` (reported by ended sessions too)."""
    await admin.execute("SELECT pg_stat_clear_snapshot()")
    value = await admin.fetchval(
        "SELECT coalesce(seq_scan, 0) + coalesce(idx_scan, 0) FROM pg_stat_user_tables WHERE relname = $1", table
    )
    return int(value or 0)


@pytest.fixture
def broken_predicate() -> Iterator[dict[str, bool]]:
    predicates.BROKEN["on"] = True
    try:
        yield predicates.BROKEN
    finally:
        predicates.BROKEN["on"] = True


async def test_a_watcher_stuck_on_a_row_never_holds_back_another_watcher_of_the_query(
    conn_id: str, admin: asyncpg.Connection, loads: str, broken_predicate: dict[str, bool]
) -> None:
    """Two watchers of one query share its stream; one cannot judge row 5 until its predicate is
    fixed. The other fires all 30 rows, past that page of 7; the stuck one, once fixed, fires from
    row 5 on, nothing lost and nothing twice."""
    healthy = watcher(conn_id, loads, batch_size=7)
    stuck = watcher(conn_id, loads, batch_size=7, predicate="tests.integration.postgres.predicates:broken_from_five")
    assert healthy.shared_stream_key() == stuck.shared_stream_key()
    async with WatcherHarness() as triggerer:
        watches = [await triggerer.start(w, assets=(name,)) for w, name in ((healthy, "a"), (stuck, "b"))]
        await until(lambda: all(w.trigger._board is not None for w in watches))  # type: ignore[attr-defined]
        await quiet()
        await insert(admin, loads, *(f"d{i}" for i in range(1, 31)))
        await watches[0].wait_for_items(30)
        await watches[1].wait_for_items(4)
        await quiet()
        assert ids(watches[0].items) == list(range(1, 31))
        assert ids(watches[1].items) == [1, 2, 3, 4]  # stuck on row 5: it and the rows after it wait
        broken_predicate["on"] = False  # the fix is deployed
        await watches[1].wait_for_items(30)
        await insert(admin, loads, "d31")
        await watches[0].wait_for_items(31)
        await watches[1].wait_for_items(31)
        await quiet()
    assert ids(watches[0].items) == list(range(1, 32))
    assert ids(watches[1].items) == list(range(1, 32))
    assert held_keys() == {} and live_boards() == {}


# ---------------------------------------------------------------------------- sustained flow
#: Airflow's ``[triggerer] shared_stream_ack_timeout`` (300 s) and the spacing (5 s), scaled down.
ACK_TIMEOUT, SPACING = 2.0, 0.25


def _saved_cursor(watch: Any) -> Any:
    """The cursor of the watermark saved in the watcher's asset state store (``None``: none)."""
    saved = list(watch.stores["asset"].values.values())  # the watcher's one watermark
    return saved[0]["state"]["cursor"] if saved else None


class SmallEventsTrigger(PostgresRowEventTrigger):
    """Events of 8 KiB at most: a sustained flow of ten events' worth per interval stays small."""

    max_event_bytes = 8 * 1024


async def test_a_look_of_many_events_never_meets_the_ack_timeout_and_its_watermark_is_saved(
    conn_id: str, admin: asyncpg.Connection, loads: str
) -> None:
    # 200 rows of ~500 bytes in one look: about 14 events of 8 KiB. Fired 0.25 s apart inside one
    # batch they took 3.5 s, past the ack timeout: the watcher was failed before its watermark
    # was saved, re-created by the triggerer, and fired the whole look again, for ever. (At the
    # defaults: a look of more than ~60 events of 512 KiB.)
    await insert(admin, loads, *["big"] * 200, meta=json.dumps({"blob": "x" * 400}))
    trigger = SmallEventsTrigger(
        postgres_conn_id=conn_id, table=loads, order_column="id", poll_interval=FAST, min_event_interval=SPACING,
        backfill=True,
    )  # fmt: skip
    async with WatcherHarness(ack_timeout=ACK_TIMEOUT) as triggerer:
        watch = await triggerer.start(trigger)
        await watch.wait_for_items(200, timeout=60)
        await until(lambda: _saved_cursor(watch) == [200], timeout=10)
        await quiet(ACK_TIMEOUT)  # an ack timeout still pending would fail the watcher now
        assert watch.task is not None and not watch.task.done()
    assert sorted(ids(watch.items)) == list(range(1, 201)) and len(watch.items) == 200  # each row once
    assert len(watch.events) >= 10 and all(json_size(p) <= SmallEventsTrigger.max_event_bytes for p in watch.payloads)


class TinyEventsTrigger(PostgresRowEventTrigger):
    """Events of 2 KiB at most (about three rows): a flow of ten events' worth per interval is a
    few hundred rows a second."""

    max_event_bytes = 2 * 1024


async def test_a_sustained_flow_ten_times_the_event_rate_never_meets_the_ack_timeout_nor_fires_twice(
    conn_id: str, admin: asyncpg.Connection, loads: str
) -> None:
    # About ten events' worth of rows every interval for three ack timeouts (scaled down to 0.5 s
    # and 0.05 s): the old watcher fired each look's ten events inside its batch and was failed
    # at the first. Now it fires one event per interval while the rest waits upstream, and
    # drains the backlog at that rate once the flow stops.
    ack_timeout, spacing = 0.5, 0.05
    trigger = TinyEventsTrigger(
        postgres_conn_id=conn_id, table=loads, order_column="id", poll_interval=spacing, min_event_interval=spacing
    )
    async with WatcherHarness(ack_timeout=ack_timeout) as triggerer:
        watch = await triggerer.start(trigger)
        await until(lambda: watch.stores["asset"].writes >= 1, timeout=10)  # the starting point
        made = 0
        loop = asyncio.get_running_loop()
        end = loop.time() + 3 * ack_timeout
        while loop.time() < end:
            await insert(admin, loads, *["flow"] * 30, meta=json.dumps({"blob": "y" * 200}))
            made += 30
            await asyncio.sleep(spacing)
            assert watch.task is not None and not watch.task.done(), watch.task.result()
        behind = made - len(watch.items)
        await watch.wait_for_items(made, timeout=60)  # drained, one event per interval
        await until(lambda: _saved_cursor(watch) == [made], timeout=10)
        await quiet(ack_timeout)
        assert not watch.task.done()
    assert sorted(ids(watch.items)) == list(range(1, made + 1)) and len(watch.items) == made  # each once
    assert behind > made // 2, (behind, made)  # the flow did outrun the watcher: the backlog was real
    assert all(json_size(p) <= TinyEventsTrigger.max_event_bytes for p in watch.payloads)
    print(f"\n{made} rows in {len(watch.events)} events; {behind} behind when the flow stopped")
