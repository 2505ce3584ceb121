"""Wait for a wall-clock moment without holding a worker slot."""

from __future__ import annotations

import datetime as dt
from collections.abc import Mapping
from typing import Any, ClassVar

from airflow_deferrable_kit.sensors.base import DeferrableSensor, OfficialRefusal, unless_default
from airflow_deferrable_kit.triggers.base import in_utc
from airflow_deferrable_kit.triggers.temporal import DateTimeTrigger


def to_utc_iso(value: str | dt.datetime, *, argument: str = "target_time") -> str:
    """Normalise a moment to an ISO 8601 UTC string.

    Aware values keep their instant. Naive datetimes and strings without an offset are read in
    Airflow's default timezone (``[core] default_timezone``), like every other Airflow date. A
    moment UTC cannot hold (``9999-12-31T23:00:00-05:00``) is a ValueError naming the argument.
    """
    from airflow.sdk import timezone

    if isinstance(value, dt.datetime):
        moment = value if value.tzinfo is not None else timezone.coerce_datetime(value)
    elif isinstance(value, str):
        try:
            moment = timezone.parse(value.strip(), strict=True)
        except Exception as exc:
            raise ValueError(f"{argument} could not be parsed as an ISO 8601 datetime: {value!r}") from exc
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
        "start_from_trigger": unless_default(
            "the wait starts in the worker, which renders and checks target_time, fixes the absolute deadline "
            "of timeout and looks once before deferring; pass check_before_defer=False to defer at once",
            False,
        ),
        "trigger_kwargs": unless_default(
            "it only feeds start_from_trigger, which is not supported; target_time is the one argument", None
        ),
    }
    template_fields = ("target_time",)
    target_time: str | dt.datetime

    def __init__(self, *, target_time: str | dt.datetime, **kwargs: Any) -> None:
        super().__init__(target_time=target_time, **kwargs)

    def trigger_params(self) -> dict[str, Any]:
        return {"target_time": to_utc_iso(self.target_time)}
