"""No trigger of any kind blocks the event loop, against the real services.

Runs, under asyncio debug mode with a 50 ms slow-callback threshold
(:func:`airflow_deferrable_kit.testing.watch_blocking`, which also freezes the GC): one trigger
whose condition holds, to its event, and 50 waiting triggers through their first poll until they
are cancelled and cleaned up — client creation, connection resolution, polling, cancellation and
client close all inside the watch. The connection lookup is warmed first (Airflow imports its
lookup machinery once per process, off the loop). The first trigger of a kind also runs in a
fresh process, where lazy imports would show; a report there counts when it repeats in each of
three fresh processes (the code blocks every time, a busy machine does not).
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from airflow_deferrable_kit import clients
from airflow_deferrable_kit.connections import get_connection
from airflow_deferrable_kit.testing import run_trigger, watch_blocking

from .conftest import KINDS, Waits

WAITING = 50
#: Fresh processes a first-trigger report must repeat in before it counts.
FRESH_RUNS = 3


async def held() -> int:
    return sum(clients.held_keys().values())


@pytest.mark.parametrize("kind", KINDS)
async def test_no_blocking_report(kind: str, waits: Waits) -> None:
    if kind != "datetime":
        await get_connection(f"rel_{kind}")
    ready = waits.trigger(kind, ready=True)
    waiting = [waits.trigger(kind, ready=False) for _ in range(WAITING)]

    with watch_blocking(0.05) as blocked:
        event = await run_trigger(ready, timeout=60)
        tasks = [asyncio.ensure_future(run_trigger(t, timeout=600)) for t in waiting]
        for _ in range(400):  # let every waiter lease its client and poll (bounded by steps)
            await asyncio.sleep(0.025)
            if kind == "datetime" or await held() >= WAITING:
                break
        for number, task in enumerate(tasks, start=1):
            task.cancel()
            if number % 10 == 0:  # the test's own bulk cancel is not what is being watched
                await asyncio.sleep(0)
        results = await asyncio.gather(*tasks, return_exceptions=True)

    assert event.payload["status"] == "success", event.payload
    assert all(isinstance(r, asyncio.CancelledError) for r in results), results[:3]
    assert blocked == []
    assert clients.held_keys() == {}


@pytest.mark.parametrize("kind", KINDS)
def test_first_trigger_in_a_fresh_triggerer_process_does_not_block(kind: str, waits: Waits) -> None:
    """A real triggerer runs the first trigger of a kind in a process that has imported nothing
    of its client library yet: lazy imports inside ``run()`` would block the loop there, which an
    in-process test (where other tests already imported everything) cannot see."""
    import json
    import subprocess
    import sys

    classpath, kwargs = waits.trigger(kind, ready=True).serialize()
    spec = json.dumps([classpath, kwargs, None if kind == "datetime" else f"rel_{kind}"])
    reports: list[list[str]] = []
    # What a fresh process does first (a lazy import, a file read) blocks in every fresh process;
    # a disk or a GIL holder that another job on the machine held up does not do it again. So a
    # report counts only if each of FRESH_RUNS fresh processes makes one.
    for _ in range(FRESH_RUNS):
        done = subprocess.run(
            [sys.executable, "-m", "tests.reliability.first_run", spec],
            capture_output=True,
            text=True,
            timeout=120,
            cwd=Path(__file__).resolve().parents[2],  # the repository root, so `tests` imports
        )
        lines = [line for line in done.stdout.splitlines() if line.startswith("RESULT ")]
        assert done.returncode == 0 and lines, done.stderr[-3000:]
        result = json.loads(lines[-1].removeprefix("RESULT "))
        assert result["payload"]["status"] == "success", result["payload"]
        reports.append(result["blocked"])
        if not result["blocked"]:
            break
    assert [] in reports, reports
