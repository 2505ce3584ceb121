"""Moments and spans as the time waits read them, and the moments worked out from a run.

One home for the parsing the sensors do at DAG parse (or when a try starts, in a worker) and the
triggers do when Airflow starts a wait in the triggerer (``start_from_trigger``), so a moment
means the same on either path. Each function raises ``ValueError`` / ``TypeError`` naming the
argument.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Mapping
from typing import Any

from airflow_deferrable_kit._arguments import MAX_SECONDS


def in_utc(moment: dt.datetime, *, argument: str, given: Any) -> dt.datetime:
    """``moment`` (aware) in UTC; a moment UTC cannot hold is a ValueError naming the argument.

    Datetimes end at 9999-12-31, so ``9999-12-31T23:00:00-05:00`` (early in year 10000, UTC)
    has no UTC form, nor has ``0001-01-01T01:00:00+05:00``; converting one overflows. An offset
    of a day or more (``+25:00``) is accepted by pendulum's parser but by no Python timezone:
    converting it raises a ``ValueError`` that names neither the argument nor the value.
    """
    try:
        return moment.astimezone(dt.timezone.utc)
    except OverflowError as exc:
        raise ValueError(
            f"{argument} must be a moment between 0001-01-01 and 9999-12-31 in UTC, got {given!r}"
        ) from exc
    except ValueError as exc:
        raise ValueError(
            f"{argument} must have a UTC offset strictly between -24:00 and +24:00, got {given!r}"
        ) from exc


def to_utc_iso(value: str | dt.datetime, *, argument: str = "target_time") -> str:
    """Normalise a moment to an ISO 8601 UTC string.

    Aware values keep their instant. Naive datetimes and strings without an offset are read in
    Airflow's default timezone (``[core] default_timezone``), like every other Airflow date.
    Strings are parsed as the official ``DateTimeSensor`` parses them (``timezone.parse``, not
    strict), so ``"Jan 1 2024 11pm"`` means what it means there. A moment UTC cannot hold
    (``9999-12-31T23:00:00-05:00``) is a ValueError naming the argument.
    """
    if isinstance(value, str):  # ISO 8601 with an offset (what triggers carry): no pendulum parse
        try:
            exact = dt.datetime.fromisoformat(value.strip())
        except ValueError:
            exact = None
        if exact is not None and exact.tzinfo is not None:
            return in_utc(exact, argument=argument, given=value).isoformat()

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


def run_base_time(context: Mapping[str, Any], *, sensor: str) -> dt.datetime:
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


def time_on_run_date(base: dt.datetime, time_of_day: dt.time, zone: dt.tzinfo) -> dt.datetime:
    """``time_of_day`` in ``zone`` on the date ``base`` falls on there, in UTC.

    As the official ``TimeSensor`` combines them: the zone's offset for that wall time, fold=0.
    """
    from airflow.sdk import timezone

    run_date = base.astimezone(zone).date()
    return timezone.convert_to_utc(timezone.coerce_datetime(dt.datetime.combine(run_date, time_of_day, zone)))


def to_epoch_ms(value: Any, *, argument: str = "start_after") -> int | None:
    """Epoch milliseconds from an int (already ms), a datetime or an ISO 8601 / digit string."""
    if value is None:
        return None
    if isinstance(value, bool):
        raise TypeError(f"{argument} must be a datetime, an ISO 8601 string or epoch milliseconds, got a bool")
    if isinstance(value, int):
        if value < 0:
            raise ValueError(f"{argument} must not be negative, got {value}")
        return value
    if isinstance(value, str) and value.strip().isdigit():
        return int(value.strip())
    if isinstance(value, (str, dt.datetime)):
        return int(dt.datetime.fromisoformat(to_utc_iso(value, argument=argument)).timestamp() * 1000)
    raise TypeError(
        f"{argument} must be a datetime, an ISO 8601 string or epoch milliseconds, got {type(value).__name__}"
    )
