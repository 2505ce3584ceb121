"""One LISTEN connection wakes every wait of a channel: a bad member never dulls the wake-up.

The waits of one (connection, channel) share a :class:`ChannelListener` and, being woken in the
same instant, the batched statement of their query shape. What spreads through that is checked
here with the worst members a channel can carry: one whose query hangs past its
``statement_timeout``, one whose query raises once its row is there, one whose row its predicate
cannot judge, and the wait that opened the listener, cancelled before the notification.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from typing import Any

import asyncpg
import pytest

from airflow_deferrable_kit._postgres.batches import BUDGET_SCALE_MAX
from airflow_deferrable_kit.leases import held_keys
from airflow_deferrable_kit.testing import run_trigger_payload
from airflow_deferrable_kit.triggers.postgres import PostgresBatchMarkerTrigger

from .helpers import backends, unique, until

CHANNEL = "adk_poisoned"
STATEMENT_TIMEOUT = 1.0
POLL_INTERVAL = 30.0  # far past the test's wait: a healthy wait ends only because it was woken


@pytest.fixture
async def faulty(admin: asyncpg.Connection, markers: str) -> AsyncIterator[str]:
    """A check function: 6 s for the key 'slow', division by zero for 'boom' once its row exists."""
    name = unique("faulty")
    await admin.execute(
        f"""CREATE FUNCTION {name}(key text) RETURNS boolean LANGUAGE plpgsql VOLATILE AS $$
            BEGIN
              IF key = 'slow' THEN PERFORM pg_sleep(6); END IF;
              IF key = 'boom' AND EXISTS (SELECT FROM {markers} WHERE batch_id = 'boom') THEN
                RETURN 1 / 0 = 1;
              END IF;
              RETURN true;
            END $$"""
    )
    try:
        yield name
    finally:
        await admin.execute(f"DROP FUNCTION {name}(text)")


async def test_a_slow_a_raising_an_unjudgeable_and_a_departed_member_never_delay_the_others_wake_up(
    conn_id: str, admin: asyncpg.Connection, markers: str, faulty: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    await admin.execute(f"INSERT INTO {markers} (batch_id, status) VALUES ('slow', 'running')")
    # Two query shapes, so a fast failing batch does not hide a slow one: half the healthy waits
    # share their statement with the slow wait, half with the raising and the unjudgeable ones.
    shapes = {
        "slow": f"SELECT * FROM {markers} WHERE batch_id = $1 AND {faulty}(batch_id) LIMIT 1",
        "raising": f"SELECT * FROM {markers} WHERE batch_id = $1 AND {faulty}(batch_id) AND status IS NOT NULL LIMIT 1",
    }
    checks: dict[int, list[float]] = {}  # when each wait's checks started
    answered: dict[int, int] = {}  # checks that returned or raised
    original = PostgresBatchMarkerTrigger.check

    async def counted(self: PostgresBatchMarkerTrigger) -> Any:
        checks.setdefault(id(self), []).append(time.perf_counter())
        try:
            return await original(self)
        finally:
            answered[id(self)] = answered.get(id(self), 0) + 1

    monkeypatch.setattr(PostgresBatchMarkerTrigger, "check", counted)

    def wait(key: str, shape: str, **kwargs: Any) -> PostgresBatchMarkerTrigger:
        return PostgresBatchMarkerTrigger(
            postgres_conn_id=conn_id,
            sql=shapes[shape],
            parameters=[key],
            notify_channel=CHANNEL,
            poll_interval=POLL_INTERVAL,
            statement_timeout=STATEMENT_TIMEOUT,
            **kwargs,
        )

    opener = wait("opener", "slow")  # started first: its lease builds the shared listener
    healthy = [wait(f"h{i}", "slow" if i % 2 else "raising") for i in range(30)]
    slow, boom = wait("slow", "slow"), wait("boom", "raising")
    unjudgeable = wait("unjudgeable", "raising", predicate="tests.integration.postgres.predicates:explode")
    bad = [slow, boom, unjudgeable]
    arrived: dict[int, float] = {}

    async def run(trigger: PostgresBatchMarkerTrigger) -> dict[str, Any]:
        payload = await run_trigger_payload(trigger, timeout=60)
        arrived[id(trigger)] = time.perf_counter()
        return payload

    async def settled(members: list[PostgresBatchMarkerTrigger]) -> None:
        """No check of ``members`` in flight, twice in a row a second apart: all in their long sleep."""
        quiet = 0
        for _ in range(30):
            idle = all(len(checks[id(t)]) == answered.get(id(t), 0) for t in members)
            quiet = quiet + 1 if idle else 0
            if quiet == 2:
                return
            await asyncio.sleep(1.0)
        raise AssertionError("the healthy waits never settled")

    first = asyncio.create_task(run(opener))
    await until(lambda: bool(held_keys()))
    tasks = {id(t): asyncio.create_task(run(t)) for t in [*healthy, *bad]}
    try:
        # The first round: everybody in one statement, which the slow query holds past its
        # budget; re-asked one by one, the slow wait times out alone and is asked alone from then.
        # (The listener's connection wakes everybody once more, for what it may have missed.)
        await until(lambda: len(answered) == len(healthy) + len(bad) + 1, timeout=30)
        await settled([*healthy, slow])  # the slow one in its backoff, which a notification cuts short
        sessions = await backends(admin, conn_id)
        listening = [s["pid"] for s in sessions if (s["query"] or "").startswith("LISTEN")]
        assert len(listening) == 1, sessions
        # The wait that opened the listener leaves: the listener is the others' still.
        first.cancel()
        await asyncio.gather(first, return_exceptions=True)
        assert not any(t.done() for t in tasks.values())
        before = {key: len(times) for key, times in checks.items()}
        await admin.executemany(
            f"INSERT INTO {markers} (batch_id, status) VALUES ($1, 'done')",
            [(f"h{i}",) for i in range(30)] + [("boom",), ("unjudgeable",)],
        )
        await asyncio.sleep(0.5)
        assert not any(t.done() for t in tasks.values())  # nobody polls: a poll is 30 s away
        sent = time.perf_counter()
        await admin.execute(f"NOTIFY {CHANNEL}")
        payloads = await asyncio.gather(*(tasks[id(t)] for t in healthy))
        done_boom, done_unjudgeable = await asyncio.gather(tasks[id(boom)], tasks[id(unjudgeable)])
        sessions_after = await backends(admin, conn_id)
    finally:
        for task in tasks.values():
            task.cancel()
        await asyncio.gather(*tasks.values(), return_exceptions=True)

    assert [p["status"] for p in payloads] == ["success"] * 30
    assert [p["row"]["batch_id"] for p in payloads] == [f"h{i}" for i in range(30)]
    # Woken by the one notification: exactly one check each after it, and it found the row.
    for trigger in healthy:
        assert len(checks[id(trigger)]) - before[id(trigger)] == 1, trigger.parameters
    latencies = sorted(arrived[id(t)] - sent for t in healthy)
    print(f"\nNOTIFY -> 30 healthy events beside 3 bad members: max {latencies[-1] * 1000:.0f} ms")
    # Never held for the slow query: in one statement with it they would wait out the batch's
    # budget (statement_timeout x BUDGET_SCALE_MAX) before being asked again one by one.
    assert latencies[-1] < STATEMENT_TIMEOUT * BUDGET_SCALE_MAX
    # Each bad member ended (or not) as it would alone.
    assert done_boom["status"] == "error" and "division by zero" in done_boom["message"], done_boom
    assert done_unjudgeable["status"] == "error" and done_unjudgeable["error_type"] == "predicate_error"
    assert id(slow) not in arrived  # still waiting: a timeout is transient, it retries to its deadline
    assert len(checks[id(slow)]) > before[id(slow)]  # it was woken too, and asked alone, beside the batch
    # One LISTEN session all along, the one opened first, though its opener is gone.
    assert [s["pid"] for s in sessions_after if (s["query"] or "").startswith("LISTEN")] == listening
    assert held_keys() == {}
