"""One bounded pool and one LISTEN connection per process, counted in pg_stat_activity."""

from __future__ import annotations

import asyncio
import statistics
import time
from typing import Any

import asyncpg
import pytest

from airflow_deferrable_kit._shared_polls import REUSE_MAX as LISTING_REUSE_MAX
from airflow_deferrable_kit.leases import held_keys
from airflow_deferrable_kit.testing import run_trigger_payload
from airflow_deferrable_kit.triggers.base import deadline_after
from airflow_deferrable_kit.triggers.postgres import WAKE_MIN_GAP, PostgresBatchMarkerTrigger

from .helpers import ConnSetter, backends, until


async def test_500_waiting_triggers_share_a_pool_of_4_connections(
    conn_id: str, admin: asyncpg.Connection, markers: str
) -> None:
    triggers = [
        PostgresBatchMarkerTrigger(
            postgres_conn_id=conn_id,
            table=markers,
            match={"batch_id": f"b{i % 50}"},
            status_column="status",
            ready_values=["done"],
            poll_interval=0.5,
        )
        for i in range(500)
    ]
    tasks = [asyncio.create_task(run_trigger_payload(t, timeout=60)) for t in triggers]
    most, pids = 0, set()
    for _ in range(25):  # ~2.5 s: every trigger polls several times meanwhile
        sessions = await backends(admin, conn_id)
        most = max(most, len(sessions))
        pids |= {s["pid"] for s in sessions}
        await asyncio.sleep(0.1)
    assert not any(t.done() for t in tasks)
    await admin.executemany(
        f"INSERT INTO {markers} (batch_id, status) VALUES ($1, 'done')", [(f"b{i}",) for i in range(50)]
    )
    payloads = await asyncio.gather(*tasks)
    assert all(p["status"] == "success" for p in payloads)
    assert {p["row"]["batch_id"] for p in payloads} == {f"b{i}" for i in range(50)}
    print(f"\n500 triggers: at most {most} sessions at once, {len(pids)} distinct server sessions overall")
    assert 1 <= most <= 4
    assert len(pids) <= 4  # the same sessions were reused, not reopened
    assert held_keys() == {}
    for _ in range(100):  # released at cleanup: the pool closes its sessions
        if not await backends(admin, conn_id):
            break
        await asyncio.sleep(0.05)
    assert await backends(admin, conn_id) == []


async def test_a_sleeping_waiter_holds_no_connection(
    connect: ConnSetter, admin: asyncpg.Connection, markers: str
) -> None:
    conn_id = connect(extra={"pool_max_size": 1})
    sleeper = PostgresBatchMarkerTrigger(
        postgres_conn_id=conn_id, table=markers, match={"batch_id": "never"}, poll_interval=30
    )
    sleeping = asyncio.create_task(run_trigger_payload(sleeper, timeout=60))
    await until(lambda: bool(held_keys()))
    await admin.execute(f"INSERT INTO {markers} (batch_id) VALUES ('now')")
    busy = PostgresBatchMarkerTrigger(
        postgres_conn_id=conn_id, table=markers, match={"batch_id": "now"}, poll_interval=0.05
    )
    payload = await run_trigger_payload(busy, timeout=20)  # would time out if the sleeper kept the only connection
    assert payload["status"] == "success"
    assert len(await backends(admin, conn_id)) == 1
    sleeping.cancel()
    await asyncio.gather(sleeping, return_exceptions=True)


async def _listening(admin: asyncpg.Connection, application_name: str) -> list[asyncpg.Record]:
    """The sessions of ``application_name`` once one of them has run LISTEN."""
    for _ in range(400):
        sessions = await backends(admin, application_name)
        if any((s["query"] or "").startswith("LISTEN") for s in sessions):
            return sessions
        await asyncio.sleep(0.05)
    raise AssertionError("no session started listening")


async def _settled(counts: list[int]) -> None:
    """Wait until no trigger has polled for a while (all are in their long sleep).

    A poll is answered when its batch is sent, at most one sharing window after it started, so
    "no new poll for longer than a window" means every poll so far has its answer.
    """
    previous = None
    for _ in range(40):
        current = list(counts)
        if current == previous and all(current):
            return
        previous = current
        await asyncio.sleep(LISTING_REUSE_MAX + 0.3)
    raise AssertionError("the triggers never settled")


def _counting(monkeypatch: pytest.MonkeyPatch, triggers: list[PostgresBatchMarkerTrigger]) -> list[int]:
    counts = [0] * len(triggers)
    index = {id(t): i for i, t in enumerate(triggers)}
    original = PostgresBatchMarkerTrigger.check

    async def counted(self: PostgresBatchMarkerTrigger) -> Any:
        counts[index[id(self)]] += 1
        return await original(self)

    monkeypatch.setattr(PostgresBatchMarkerTrigger, "check", counted)
    return counts


async def test_notify_wakes_every_waiter_at_once_through_one_listen_connection(
    conn_id: str, admin: asyncpg.Connection, markers: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    triggers = [
        PostgresBatchMarkerTrigger(
            postgres_conn_id=conn_id,
            table=markers,
            match={"batch_id": f"b{i}"},
            notify_channel="adk_batches",
            poll_interval=30,  # a poll could not answer within this test's timeout
        )
        for i in range(20)
    ]
    counts = _counting(monkeypatch, triggers)
    arrived: dict[int, float] = {}

    async def run(i: int) -> dict[str, Any]:
        payload = await run_trigger_payload(triggers[i], timeout=20)
        arrived[i] = time.perf_counter()
        return payload

    tasks = [asyncio.create_task(run(i)) for i in range(20)]
    sessions = await _listening(admin, conn_id)
    await _settled(counts)
    before = list(counts)
    await admin.executemany(f"INSERT INTO {markers} (batch_id) VALUES ($1)", [(f"b{i}",) for i in range(20)])
    await asyncio.sleep(0.5)
    assert counts == before and not any(t.done() for t in tasks)  # nobody polled: they sleep 30 s
    sent = time.perf_counter()
    await admin.execute("NOTIFY adk_batches, 'ready'")
    payloads = await asyncio.gather(*tasks)
    assert all(p["status"] == "success" for p in payloads)
    assert [c - b for c, b in zip(counts, before, strict=True)] == [1] * 20  # exactly one re-check each
    latencies = sorted((t - sent) * 1000 for t in arrived.values())
    print(
        f"\nNOTIFY -> 20 events: median {statistics.median(latencies):.1f} ms, max {latencies[-1]:.1f} ms "
        f"(poll_interval 30 s)"
    )
    assert len([s for s in sessions if (s["query"] or "").startswith("LISTEN")]) == 1  # one for 20 waiters


async def test_a_notify_storm_does_not_become_a_query_storm(
    conn_id: str, admin: asyncpg.Connection, markers: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    trigger = PostgresBatchMarkerTrigger(
        postgres_conn_id=conn_id,
        table=markers,
        match={"batch_id": "never"},
        notify_channel="adk_storm",
        poll_interval=30,
        deadline=deadline_after(60),
    )
    counts = _counting(monkeypatch, [trigger])
    task = asyncio.create_task(run_trigger_payload(trigger, timeout=60))
    await _listening(admin, conn_id)
    await _settled(counts)
    before = counts[0]
    started = time.perf_counter()
    for _ in range(100):
        await admin.execute("NOTIFY adk_storm")
    await asyncio.sleep(0.5)
    elapsed = time.perf_counter() - started
    checks = counts[0] - before
    task.cancel()
    await asyncio.gather(task, return_exceptions=True)
    print(f"\n100 notifications in {elapsed:.2f}s caused {checks} re-checks")
    assert 1 <= checks <= elapsed / WAKE_MIN_GAP + 2
