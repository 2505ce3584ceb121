"""``watch_blocking`` reports code that holds the loop, and not a machine that is merely busy.

Real blocking both ways it happens (a blocking call that sleeps, CPU work) is reported; a short
callback slowed only because other processes took its CPU is listed as preempted instead: the
test pins this process and three busy processes to one CPU, as a loaded CI machine would.
"""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import time
from collections.abc import Iterator

import pytest

from airflow_deferrable_kit.testing import watch_blocking


def _spin(seconds: float) -> None:
    """Use ``seconds`` of this thread's CPU (however long that takes on the wall clock)."""
    end = time.thread_time() + seconds
    while time.thread_time() < end:
        pass


async def test_a_blocking_sleep_is_reported() -> None:
    with watch_blocking(0.05) as blocked:
        asyncio.get_running_loop().call_soon(time.sleep, 0.12)
        await asyncio.sleep(0.2)
    assert len(blocked) == 1 and "took 0.1" in blocked[0], blocked
    assert "voluntary" in blocked[0]


async def test_cpu_work_is_reported() -> None:
    with watch_blocking(0.05) as blocked:
        asyncio.get_running_loop().call_soon(_spin, 0.1)
        await asyncio.sleep(0.05)
    assert len(blocked) == 1, blocked
    assert blocked.preempted == []


async def test_a_short_callback_is_not_reported() -> None:
    with watch_blocking(0.05) as blocked:
        for _ in range(20):
            asyncio.get_running_loop().call_soon(_spin, 0.002)
        await asyncio.sleep(0.1)
    assert blocked == [] and blocked.preempted == []


@pytest.fixture
def crowded_cpu() -> Iterator[None]:
    """This process and three busy ones share one CPU until the test ends."""
    if not hasattr(os, "sched_setaffinity"):
        pytest.fail("this test needs os.sched_setaffinity (Linux)")
    before = os.sched_getaffinity(0)
    cpu = min(before)
    os.sched_setaffinity(0, {cpu})
    hogs = [
        subprocess.Popen([sys.executable, "-c", f"import os; os.sched_setaffinity(0, {{{cpu}}})\nwhile True: pass"])
        for _ in range(3)
    ]
    time.sleep(0.3)  # let them start spinning
    try:
        yield
    finally:
        for hog in hogs:
            hog.kill()
            hog.wait()
        os.sched_setaffinity(0, before)


async def test_a_short_callback_slowed_by_other_processes_is_preempted_not_blocking(crowded_cpu: None) -> None:
    with watch_blocking(0.05) as blocked:
        for _ in range(5):
            asyncio.get_running_loop().call_soon(_spin, 0.02)  # 20 ms of CPU: ~80 ms on a CPU shared four ways
            await asyncio.sleep(0.01)
    assert blocked == [], blocked
    assert blocked.preempted, "no callback took long: the CPU was not crowded, the test proves nothing"
    assert all("CPU 0.0" in line for line in blocked.preempted), blocked.preempted


async def test_debug_modes_future_tracebacks_are_not_blamed_on_the_callback_but_real_work_is() -> None:
    """asyncio's debug mode records where each future was created (~0.5 ms each): a callback
    creating 2,000 futures costs nothing of that without debug mode, so it is not reported; a
    callback that computes for 0.15 s still is."""
    loop = asyncio.get_running_loop()

    def many_futures() -> None:
        for _ in range(2000):
            loop.create_future()

    def busy() -> None:
        end = time.thread_time() + 0.15
        while time.thread_time() < end:
            pass

    with watch_blocking(0.1) as blocked:
        loop.call_soon(many_futures)
        await asyncio.sleep(0.01)
    assert blocked == []
    with watch_blocking(0.1) as blocked:
        loop.call_soon(busy)
        await asyncio.sleep(0.01)
    assert len(blocked) == 1 and "busy" in blocked[0]
