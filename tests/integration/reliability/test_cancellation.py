"""Cancelling 1,000 waiting triggers of a kind leaves nothing behind.

The triggers are built by the sensor's deferral and run as the triggerer does (an asyncio task
iterating ``run()``, ``cleanup()`` on every exit). Once every one of them is waiting — holding
its lease on the shared client — all are cancelled. Afterwards: no lease held
(``leases.held_keys()`` empty: no S3 client, HTTP session, Postgres pool or Kafka reader), no
asyncio task left, and no more sockets open in this process than before they started.
"""

from __future__ import annotations

import asyncio

import pytest

from airflow_deferrable_kit import leases
from airflow_deferrable_kit.testing import run_trigger

from .conftest import KINDS, Waits, socket_count

N = 1000


async def run_like_the_triggerer(trigger: object) -> None:
    events = trigger.run()  # type: ignore[attr-defined]
    try:
        async for _ in events:
            raise AssertionError("a waiting trigger fired")
    finally:
        await events.aclose()
        await trigger.cleanup()  # type: ignore[attr-defined]


async def settle(condition: object, steps: int = 200) -> None:
    """Give asynchronous closes (pools, readers, connectors) a bounded number of loop turns."""
    for _ in range(steps):
        if condition():  # type: ignore[operator]
            return
        await asyncio.sleep(0.05)


@pytest.mark.parametrize("kind", KINDS)
async def test_cancelling_a_thousand_waiting_triggers_leaks_nothing(kind: str, waits: Waits) -> None:
    # Warm up: one full run, so lazy imports, lookups and caches are not counted as leaks.
    assert (await run_trigger(waits.trigger(kind, ready=True), timeout=60)).payload["status"] == "success"
    await settle(lambda: leases.held_keys() == {})
    sockets_before = socket_count()
    tasks_before = asyncio.all_tasks()

    triggers = [waits.trigger(kind, ready=False) for _ in range(N)]
    tasks = [asyncio.ensure_future(run_like_the_triggerer(t)) for t in triggers]
    await settle(lambda: kind == "datetime" or sum(leases.held_keys().values()) >= N, steps=1200)
    for _ in range(20):  # a few more turns so every waiter is past its first poll
        await asyncio.sleep(0.05)
    leases_while_waiting = sum(leases.held_keys().values())
    sockets_while_waiting = socket_count()
    assert not any(task.done() for task in tasks), [t.result() for t in tasks if t.done()][:3]

    for task in tasks:
        task.cancel()
    results = await asyncio.gather(*tasks, return_exceptions=True)
    await settle(lambda: socket_count() <= sockets_before and leases.held_keys() == {})

    print(
        f"{kind}: {N} waiting, {leases_while_waiting} leases, sockets {sockets_before} -> "
        f"{sockets_while_waiting} while waiting -> {socket_count()} after cancel"
    )
    assert sum(isinstance(r, asyncio.CancelledError) for r in results) == N
    if kind != "datetime":
        assert leases_while_waiting >= N  # every trigger really held its shared client
        assert sockets_while_waiting > sockets_before  # and the client really was connected
    assert leases.held_keys() == {}
    assert asyncio.all_tasks() - tasks_before - {asyncio.current_task()} == set()
    assert socket_count() <= sockets_before
