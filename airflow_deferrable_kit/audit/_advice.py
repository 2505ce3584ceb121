"""What to change in each sensor, and the worker time that change would stop holding.

Two things live here: the sensor of this kit that replaces an operator (by the class name the
metadata DB records), and, from the audit's own measure of each try (:class:`Usage`), one
recommendation per sensor with its saving:

* a sensor that waits on a worker (poke or reschedule mode): ``deferrable=True``. The try would
  still hold a worker for one check before it defers and for one resume afterwards, each counted
  as the try's one-check allowance (see ``docs/audit.md``); the rest is saved.
* a deferred sensor that resumes on a worker: ``end_from_trigger=True``. Its resumed runs only
  hand the payload back (this kit's sensors do nothing else there); their worker time is saved.
* a deferred sensor that already ends in the triggerer, on a wait that has an event form (an
  object, a response, a row, a message; not a wall-clock moment): an ``AssetWatcher`` on an event
  trigger would start the DAG with no sensor task at all. This kit does not ship event triggers
  yet, so this one is marked as not available and worded as a future option.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from airflow_deferrable_kit.audit._measure import Usage

MODES = ("poke", "reschedule", "deferred", "worker")


# --------------------------------------------------------------------- kit equivalents
@dataclass(frozen=True)
class Equivalent:
    """The sensor of this kit that can replace a given operator, and what to watch for.

    ``end_note`` is what to watch for with ``end_from_trigger=True``.
    """

    sensor: str
    note: str = ""
    end_note: str = ""

    @property
    def name(self) -> str:
        return self.sensor.rsplit(".", 1)[-1]


_KIT = "airflow_deferrable_kit.sensors."
_DATETIME = Equivalent(_KIT + "temporal.DateTimeSensor")
_S3 = Equivalent(_KIT + "s3.S3KeySensor")
_HTTP = Equivalent(
    _KIT + "http.HttpBatchReadySensor",
    "a response_check keeps deferring (judged in the worker on resume)",
    end_note="not with a response_check: say it as success=/failure= acceptors",
)
_POSTGRES = Equivalent(_KIT + "postgres.PostgresBatchMarkerSensor", "PostgreSQL databases only")
_KAFKA = Equivalent(_KIT + "kafka.KafkaMessageSensor", end_note="not with commit_on_match=True")

#: Operator class names (``task_instance.operator``) with an equivalent in this kit. The
#: metadata DB records class names, not modules: the official sensor and ours of the same name
#: look alike, and the advice (``deferrable=True``) is the same for both.
EQUIVALENTS: dict[str, Equivalent] = {
    "DateTimeSensor": _DATETIME,
    "DateTimeSensorAsync": _DATETIME,
    "TimeSensor": Equivalent(_DATETIME.sensor, "give target_time as a templated datetime"),
    "TimeSensorAsync": Equivalent(_DATETIME.sensor, "give target_time as a templated datetime"),
    "S3KeySensor": _S3,
    "S3KeySensorAsync": _S3,
    "HttpSensor": _HTTP,
    "HttpSensorAsync": _HTTP,
    "HttpBatchReadySensor": _HTTP,
    "SqlSensor": _POSTGRES,
    "PostgresBatchMarkerSensor": _POSTGRES,
    "AwaitMessageSensor": _KAFKA,
    "AwaitMessageTriggerFunctionSensor": _KAFKA,
    "KafkaMessageSensor": _KAFKA,
}
_SQL_SENSOR = re.compile(r"(sql|postgres)\w*sensor(async)?$", re.IGNORECASE)
#: Waits on something that happens (an object, a response, a row, a message), which an event
#: trigger could watch for; a wall-clock moment is a schedule, not an event.
_EVENT_WAITS = {_S3.sensor, _HTTP.sensor, _POSTGRES.sensor, _KAFKA.sensor}


def kit_equivalent(*names: str | None) -> Equivalent | None:
    """The kit sensor for an operator class name (or custom operator name), if there is one."""
    for name in names:
        if not name:
            continue
        if name in EQUIVALENTS:
            return EQUIVALENTS[name]
        if _SQL_SENSOR.search(name):
            return _POSTGRES
    return None


def migration_advice(equivalent: Equivalent | None) -> str:
    """What a sensor that waits on a worker should become."""
    if equivalent is None:
        return "no kit equivalent: write one on PollingTrigger (docs/writing-your-own-wait.md)"
    advice = f"{equivalent.sensor}(deferrable=True)"
    return f"{advice}; {equivalent.note}" if equivalent.note else advice


# ---------------------------------------------------------------------------- savings
@dataclass
class Savings:
    """Worker seconds a sensor's tries would no longer hold, per change, summed over tries."""

    #: poke and reschedule tries, with ``deferrable=True``
    deferring: float = 0.0
    #: deferred tries that resumed on a worker, with ``end_from_trigger=True``
    ending_in_trigger: float = 0.0
    #: deferred tries that already ended in the triggerer, with an AssetWatcher instead
    watching: float = 0.0

    def add(self, usage: Usage, check_seconds: float) -> None:
        """Count one sensor try (see the module docstring for what each change keeps)."""
        allowance = min(usage.shortest, check_seconds)
        if usage.mode in ("poke", "reschedule"):
            self.deferring += max(0.0, usage.worker - 2 * allowance)
        elif usage.mode == "deferred":
            if usage.resumed > 0:
                self.ending_in_trigger += usage.resumed
            else:
                self.watching += usage.worker

    def merge(self, other: Savings) -> None:
        self.deferring += other.deferring
        self.ending_in_trigger += other.ending_in_trigger
        self.watching += other.watching


#: The changes a recommendation can name, in the order they are considered for a sensor.
CHANGES = ("deferrable", "end_from_trigger", "asset_watcher")


@dataclass(frozen=True)
class Recommendation:
    """One sensor task, the change it should make, and the worker seconds that change saves.

    ``available`` is False for a change this kit cannot make yet (an AssetWatcher).
    """

    key: Mapping[str, str]
    modes: tuple[str, ...]
    change: str
    advice: str
    saves: float
    available: bool = True

    def as_dict(self, price: float) -> dict[str, Any]:
        return {
            **self.key,
            "modes": list(self.modes),
            "change": self.change,
            "advice": self.advice,
            "saves_seconds": self.saves,
            "saves_cost": self.saves / 3600 * price,
            "available": self.available,
        }


def recommend(
    key: Mapping[str, str], modes: Mapping[str, int], equivalent: Equivalent | None, savings: Savings
) -> Recommendation | None:
    """The first change that would save worker time for this sensor task, if any."""
    held_modes = tuple(mode for mode in MODES if modes.get(mode))
    if (modes.get("poke") or modes.get("reschedule")) and savings.deferring > 0:
        return Recommendation(key, held_modes, "deferrable", migration_advice(equivalent), savings.deferring)
    if savings.ending_in_trigger > 0:
        if equivalent is None:
            advice = "end_from_trigger=True, if the sensor takes it and resumes only to return its payload"
        else:
            advice = f"end_from_trigger=True ({equivalent.name} of this kit resumes only to return its payload"
            advice += f"; {equivalent.end_note})" if equivalent.end_note else ")"
        return Recommendation(key, held_modes, "end_from_trigger", advice, savings.ending_in_trigger)
    if savings.watching > 0 and equivalent is not None and equivalent.sensor in _EVENT_WAITS:
        advice = (
            "later: an AssetWatcher on an event trigger for this wait would start the DAG with no sensor task "
            "(planned, not in this kit yet)"
        )
        return Recommendation(key, held_modes, "asset_watcher", advice, savings.watching, available=False)
    return None
