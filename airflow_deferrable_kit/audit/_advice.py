"""What to change in each sensor, and the worker time that change would stop holding.

Two things live here: the sensor of this kit that replaces an operator (by the class name the
metadata DB records), and, from the audit's own measure of each try (:class:`Usage`), one
recommendation per sensor with its saving. The changes, the one that saves the most first:

* a sensor that is the first task of a DAG that only waits on it to start work, on a wait that
  has an event form (an object, a response, a row, a message; not a wall-clock moment): an
  ``AssetWatcher`` on the wait's event trigger starts the DAG with no sensor task at all, so
  all of its worker time is saved. Where the audit could not read the DAG's shape, the advice
  that follows says so as a condition.
* a sensor that waits on a worker (poke or reschedule mode): ``deferrable=True``. The try would
  still hold a worker for one check before it defers and for one resume afterwards, each counted
  as the try's one-check allowance (see ``docs/audit.md``); the rest is saved.
* a deferred sensor that started on a worker: ``start_from_trigger=True`` (Airflow 3.3+), with
  ``end_from_trigger=True`` where that is advised too: the scheduler defers the task itself and
  the triggerer renders its arguments, so the run before the first deferral is saved, and with
  ``end_from_trigger`` every run: no worker at all. Not for a mapped task: Airflow 3.3.2 starts
  those on a worker whatever the flag.
* a deferred sensor that resumes on a worker: ``end_from_trigger=True``. Its resumed runs only
  hand the payload back (this kit's sensors do nothing else there); their worker time is saved.
  Airflow refuses ``end_from_trigger`` while listener plugins are registered, so it is advised
  only where the deployment has none (:class:`Listeners`), and, where that is unknown, with the
  condition written into the advice.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from airflow_deferrable_kit.audit._measure import Usage

#: How a try used its worker. ``first_look`` is a try of a deferrable sensor (another try of the
#: task deferred) that held a worker once and ended there: the look it takes before deferring
#: found its condition, so no mode but an event trigger would have held less.
MODES = ("poke", "reschedule", "deferred", "first_look", "worker")
#: The module prefix of this kit's sensors, as a serialized DAG records it (``_task_module``).
KIT_MODULE = "airflow_deferrable_kit."


# --------------------------------------------------------------------- kit equivalents
@dataclass(frozen=True)
class Equivalent:
    """The sensor of this kit that can replace a given operator, and what to watch for.

    ``end_note`` is what to watch for with ``end_from_trigger=True``; ``event_trigger`` the
    dotted path of the wait's event trigger, for the waits that have one.
    """

    sensor: str
    note: str = ""
    end_note: str = ""
    event_trigger: str = ""
    start_note: str = ""
    #: Whether it can start in the triggerer (``start_from_trigger``); an operator whose first
    #: step is a request it must send once, on a worker, cannot.
    starts_in_triggerer: bool = True
    #: The task is already this kit's sensor: the advice is a flag, not a migration.
    own: bool = False

    @property
    def name(self) -> str:
        return self.sensor.rsplit(".", 1)[-1]

    @property
    def event_trigger_name(self) -> str:
        return self.event_trigger.rsplit(".", 1)[-1]


_KIT = "airflow_deferrable_kit.sensors."
_EVENTS = "airflow_deferrable_kit.triggers."
_DATETIME = Equivalent(_KIT + "temporal.DateTimeSensor")
_TIME = Equivalent(_KIT + "temporal.TimeSensor")
_TIMEDELTA = Equivalent(_KIT + "temporal.TimeDeltaSensor")
_WAIT = Equivalent(_KIT + "temporal.WaitSensor")
_S3 = Equivalent(_KIT + "s3.S3KeySensor", event_trigger=_EVENTS + "s3_events.S3KeyEventTrigger")
_S3_UNCHANGED = Equivalent(_KIT + "s3.S3KeysUnchangedSensor")
_HTTP = Equivalent(
    _KIT + "http.HttpBatchReadySensor",
    "a response_check keeps deferring (judged in the worker on resume)",
    end_note="not with a response_check: say it as success=/failure= acceptors",
    event_trigger=_EVENTS + "http_events.HttpBatchReadyEventTrigger",
    start_note="not with a callable response_check: say it as success=/failure= acceptors or an importable path",
)
_HTTP_JOB = Equivalent(
    "airflow_deferrable_kit.operators.http.HttpJobOperator",
    "submits once, saves the job's handle, and re-attaches on retry",
    end_note="a timeout still resumes on a worker, which raises it",
    starts_in_triggerer=False,
)
_POSTGRES = Equivalent(
    _KIT + "postgres.PostgresBatchMarkerSensor",
    "PostgreSQL databases only",
    event_trigger=_EVENTS + "postgres_events.PostgresRowEventTrigger",
)
_KAFKA = Equivalent(
    _KIT + "kafka.KafkaMessageSensor",
    end_note="not with commit_on_match=True",
    event_trigger=_EVENTS + "kafka_events.KafkaMessageEventTrigger",
)

#: Operator class names (``task_instance.operator``) with an equivalent in this kit. The
#: ``task_instance`` table records class names only; the serialized DAG records each task's
#: module, which tells this kit's sensor from the official one of the same name
#: (:func:`is_kit_module`). Each official time sensor has its namesake here
#: (``sensors/temporal.py``), which works its moment out the same way.
EQUIVALENTS: dict[str, Equivalent] = {
    "DateTimeSensor": _DATETIME,
    "DateTimeSensorAsync": _DATETIME,
    "TimeSensor": _TIME,
    "TimeSensorAsync": _TIME,
    "TimeDeltaSensor": _TIMEDELTA,
    "TimeDeltaSensorAsync": _TIMEDELTA,
    "WaitSensor": _WAIT,
    "S3KeySensor": _S3,
    "S3KeySensorAsync": _S3,
    "S3KeysUnchangedSensor": _S3_UNCHANGED,
    "HttpSensor": _HTTP,
    "HttpSensorAsync": _HTTP,
    "HttpBatchReadySensor": _HTTP,
    "HttpJobOperator": _HTTP_JOB,
    "SqlSensor": _POSTGRES,
    "PostgresBatchMarkerSensor": _POSTGRES,
    "AwaitMessageSensor": _KAFKA,
    "AwaitMessageTriggerFunctionSensor": _KAFKA,
    "KafkaMessageSensor": _KAFKA,
}
_SQL_SENSOR = re.compile(r"(sql|postgres)\w*sensor(async)?$", re.IGNORECASE)


def is_kit_module(module: str | None) -> bool:
    """Whether a task's module (``_task_module`` of its serialized DAG) is this kit's."""
    return bool(module) and str(module).startswith(KIT_MODULE)


def origin(module: str | None) -> str:
    """Who ships a module, as a label says it: ``kit``, an official provider's name, or the package."""
    if not module:
        return ""
    if is_kit_module(module):
        return "kit"
    parts = module.split(".")
    if parts[:2] == ["airflow", "providers"] and len(parts) > 2:
        return parts[2]
    return parts[0]


def kit_equivalent(*names: str | None, module: str | None = None) -> Equivalent | None:
    """The kit sensor for an operator class name (or custom operator name), if there is one.

    For one of this kit's own sensors (``module``) that is the sensor itself.
    """
    if is_kit_module(module):
        own = next((n for n in names if n), None) or ""
        same = EQUIVALENTS.get(own)  # its notes and event trigger, under its own path
        sensor = f"{module}.{own}"
        return dataclasses.replace(same, sensor=sensor, own=True) if same else Equivalent(sensor, own=True)
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
    if equivalent.own:
        return (
            f"deferrable=True, if not set (it is this kit's {equivalent.name}, which looks once on the worker before "
            "deferring: a wait already over when it starts ends there, like a poke)"
        )
    advice = f"{equivalent.sensor}(deferrable=True)"
    return f"{advice}; {equivalent.note}" if equivalent.note else advice


# -------------------------------------------------------------------------- listeners
#: What Airflow's DagBag says when it refuses ``end_from_trigger`` because listeners are
#: registered (``dag_processing/dagbag.py``, 3.3.2); the DAG file then lands in ``import_error``.
LISTENER_REFUSAL = "Listeners are not supported with end_from_trigger=True"
#: Who registers listener plugins, as the advice names them.
LISTENER_PLUGINS = "OpenLineage, or Airflow's example listener with load_examples=True"


@dataclass(frozen=True)
class Listeners:
    """Whether the audited deployment has listener plugins: ``True``, ``False`` or ``None`` (unknown).

    ``source`` says how the audit knows (the ``--listeners`` option, or what the metadata DB
    shows); it is shown next to the advice so a reader can judge it.
    """

    registered: bool | None = None
    source: str = "unknown (OpenLineage leaves no trace in the metadata DB; say it with --listeners or --no-listeners)"

    def as_dict(self) -> dict[str, Any]:
        return {"registered": self.registered, "source": self.source}


def end_from_trigger_advice(equivalent: Equivalent | None, listeners: Listeners) -> str | None:
    """``end_from_trigger=True`` for a sensor that resumes on a worker; ``None`` with listeners."""
    if listeners.registered:
        return None
    if equivalent is None:
        advice = "end_from_trigger=True, if the sensor takes it and resumes only to return its payload"
    else:
        advice = f"end_from_trigger=True ({equivalent.name} of this kit resumes only to return its payload"
        advice += f"; {equivalent.end_note})" if equivalent.end_note else ")"
    if listeners.registered is None:
        # Why is said once, under the advice (Report.listeners_note), not in every row.
        advice += ", if no listener plugin is registered"
    return advice


# ---------------------------------------------------------------------------- savings
@dataclass
class Savings:
    """Worker seconds a sensor's tries would no longer hold, per change, summed over tries."""

    #: poke and reschedule tries, with ``deferrable=True``
    deferring: float = 0.0
    #: deferred tries that resumed on a worker, with ``end_from_trigger=True``
    ending_in_trigger: float = 0.0
    #: deferred tries that started on a worker (not mapped), with ``start_from_trigger=True``
    starting_in_trigger: float = 0.0
    #: every try, with an AssetWatcher instead of the sensor task
    watching: float = 0.0

    def add(self, usage: Usage, check_seconds: float, *, mapped: bool = False) -> None:
        """Count one sensor try (see the module docstring for what each change keeps)."""
        allowance = min(usage.shortest, check_seconds)
        self.watching += usage.worker
        if usage.mode == "first_look":  # one look, in any mode: only a watcher holds less
            return
        if usage.mode in ("poke", "reschedule"):
            self.deferring += max(0.0, usage.worker - 2 * allowance)
        elif usage.mode == "deferred":
            self.ending_in_trigger += usage.resumed
            if not mapped:  # the run before its first deferral (none if it started in the triggerer)
                self.starting_in_trigger += max(0.0, usage.worker - usage.resumed)

    def merge(self, other: Savings) -> None:
        self.deferring += other.deferring
        self.ending_in_trigger += other.ending_in_trigger
        self.starting_in_trigger += other.starting_in_trigger
        self.watching += other.watching


#: The changes a recommendation can name.
CHANGES = ("asset_watcher", "deferrable", "start_from_trigger", "end_from_trigger")
#: The condition of every ``start_from_trigger`` advice: the audit cannot tell Airflow's version.
START_CONDITION = "Airflow 3.3 or later"


@dataclass(frozen=True)
class Recommendation:
    """One sensor task, the change it should make, and the worker seconds that change saves.

    ``condition`` is what the advice depends on that the audit could not tell from the metadata
    DB (listener plugins, the DAG's shape), ``None`` when it could.
    """

    key: Mapping[str, str]
    modes: tuple[str, ...]
    change: str
    advice: str
    saves: float
    condition: str | None = None

    def as_dict(self, price: float) -> dict[str, Any]:
        return {
            **self.key,
            "modes": list(self.modes),
            "change": self.change,
            "advice": self.advice,
            "saves_seconds": self.saves,
            "saves_cost": self.saves / 3600 * price,
            "condition": self.condition,
        }


#: The condition an event trigger's advice carries when the DAG's shape could not be read.
STARTS_DAG_CONDITION = "if it is the first task of a DAG that only waits on it to start work"


def start_from_trigger_advice(equivalent: Equivalent | None, ending: str | None) -> str:
    """``start_from_trigger=True`` for a deferred sensor that started on a worker, with ``ending``
    (the ``end_from_trigger`` advice) when that is advised too: then no worker runs the task."""
    if equivalent is None:
        advice = "start_from_trigger=True, if the sensor takes it (docs/start-from-trigger.md)"
    else:
        note = f"; {equivalent.start_note}" if equivalent.start_note else ""
        advice = (
            f"start_from_trigger=True ({equivalent.name} of this kit starts in the triggerer, which renders its "
            f"templates{note}; docs/start-from-trigger.md)"
        )
    advice += ": the scheduler defers the task itself"
    return advice if ending is None else f"no worker at all: {advice}; and {ending}"


def watcher_advice(equivalent: Equivalent, starts_dag: bool | None) -> str:
    """Start the DAG on an asset watched by the wait's event trigger, and drop the sensor."""
    advice = (
        f"schedule the DAG on an Asset with an AssetWatcher on {equivalent.event_trigger}(...) (this wait's "
        f"arguments) and drop the sensor task (docs/events.md)"
    )
    if starts_dag is None:
        return f"{STARTS_DAG_CONDITION}: {advice}"
    return f"{advice}: it is the first task of its DAG, which only waits on it to start work"


def recommend(
    key: Mapping[str, str],
    modes: Mapping[str, int],
    equivalent: Equivalent | None,
    savings: Savings,
    *,
    starts_dag: bool | None = None,
    listeners: Listeners | None = None,
) -> Recommendation | None:
    """The change that would save this sensor task the most worker time, if any.

    ``starts_dag`` is whether the sensor is the first task of a DAG that only waits on it to
    start work (``None``: the DAG's shape could not be read).
    """
    listeners = listeners or Listeners()
    held_modes = tuple(mode for mode in MODES if modes.get(mode))
    watchable = equivalent is not None and bool(equivalent.event_trigger) and starts_dag is not False
    if watchable and starts_dag and savings.watching > 0:
        assert equivalent is not None
        advice = watcher_advice(equivalent, starts_dag)
        return Recommendation(key, held_modes, "asset_watcher", advice, savings.watching)
    # An event trigger on a DAG whose shape is unknown is told as a condition after the change
    # that needs no condition.
    also = f"; {watcher_advice(equivalent, None)}" if watchable and equivalent is not None else ""
    if (modes.get("poke") or modes.get("reschedule")) and savings.deferring > 0:
        return Recommendation(key, held_modes, "deferrable", migration_advice(equivalent) + also, savings.deferring)
    ending = end_from_trigger_advice(equivalent, listeners)
    if savings.starting_in_trigger > 0 and (equivalent is None or equivalent.starts_in_triggerer):
        ends_too = ending is not None and savings.ending_in_trigger > 0
        saves = savings.starting_in_trigger + (savings.ending_in_trigger if ends_too else 0.0)
        starting = start_from_trigger_advice(equivalent, ending if ends_too else None)
        when = START_CONDITION + ("; no listener plugins" if ends_too and listeners.registered is None else "")
        return Recommendation(key, held_modes, "start_from_trigger", starting + also, saves, when)
    if savings.ending_in_trigger > 0 and ending is not None:
        condition = "no listener plugins" if listeners.registered is None else None
        return Recommendation(key, held_modes, "end_from_trigger", ending + also, savings.ending_in_trigger, condition)
    # Deferred throughout and ending in the triggerer: only an event trigger holds less. (A poke
    # sensor that found its condition at once has nothing to save worth a conditional change.)
    deferred_only = not (modes.get("poke") or modes.get("reschedule"))
    if watchable and deferred_only and savings.watching > 0 and equivalent is not None:
        advice = watcher_advice(equivalent, None)
        return Recommendation(key, held_modes, "asset_watcher", advice, savings.watching, STARTS_DAG_CONDITION)
    return None
