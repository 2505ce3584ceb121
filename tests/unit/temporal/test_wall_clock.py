"""The one wall-clock alarm per loop behind DateTimeTrigger, and what each waiting trigger keeps alive."""

from __future__ import annotations

import asyncio
import datetime as dt
import gc
import time

import pytest

from airflow_deferrable_kit import _wall_clock
from airflow_deferrable_kit._wall_clock import WallClockAlarm
from airflow_deferrable_kit.testing import run_trigger_payload
from airflow_deferrable_kit.triggers import base, temporal, timing
from airflow_deferrable_kit.triggers.base import deadline_after
from airflow_deferrable_kit.triggers.temporal import DateTimeTrigger


def iso(ts: float) -> str:
    return dt.datetime.fromtimestamp(ts, tz=dt.timezone.utc).isoformat()


class SteppableWall:
    """A wall clock that runs with the real one and can be stepped, as NTP steps a host's clock."""

    def __init__(self) -> None:
        self.offset = 0.0

    def __call__(self) -> float:
        return time.time() + self.offset


def woken_at_once(futures: list[asyncio.Future[None]]) -> None:
    for future in futures:
        if not future.done():
            future.set_result(None)


async def test_many_waits_on_one_moment_share_one_timer_and_wake_together() -> None:
    loop = asyncio.get_running_loop()
    handed: list[int] = []

    def wake(futures: list[asyncio.Future[None]]) -> None:
        handed.append(len(futures))
        woken_at_once(futures)

    alarm = WallClockAlarm(loop, wake)
    moment = time.time() + 0.2
    waits = [asyncio.ensure_future(alarm.until(moment)) for _ in range(500)]
    await asyncio.sleep(0)
    rings = [h for h in loop._scheduled if not h.cancelled() and h._callback == alarm._ring]  # type: ignore[attr-defined]
    assert len(rings) == 1  # one alarm, not 500 timers
    await asyncio.gather(*waits)
    assert time.time() >= moment
    assert handed == [500]  # one hand-over for the whole moment


async def test_a_step_backwards_never_fires_early_and_a_step_forward_is_seen_within_a_recheck(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(_wall_clock, "RECHECK_SECONDS", 0.05)
    wall = SteppableWall()
    alarm = WallClockAlarm(asyncio.get_running_loop(), woken_at_once, wall=wall)
    moment = wall() + 0.3
    wait = asyncio.ensure_future(alarm.until(moment))
    await asyncio.sleep(0.01)
    wall.offset = -3600.0  # the clock steps an hour back
    await asyncio.sleep(0.4)
    assert not wait.done()  # the monotonic time passed, the wall-clock moment did not
    wall.offset = 3600.0  # and an hour forward
    await asyncio.wait_for(wait, 0.5)
    assert wall() >= moment


async def test_cancelled_waits_leave_the_heap(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(_wall_clock, "COMPACT_AFTER", 10)
    alarm = WallClockAlarm(asyncio.get_running_loop(), woken_at_once)
    waits = [asyncio.ensure_future(alarm.until(time.time() + 3600)) for _ in range(40)]
    await asyncio.sleep(0)
    assert len(alarm) == 40
    for wait in waits[:30]:
        wait.cancel()
    await asyncio.gather(*waits[:30], return_exceptions=True)
    assert len(alarm) == 10  # compacted once the cancelled ones were the majority
    for wait in waits[30:]:
        wait.cancel()
    await asyncio.gather(*waits[30:], return_exceptions=True)


async def test_the_trigger_on_the_system_clock_fires_at_the_target_without_polling() -> None:
    target = time.time() + 0.3
    trigger = DateTimeTrigger(target_time=iso(target), poll_interval=0.01, deadline=deadline_after(3600))
    payload = await run_trigger_payload(trigger)
    assert payload == {"status": "success", "target_time": iso(target)}
    assert time.time() >= target


async def test_a_deadline_before_the_target_times_out_at_the_deadline_on_the_system_clock() -> None:
    started = time.time()
    trigger = DateTimeTrigger(target_time=iso(started + 3600), deadline=deadline_after(0.2))
    payload = await run_trigger_payload(trigger)
    assert payload["status"] == "timeout"
    assert 0.2 <= time.time() - started < 2.0


async def test_waits_due_together_are_handed_out_a_few_events_at_a_time(monkeypatch: pytest.MonkeyPatch) -> None:
    """Waits due at one moment reach the runner at most EVENTS_IN_FLIGHT at a time."""
    monkeypatch.setattr(base, "EVENTS_IN_FLIGHT", 4)
    monkeypatch.setattr(base, "_event_gates", base.PerLoop(lambda: asyncio.Semaphore(base.EVENTS_IN_FLIGHT)))
    target = time.time() + 0.1
    in_runner = peak = 0

    async def consume(trigger: DateTimeTrigger) -> None:
        nonlocal in_runner, peak
        async for _event in trigger.run():
            in_runner += 1
            peak = max(peak, in_runner)
            await asyncio.sleep(0.001)  # the runner logs the event through a thread, then takes the next
            in_runner -= 1

    await asyncio.gather(*(consume(DateTimeTrigger(target_time=iso(target))) for _ in range(50)))
    assert peak == 4


async def test_a_waiting_datetime_trigger_keeps_few_objects_alive() -> None:
    """The alarm keeps one heap entry and one future per wait; no logger, lease table or timer each."""
    target = time.time() + 3600
    gc.collect()
    before = len(gc.get_objects())
    tasks = [asyncio.ensure_future(DateTimeTrigger(target_time=iso(target)).run().__anext__()) for _ in range(500)]
    await asyncio.sleep(0.05)
    assert len(temporal._alarms.get()) >= 500
    per_wait = (len(gc.get_objects()) - before) / 500
    for task in tasks:
        task.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)
    print(f"objects kept alive per waiting DateTimeTrigger (with its task): {per_wait:.1f}")
    assert per_wait < 16


@pytest.mark.parametrize("seconds", [0.001, 0.5, 3.0, 30.0, 300.0, 86_400.0])
def test_shared_sleep_slots_never_end_early_and_stay_within_their_share(seconds: float) -> None:
    for start in (1_000.0, 1_000.0013, 123_456.789):
        end = start + seconds
        wakes = timing._slot(end, seconds) * timing.WAKE_RESOLUTION
        assert wakes >= end - 1e-9
        assert wakes - end <= max(timing.WAKE_RESOLUTION, seconds * timing.SLOT_SHARE) + 1e-9
