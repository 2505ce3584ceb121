"""Wait for a wall-clock moment."""

from __future__ import annotations

from airflow_deferrable_kit.triggers.base import Found, PollingTrigger, parse_deadline


class DateTimeTrigger(PollingTrigger):
    """Fire when ``target_time`` (ISO 8601 with a UTC offset) is reached.

    Sleeps straight to the target but never longer than ``poll_interval`` at a time, and checks
    the wall clock after each sleep: a clock step (NTP, VM resume) is noticed within one
    ``poll_interval`` instead of trusting one long monotonic sleep.
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
