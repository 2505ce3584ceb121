"""Wait for a wall-clock moment without holding a worker slot.

``DateTimeSensor`` waits for a moment given outright. ``TimeDeltaSensor``, ``TimeSensor`` and
``WaitSensor`` work their moment out from the run when the task starts (the run's dates, the
DAG's timezone, the task's start) and then wait on the very same ``DateTimeTrigger``.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Mapping
from typing import Any, ClassVar

from airflow.sdk import Context, PokeReturnValue

from airflow_deferrable_kit._arguments import MAX_SECONDS
from airflow_deferrable_kit.sensors.base import DeferrableSensor, OfficialRefusal, is_unresolved, unless_default
from airflow_deferrable_kit.triggers.base import in_utc
from airflow_deferrable_kit.triggers.temporal import DateTimeTrigger


def to_utc_iso(value: str | dt.datetime, *, argument: str = "target_time") -> str:
    """Normalise a moment to an ISO 8601 UTC string.

    Aware values keep their instant. Naive datetimes and strings without an offset are read in
    Airflow's default timezone (``[core] default_timezone``), like every other Airflow date.
    Strings are parsed as the official ``DateTimeSensor`` parses them (``timezone.parse``, not
    strict), so ``"Jan 1 2024 11pm"`` means what it means there. A moment UTC cannot hold
    (``9999-12-31T23:00:00-05:00``) is a ValueError naming the argument.
    """
    from airflow.sdk import timezone

    if isinstance(value, dt.datetime):
        moment = value if value.tzinfo is not None else timezone.coerce_datetime(value)
    elif isinstance(value, str):
        try:
            moment = timezone.parse(value.strip())
        except Exception as exc:
            raise ValueError(f"{argument} could not be parsed as a date and time: {value!r}") from exc
        if not isinstance(moment, dt.datetime):
            raise ValueError(f"{argument} must be a date and time, got {value!r}")
    else:
        raise TypeError(f"{argument} must be a datetime or an ISO 8601 string, got {type(value).__name__}")
    return in_utc(moment, argument=argument, given=value).isoformat()


class DateTimeSensor(DeferrableSensor):
    """Succeed once ``target_time`` is reached; deferrable, with one total ``timeout``.

    :param target_time: a datetime or ISO 8601 string (templated). Without an offset it is read
        in Airflow's default timezone. The success payload carries it as UTC ISO 8601.
    """

    trigger_class = DateTimeTrigger
    official_sensor = "DateTimeSensorAsync"
    official_refusals: ClassVar[Mapping[str, OfficialRefusal]] = {
        "trigger_kwargs": unless_default(
            "the trigger's kwargs are built from target_time (start_from_trigger=True takes them from it too); "
            "target_time is the one argument",
            None,
        ),
    }
    template_fields = ("target_time",)
    target_time: str | dt.datetime

    def __init__(self, *, target_time: str | dt.datetime, **kwargs: Any) -> None:
        super().__init__(target_time=target_time, **kwargs)

    def trigger_params(self) -> dict[str, Any]:
        return {"target_time": to_utc_iso(self.target_time)}


# ------------------------------------------------------------- moments worked out from the run
def to_timedelta(value: Any, *, argument: str, allow_negative: bool = False) -> dt.timedelta:
    """A ``timedelta``, or a whole number of minutes, as the official time sensors read ``delta``.

    A rendered template is a string, so ``"30"`` is 30 minutes too. A bool, a fraction (the
    official sensors would truncate ``1.5`` to one minute) or a length over a century
    (:data:`MAX_SECONDS`) is a ValueError naming the argument.
    """
    try:
        if isinstance(value, dt.timedelta):
            span = value
        elif isinstance(value, int) and not isinstance(value, bool):
            span = dt.timedelta(minutes=value)
        elif isinstance(value, str) and value.strip().lstrip("+-").isdigit():
            span = dt.timedelta(minutes=int(value.strip()))
        else:
            raise ValueError
    except (ValueError, OverflowError):
        raise ValueError(f"{argument} must be a timedelta or a whole number of minutes, got {value!r}") from None
    seconds = span.total_seconds()
    if abs(seconds) > MAX_SECONDS or (seconds < 0 and not allow_negative):
        sign = "" if allow_negative else "from 0 "
        raise ValueError(f"{argument} must be {sign}at most {MAX_SECONDS:,} seconds (100 years), got {value!r}")
    return span


def to_time_of_day(value: Any, *, argument: str = "target_time") -> dt.time:
    """A naive ``datetime.time`` or an ISO 8601 time string (``"09:30"``), read in the DAG's timezone.

    An aware time is refused: the official ``TimeSensor`` silently drops its offset for the DAG's.
    """
    if isinstance(value, dt.datetime) or not isinstance(value, (dt.time, str)):
        raise TypeError(f"{argument} must be a datetime.time or an ISO 8601 time string, got {type(value).__name__}")
    if isinstance(value, str):
        try:
            value = dt.time.fromisoformat(value.strip())
        except ValueError:
            raise ValueError(f"{argument} could not be parsed as an ISO 8601 time of day: {value!r}") from None
    if value.tzinfo is not None:
        raise ValueError(
            f"{argument} is a time of day in the DAG's timezone and must carry no offset, got {value.isoformat()!r}; "
            "set the DAG's timezone, or use DateTimeSensor for a moment with an offset"
        )
    return value


def run_base_time(context: Context, *, sensor: str) -> dt.datetime:
    """The run's moment the official time sensors start from: ``data_interval_end``, else ``run_after``."""
    data_interval_end = context.get("data_interval_end")
    if data_interval_end:
        return data_interval_end
    dag_run = context.get("dag_run")
    run_after = getattr(dag_run, "run_after", None)
    if run_after is None:
        raise ValueError(f"{sensor} needs data_interval_end or dag_run.run_after in the task context")
    return run_after


def shifted(base: dt.datetime, span: dt.timedelta, *, argument: str) -> dt.datetime:
    """``base + span``; a sum past the years datetimes can hold is a ValueError naming the argument."""
    try:
        return base + span
    except OverflowError:
        raise ValueError(f"{argument}: {base.isoformat()} + {span} is past the last moment datetimes hold") from None


class RunMomentSensor(DeferrableSensor):
    """Base of the waits whose moment is worked out when the task starts, then waited for.

    The moment is fixed once per try, in ``execute()`` (rendered by then), and carried to the
    triggerer as ``DateTimeTrigger``'s ``target_time``; the payload is ``DateTimeSensor``'s.
    ``timeout`` and ``soft_fail`` follow :class:`DeferrableSensor`: one budget from the first
    ``execute()``, and a skip on timeout only.
    """

    trigger_class = DateTimeTrigger
    cannot_start_in_triggerer = (
        "its moment is worked out when a try starts (from the run's dates, the DAG's timezone or the clock), in "
        'a worker; use DateTimeSensor with the moment as a template (target_time="{{ data_interval_end }}"), '
        "which the triggerer renders"
    )
    #: The sensor's own argument the moment comes from, named in errors.
    moment_argument: ClassVar[str]
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
    template_fields = ("delta",)
    delta: dt.timedelta | int | str

    def __init__(self, *, delta: dt.timedelta | int | str, **kwargs: Any) -> None:
        if not is_unresolved(delta):
            to_timedelta(delta, argument="delta", allow_negative=True)
        super().__init__(**kwargs)
        self.delta = delta

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
    official_refusals: ClassVar[Mapping[str, OfficialRefusal]] = {
        "start_from_trigger": unless_default(
            "the moment depends on the run's date and the DAG's timezone, so it is worked out in the worker "
            'when the task starts; use DateTimeSensor(target_time="{{ ... }}", start_from_trigger=True) with '
            "the moment as a template, or pass check_before_defer=False to defer at once",
            False,
        ),
        "trigger_kwargs": unless_default(
            "it only feeds start_from_trigger, which is not supported; target_time is the one argument", None
        ),
    }
    template_fields = ("target_time",)
    target_time: dt.time | str

    def __init__(self, *, target_time: dt.time | str, **kwargs: Any) -> None:
        if not is_unresolved(target_time):
            to_time_of_day(target_time)
        super().__init__(**kwargs)
        self.target_time = target_time

    def dag_timezone(self) -> dt.tzinfo:
        """The DAG's timezone; without a DAG, Airflow's ``[core] default_timezone`` (a DAG's default)."""
        from airflow.sdk import timezone

        if self.has_dag():
            return self.dag.timezone
        zone = timezone.coerce_datetime(dt.datetime(2000, 1, 1)).tzinfo
        assert zone is not None
        return zone

    def target_moment(self, context: Context) -> dt.datetime:
        from airflow.sdk import timezone

        time_of_day = to_time_of_day(self.target_time)
        zone = self.dag_timezone()
        run_date = run_base_time(context, sensor=type(self).__name__).astimezone(zone).date()
        # As the official sensor combines them: the zone's offset for that wall time, fold=0.
        return timezone.convert_to_utc(timezone.coerce_datetime(dt.datetime.combine(run_date, time_of_day, zone)))


class WaitSensor(RunMomentSensor):
    """Succeed ``time_to_wait`` after the task starts (its first try's start in reschedule mode).

    :param time_to_wait: a ``timedelta``, or a whole number of minutes (templated). A wait
        longer than ``timeout`` could only time out, so it is refused when the DAG is parsed.
    """

    official_sensor = "WaitSensor"
    moment_argument = "time_to_wait"
    template_fields = ("time_to_wait",)
    time_to_wait: dt.timedelta | int | str

    def __init__(self, *, time_to_wait: dt.timedelta | int | str, **kwargs: Any) -> None:
        span = None if is_unresolved(time_to_wait) else to_timedelta(time_to_wait, argument="time_to_wait")
        super().__init__(**kwargs)
        self.time_to_wait = time_to_wait
        if span is not None and span.total_seconds() > float(self.timeout):
            raise ValueError(
                f"WaitSensor (task_id={self.task_id!r}): time_to_wait ({span}) is longer than timeout "
                f"({float(self.timeout):g} s), so the wait could only time out; raise timeout"
            )

    def target_moment(self, context: Context) -> dt.datetime:
        span = to_timedelta(self.time_to_wait, argument="time_to_wait")
        started = context["ti"].get_first_reschedule_date(context) if self.reschedule else None
        return shifted(started or dt.datetime.now(dt.timezone.utc), span, argument="time_to_wait")
