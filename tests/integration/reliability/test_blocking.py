"""No trigger of any kind blocks the event loop, against the real services.

Runs, under asyncio debug mode with a 50 ms slow-callback threshold
(:func:`airflow_deferrable_kit.testing.watch_blocking`, which also freezes the GC): one trigger
whose condition holds, to its event, and 50 waiting triggers through their first poll until they
are cancelled and cleaned up — client creation, connection resolution, polling, cancellation and
client close all inside the watch. The connection lookup is warmed first (Airflow imports its
lookup machinery once per process, off the loop). The first trigger of a kind also runs in a
fresh process, where lazy imports would show; a report there counts when it repeats in each of
three fresh processes (the code blocks every time, a busy machine does not); in this process, a
report counts when it repeats in each of three rounds. The HTTP API
answers from a process of its own here: a server thread in the test process would hold the GIL
the loop waits for, which no real triggerer shares.
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from collections.abc import Iterator

import pytest

from airflow_deferrable_kit import leases
from airflow_deferrable_kit.connections import get_connection
from airflow_deferrable_kit.testing import run_trigger, watch_blocking
from scripts import services
from tests import REPO

from .conftest import KINDS, Waits

WAITING = 50
#: Rounds (and fresh processes) a report must repeat in before it counts.
FRESH_RUNS = 3


ROOT = REPO  # the repository root, so `tests` imports


@pytest.fixture(scope="module")
def http_elsewhere() -> Iterator[int]:
    """The reliability HTTP API in a process of its own; yields its port."""
    port = services.free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "tests.integration.reliability.http_api", str(port)],
        stdin=subprocess.PIPE,
        cwd=ROOT,
        start_new_session=True,  # stop_process signals its whole group
    )
    try:
        services.wait_for_port(port, timeout=60, proc=proc, what="the reliability HTTP API process")
        yield port
    finally:
        services.stop_process(proc)


async def held() -> int:
    return sum(leases.held_keys().values())


@pytest.mark.parametrize("kind", KINDS)
async def test_no_blocking_report(
    kind: str, waits: Waits, http_elsewhere: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    if kind == "http":
        conn = waits.world.connections()["http"] | {"port": http_elsewhere}
        monkeypatch.setenv("AIRFLOW_CONN_REL_HTTP", json.dumps(conn))
    if kind != "datetime":
        await get_connection(f"rel_{kind}")
    served_here = len(waits.world.http.requests)
    # A blocking call blocks in every round; a GIL held by another thread of this process (an
    # executor thread doing a connection lookup) or a busy disk does not do it again. So a
    # report counts only if each of FRESH_RUNS rounds makes one, as for fresh processes below.
    reports: list[list[str]] = []
    for _ in range(FRESH_RUNS):
        reports.append(await one_round(kind, waits))
        if not reports[-1]:
            break
    assert [] in reports, reports
    assert len(waits.world.http.requests) == served_here  # the in-process server was not asked


async def one_round(kind: str, waits: Waits) -> list[str]:
    """One trigger to its event and 50 waiting ones to their first poll and cancel, watched."""
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
    assert leases.held_keys() == {}  # every client closed: the next round builds them again
    return list(blocked)


@pytest.mark.parametrize("kind", KINDS)
def test_first_trigger_in_a_fresh_triggerer_process_does_not_block(kind: str, waits: Waits) -> None:
    """A real triggerer runs the first trigger of a kind in a process that has imported nothing
    of its client library yet: lazy imports inside ``run()`` would block the loop there, which an
    in-process test (where other tests already imported everything) cannot see."""
    classpath, kwargs = waits.trigger(kind, ready=True).serialize()
    spec = json.dumps([classpath, kwargs, None if kind == "datetime" else f"rel_{kind}"])
    reports: list[list[str]] = []
    # What a fresh process does first (a lazy import, a file read) blocks in every fresh process;
    # a disk or a GIL holder that another job on the machine held up does not do it again. So a
    # report counts only if each of FRESH_RUNS fresh processes makes one.
    for _ in range(FRESH_RUNS):
        done = subprocess.run(
            [sys.executable, "-m", "tests.integration.reliability.first_run", spec],
            capture_output=True,
            text=True,
            timeout=120,
            cwd=ROOT,
        )
        lines = [line for line in done.stdout.splitlines() if line.startswith("RESULT ")]
        assert done.returncode == 0 and lines, done.stderr[-3000:]
        result = json.loads(lines[-1].removeprefix("RESULT "))
        assert result["payload"]["status"] == "success", result["payload"]
        reports.append(result["blocked"])
        if not result["blocked"]:
            break
    assert [] in reports, reports
