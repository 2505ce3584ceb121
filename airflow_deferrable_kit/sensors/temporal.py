"""Wait for a wall-clock moment without holding a worker slot.

``DateTimeSensor`` waits for a moment given outright. ``TimeDeltaSensor``, ``TimeSensor`` and
``WaitSensor`` work their moment out from the run when the task starts (the run's dates, the
DAG's timezone, the task's start) and then wait on the very same ``DateTimeTrigger``; started
in the triggerer (``start_from_trigger``), ``RunMomentTrigger`` works it out there from the same run.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Mapping
from typing import Any, ClassVar

from airflow.sdk import Context, PokeReturnValue

from airflow_deferrable_kit._moments import (
    run_base_time,
    shifted,
    time_on_run_date,
    to_time_of_day,
    to_timedelta,
    to_utc_iso,
)
from airflow_deferrable_kit.sensors.base import DeferrableSensor, OfficialRefusal, is_unresolved
from airflow_deferrable_kit.triggers.base import PollingTrigger
from airflow_deferrable_kit.triggers.temporal import DateTimeTrigger, RunMomentTrigger


def _ignored_as_officially(value: Any, arguments: Mapping[str, Any]) -> str | None:
    """The official time sensors take ``trigger_kwargs`` and build the trigger from ``target_time``
    whatever it holds; a ported call keeps working, and the argument is dropped here as there."""
    return None


class DateTimeSensor(DeferrableSensor):
    """Succeed once ``target_time`` is reached; deferrable, with one total ``timeout``.

    :param target_time: a datetime or ISO 8601 string (templated). Without an offset it is read
        in Airflow's default timezone. The success payload carries it as UTC ISO 8601.
    """

    trigger_class = DateTimeTrigger
    official_sensor = "DateTimeSensorAsync"
    official_refusals: ClassVar[Mapping[str, OfficialRefusal]] = {
        # Officially it only feeds start_from_trigger, which builds the trigger from target_time.
        "trigger_kwargs": _ignored_as_officially,
    }
    template_fields = ("target_time",)
    target_time: str | dt.datetime

    def __init__(self, *, target_time: str | dt.datetime, **kwargs: Any) -> None:
        super().__init__(target_time=target_time, **kwargs)


class RunMomentSensor(DeferrableSensor):
    """Base of the waits whose moment is worked out when the task starts, then waited for.

    The moment is fixed once per try, in ``execute()`` (rendered by then), and carried to the
    triggerer as ``DateTimeTrigger``'s ``target_time``; the payload is ``DateTimeSensor``'s.
    With ``start_from_trigger`` no worker runs ``execute()``: :class:`RunMomentTrigger` works the
    same moment out in the triggerer, from the run's context and the try's start.
    ``timeout`` and ``soft_fail`` follow :class:`DeferrableSensor`: one budget from the first
    ``execute()``, and a skip on timeout only.
    """

    trigger_class = DateTimeTrigger
    #: The sensor's own argument the moment comes from, named in errors.
    moment_argument: ClassVar[str]
    #: How :class:`RunMomentTrigger` works the moment out when the wait starts in the triggerer.
    run_moment_rule: ClassVar[str]
    _target_time: str | None = None

    @classmethod
    def wait_parameter_names(cls) -> tuple[str, ...]:
        """None: the trigger's ``target_time`` is worked out from the sensor's own arguments."""
        return ()

    def target_moment(self, context: Context) -> dt.datetime:
        """The aware moment this try waits for."""
        raise NotImplementedError

    def fix_target(self, context: Context) -> str:
        """Work out this try's moment (once) as UTC ISO 8601, as the trigger carries it."""
        if self._target_time is None:
            self._target_time = to_utc_iso(self.target_moment(context), argument=self.moment_argument)
            self.log.info("Waiting until %s", self._target_time)
        return self._target_time

    def execute(self, context: Context) -> Any:
        self.fix_target(context)
        return super().execute(context)

    def poke(self, context: Context) -> bool | PokeReturnValue:
        self.fix_target(context)
        return super().poke(context)

    def start_trigger(self) -> tuple[type[PollingTrigger], dict[str, Any]]:
        """Started in the triggerer, the moment is worked out there, from the same run (see RunMomentTrigger)."""
        value = getattr(self, self.moment_argument)
        if is_unresolved(value):
            return RunMomentTrigger, {"rule": self.run_moment_rule, self.moment_argument: value}
        return RunMomentTrigger, {"rule": self.run_moment_rule, **self.known_moment_params(value)}

    def known_moment_params(self, value: Any) -> dict[str, Any]:
        """The :class:`RunMomentTrigger` kwargs for a moment argument known at DAG parse: its span."""
        span = to_timedelta(value, argument=self.moment_argument, allow_negative=True)
        return {"span_seconds": span.total_seconds()}

    def trigger_params(self) -> dict[str, Any]:
        # When the DAG is parsed there is no run yet: the sensor's own argument was checked by
        # its __init__, and the common ones are checked here on a trigger waiting for now.
        target = self._target_time or dt.datetime.now(dt.timezone.utc).isoformat()
        return {"target_time": target}


class TimeDeltaSensor(RunMomentSensor):
    """Succeed ``delta`` after the run's ``data_interval_end`` (else its ``run_after``).

    :param delta: a ``timedelta``, or a whole number of minutes (templated; a rendered ``"30"``
        is 30 minutes). May be negative: the moment is then before the run's date.
    """

    official_sensor = "TimeDeltaSensor"
    moment_argument = "delta"
    run_moment_rule = "delta_after_run"
    template_fields = ("delta",)
    delta: dt.timedelta | int | str

    def __init__(self, *, delta: dt.timedelta | int | str, **kwargs: Any) -> None:
        if not is_unresolved(delta):
            to_timedelta(delta, argument="delta", allow_negative=True)
        self.delta = delta  # before the base's __init__, which may build start_trigger_args from it
        super().__init__(**kwargs)

    def target_moment(self, context: Context) -> dt.datetime:
        span = to_timedelta(self.delta, argument="delta", allow_negative=True)
        return shifted(run_base_time(context, sensor=type(self).__name__), span, argument="delta")


class TimeSensor(RunMomentSensor):
    """Succeed at ``target_time`` of day, in the DAG's timezone, on the date of the run.

    :param target_time: a naive ``datetime.time`` or an ISO 8601 time (``"18:30"``, templated).
        The date is that of the run's ``data_interval_end`` (else ``run_after``) in the DAG's
        timezone, so a late or backfilled run waits for its own date's time, which has passed.
        As officially, a time a DST change skips takes the offset after the change (02:30 on
        Amsterdam's spring-forward night is 02:30+02:00, 00:30 UTC); one it repeats is its first
        occurrence.
    """

    official_sensor = "TimeSensor"
    moment_argument = "target_time"
    run_moment_rule = "time_on_run_date"
    official_refusals: ClassVar[Mapping[str, OfficialRefusal]] = {
        # Officially it only feeds start_from_trigger, which builds the trigger from target_time.
        "trigger_kwargs": _ignored_as_officially,
    }
    template_fields = ("target_time",)
    target_time: dt.time | str

    def __init__(self, *, target_time: dt.time | str, **kwargs: Any) -> None:
        if not is_unresolved(target_time):
            to_time_of_day(target_time)
        self.target_time = target_time  # before the base's __init__, which may build start_trigger_args from it
        super().__init__(**kwargs)

    def dag_timezone(self) -> dt.tzinfo:
        """The DAG's timezone; without a DAG, Airflow's ``[core] default_timezone`` (a DAG's default)."""
        from airflow.sdk import timezone

        if self.has_dag():
            return self.dag.timezone
        zone = timezone.coerce_datetime(dt.datetime(2000, 1, 1)).tzinfo
        assert zone is not None
        return zone

    def target_moment(self, context: Context) -> dt.datetime:
        base = run_base_time(context, sensor=type(self).__name__)
        return time_on_run_date(base, to_time_of_day(self.target_time), self.dag_timezone())

    def known_moment_params(self, value: Any) -> dict[str, Any]:
        return {"target_time": to_time_of_day(value).isoformat()}


class WaitSensor(RunMomentSensor):
    """Succeed ``time_to_wait`` after the task starts (its first try's start in reschedule mode).

    :param time_to_wait: a ``timedelta``, or a whole number of minutes (templated). A wait
        longer than ``timeout`` could only time out, so it is refused when the DAG is parsed.
    """

    official_sensor = "WaitSensor"
    moment_argument = "time_to_wait"
    run_moment_rule = "after_start"
    template_fields = ("time_to_wait",)
    time_to_wait: dt.timedelta | int | str

    def __init__(self, *, time_to_wait: dt.timedelta | int | str, **kwargs: Any) -> None:
        span = None if is_unresolved(time_to_wait) else to_timedelta(time_to_wait, argument="time_to_wait")
        self.time_to_wait = time_to_wait  # before the base's __init__, which may build start_trigger_args from it
        super().__init__(**kwargs)
        if span is not None and span.total_seconds() > float(self.timeout):
            raise ValueError(
                f"WaitSensor (task_id={self.task_id!r}): time_to_wait ({span}) is longer than timeout "
                f"({float(self.timeout):g} s), so the wait could only time out; raise timeout"
            )

    def target_moment(self, context: Context) -> dt.datetime:
        span = to_timedelta(self.time_to_wait, argument="time_to_wait")
        started = context["ti"].get_first_reschedule_date(context) if self.reschedule else None
        return shifted(started or dt.datetime.now(dt.timezone.utc), span, argument="time_to_wait")
