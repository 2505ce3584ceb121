"""Wait for a wall-clock moment."""

from __future__ import annotations

import asyncio
import time
from typing import Any

from airflow_deferrable_kit._per_loop import PerLoop
from airflow_deferrable_kit._wall_clock import WallClockAlarm
from airflow_deferrable_kit.payload import success_payload
from airflow_deferrable_kit.triggers.base import SYSTEM_CLOCK, Found, PollingTrigger, _pacer, parse_deadline

_alarms: PerLoop[WallClockAlarm] = PerLoop(lambda: WallClockAlarm(asyncio.get_running_loop(), _pacer().wake))


class DateTimeTrigger(PollingTrigger):
    """Fire when ``target_time`` (ISO 8601 with a UTC offset) is reached.

    On the system clock a wait costs nothing until its moment: one alarm per triggerer process
    (:mod:`airflow_deferrable_kit._wall_clock`) holds every wait's moment and re-reads the wall
    clock at least once a second, so a clock step (NTP, VM resume) is noticed within a second and
    a step backwards never fires early. Waits due at the same moment wake a batch per loop
    iteration. With another clock (a test's), the wait sleeps straight to the target in chunks no
    longer than ``poll_interval`` and checks the clock after each.
    """

    target_time: str
    poll_interval: float = 60.0

    spread_polls = False  # a clock read costs nothing; sleep straight to the target

    def validate(self) -> None:
        self._target_ts = parse_deadline(self.target_time, argument="target_time")

    def describe(self) -> str:
        return f"until {self.target_time}"

    async def check(self) -> Found | None:
        if self.clock.time() >= self._target_ts:
            return Found({"target_time": self.target_time})
        return None

    def next_poll_delay(self) -> float:
        return min(float(self.poll_interval), self._target_ts - self.clock.time())

    async def wait(self) -> dict[str, Any]:
        if self.clock is not SYSTEM_CLOCK:
            return await super().wait()
        self.log.info("Waiting: %s (deadline %s)", self.describe(), self.deadline or "none")
        deadline = self._deadline_ts
        moment = self._target_ts if deadline is None else min(self._target_ts, deadline)
        while True:
            self._metrics.poll()
            now = time.time()
            if deadline is not None and now >= deadline:
                return self._timed_out()
            if now >= self._target_ts:
                return self._safe(success_payload, Found({"target_time": self.target_time}))
            await _alarms.get().until(moment)
