"""Wait for a wall-clock moment."""

from __future__ import annotations

import asyncio
import datetime as dt
import time
from typing import Any, Final

from airflow_deferrable_kit._moments import (
    run_base_time,
    shifted,
    time_on_run_date,
    to_time_of_day,
    to_timedelta,
    to_utc_iso,
)
from airflow_deferrable_kit._per_loop import PerLoop
from airflow_deferrable_kit._wall_clock import WallClockAlarm
from airflow_deferrable_kit.errors import ErrorType
from airflow_deferrable_kit.payload import error_payload, success_payload
from airflow_deferrable_kit.triggers.base import SYSTEM_CLOCK, Found, PollingTrigger, _pacer, parse_deadline

_alarms: PerLoop[WallClockAlarm] = PerLoop(lambda: WallClockAlarm(asyncio.get_running_loop(), _pacer().wake))


class DateTimeTrigger(PollingTrigger):
    """Fire when ``target_time`` is reached: a datetime or a date-and-time string, with no offset
    read in Airflow's default timezone, carried as UTC ISO 8601 (see :meth:`normalise`).

    On the system clock a wait costs nothing until its moment: one alarm per triggerer process
    (:mod:`airflow_deferrable_kit._wall_clock`) holds every wait's moment and re-reads the wall
    clock at least once a second, so a clock step (NTP, VM resume) is noticed within a second and
    a step backwards never fires early. Waits due at the same moment wake a batch per loop
    iteration. With another clock (a test's), the wait sleeps straight to the target in chunks no
    longer than ``poll_interval`` and checks the clock after each.
    """

    __slots__ = ("_target_iso", "_target_ts")  # its state: see PollingTrigger.__slots__

    target_time: str
    poll_interval: float = 60.0

    spread_polls = False  # a clock read costs nothing; sleep straight to the target

    def normalise(self) -> None:
        """``target_time`` as UTC ISO 8601, read as ``DateTimeSensor`` reads it (:func:`to_utc_iso`).

        A datetime, or a string without an offset (``{{ ds }}``), is read in Airflow's default
        timezone, on the worker path and when rendered in the triggerer alike.
        """
        self.target_time = to_utc_iso(self.target_time, argument="target_time")

    def validate(self) -> None:
        self._target_ts = parse_deadline(self.target_time, argument="target_time")
        self._target_iso = self.target_time

    def describe(self) -> str:
        return f"until {self._target_iso}"

    async def check(self) -> Found | None:
        if self.clock.time() >= self._target_ts:
            return Found({"target_time": self._target_iso})
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
                return self._safe(success_payload, Found({"target_time": self._target_iso}))
            await _alarms.get().until(moment)


#: How :class:`RunMomentTrigger` works its moment out, by the sensor it stands in for.
RUN_MOMENT_RULES: Final = {
    "delta_after_run": "TimeDeltaSensor",
    "time_on_run_date": "TimeSensor",
    "after_start": "WaitSensor",
}


class RunMomentTrigger(DateTimeTrigger):
    """The time waits whose moment comes from the run, started by Airflow in the triggerer.

    ``TimeDeltaSensor``, ``TimeSensor`` and ``WaitSensor`` work their moment out when a try
    starts: on the worker path in the worker; with ``start_from_trigger`` there is none, so this
    trigger does it once Airflow has started it, from what Airflow stores with the task instance
    (a restarted or adopting triggerer finds the same moment): the run's dates and the DAG's
    timezone from the template context it renders with, and the start of the wait from the try's
    trigger timeout (:meth:`~airflow_deferrable_kit.triggers.base.PollingTrigger.started_at`).
    The success payload is ``DateTimeSensor``'s: the moment as UTC ISO 8601.

    :param rule: ``"delta_after_run"``: ``delta`` after the run's ``data_interval_end`` (else
        ``run_after``); ``"time_on_run_date"``: ``target_time`` of day in the DAG's timezone on
        the run's date; ``"after_start"``: ``time_to_wait`` after the wait started.
    :param span_seconds: the span of ``delta_after_run`` / ``after_start`` when the sensor knew
        it at DAG parse; a templated span travels as written instead, under the sensor's own
        name (``delta``, ``time_to_wait``), for Airflow to render.
    :param target_time: for ``time_on_run_date``, the time of day (``"18:30:00"``, templated).
    """

    __slots__ = ("_span",)  # its state: see PollingTrigger.__slots__

    target_time: str = ""
    rule: str
    span_seconds: float | None = None
    delta: str | None = None
    time_to_wait: str | None = None

    def normalise(self) -> None:
        """Nothing: ``target_time`` here is a time of day, read by :meth:`validate`."""

    def validate(self) -> None:
        if self.rule not in RUN_MOMENT_RULES:
            raise ValueError(f"rule must be one of {', '.join(RUN_MOMENT_RULES)}, got {self.rule!r}")
        self._target_ts: float | None = None  # type: ignore[assignment]
        self._target_iso = ""
        if self.rule == "time_on_run_date":
            self._time_of_day = to_time_of_day(self.target_time)
            return
        given: str | dt.timedelta | None = self.delta if self.rule == "delta_after_run" else self.time_to_wait
        name = "delta" if self.rule == "delta_after_run" else "time_to_wait"
        if (given is None) == (self.span_seconds is None):
            raise ValueError(f"rule {self.rule!r} takes its span from span_seconds or {name}: give exactly one")
        if given is None:
            if isinstance(self.span_seconds, bool) or not isinstance(self.span_seconds, (int, float)):
                raise ValueError(f"span_seconds must be a number of seconds, got {self.span_seconds!r}")
            given = dt.timedelta(seconds=self.span_seconds)
        self._span = to_timedelta(given, argument=name, allow_negative=self.rule == "delta_after_run")

    def describe(self) -> str:
        if self._target_iso:
            return super().describe()
        return f"{RUN_MOMENT_RULES[self.rule]}'s moment ({self.rule})"

    def work_out_from_run(self, context: Any) -> None:
        sensor = RUN_MOMENT_RULES[self.rule]
        if self.rule == "delta_after_run":
            self._fix(shifted(run_base_time(context, sensor=sensor), self._span, argument="delta"))
        elif self.rule == "time_on_run_date":
            zone = context["dag"].timezone
            self._fix(time_on_run_date(run_base_time(context, sensor=sensor), self._time_of_day, zone))

    def _fix(self, moment: dt.datetime) -> None:
        self._target_ts = moment.timestamp()
        self._target_iso = moment.astimezone(dt.timezone.utc).isoformat()

    def next_poll_delay(self) -> float:
        return super().next_poll_delay() if self._target_ts is not None else float(self.poll_interval)

    async def wait(self) -> dict[str, Any]:
        if getattr(self, "_target_ts", None) is None and self.rule == "after_start" and hasattr(self, "_span"):
            started = self.started_at()
            start = dt.datetime.fromtimestamp(self.clock.time() if started is None else started, tz=dt.timezone.utc)
            self._fix(shifted(start, self._span, argument="time_to_wait"))
        if getattr(self, "_target_ts", None) is None:  # not worked out: no run's context given
            message = (
                f"{RUN_MOMENT_RULES[self.rule]}'s moment comes from the run's dates, which only Airflow starting "
                "the task in the triggerer (start_from_trigger) gives this trigger"
            )
            return error_payload(ErrorType.BAD_CONFIGURATION, message)
        return await super().wait()
