"""How many worker-slot hours an Airflow 3 deployment spends waiting, read from its metadata DB.

``airflow-deferrable-kit audit`` (see :mod:`airflow_deferrable_kit.cli` and ``docs/audit.md``)
reads the metadata database read-only with SQLAlchemy Core, never through Airflow's models, so
it works across Airflow 3.x schema versions and does not need Airflow importable at all when a
URL is given. Nothing here is imported by triggers or sensors.

Where worker-held time comes from (Airflow 3.3.2, ``api_fastapi/execution_api/routes/
task_instances.py``): every state change a worker reports through the Execution API adds a row
to the ``log`` table, server-timestamped: ``running`` when a worker process starts the try
(first start, each reschedule poke, each resume after a deferral) and ``deferred``,
``up_for_reschedule``, ``success``, ``failed``, ... when it lets go. Each ``running`` →
next-state pair is one interval a worker slot was held. ``task_instance.start_date`` (the
worker's own clock when it asked to run) refines the start of the interval it opened.
``task_reschedule`` rows cannot be used for this: 3.3.2 stamps their ``start_date`` at the end of
the poke, so their duration is 0. When the ``log`` rows of a try are gone (``airflow db clean``),
the try is estimated from ``task_instance`` and ``task_reschedule`` alone and counted as such.
"""

from __future__ import annotations

import csv
import datetime as dt
import io
import json
import math
import os
import re
import sqlite3
from collections.abc import Callable, Container, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import URL, Engine, make_url
from sqlalchemy.types import TypeDecorator

UTC = dt.timezone.utc

#: The ``log`` event a worker writes when it starts (or resumes) a try.
WORKER_START = "running"
#: ``log`` events that end a worker's hold on a try: a hand-off (deferred, rescheduled, parked
#: for input), an end state, or the scheduler giving up on a silent worker.
WORKER_STOP = (
    "deferred",
    "up_for_reschedule",
    "awaiting_input",
    "success",
    "failed",
    "skipped",
    "up_for_retry",
    "upstream_failed",
    "removed",
    "restarting",
    "heartbeat timeout",
)
#: Current tries in these states are over; others (running, deferred, up_for_reschedule, ...)
#: are still in progress and left out. Archived tries (``task_instance_history``) are all over.
FINISHED = ("success", "failed", "skipped", "up_for_retry")
#: Tries in these states never ran on a worker.
NEVER_RAN = ("upstream_failed", "removed")

MODES = ("poke", "reschedule", "deferred", "worker")
GROUP_BY = ("task", "dag", "operator")
GROUP_KEYS: dict[str, tuple[str, ...]] = {
    "task": ("dag_id", "task_id", "operator"),
    "dag": ("dag_id",),
    "operator": ("operator",),
}
SQL_ALCHEMY_CONN_ENV = "AIRFLOW__DATABASE__SQL_ALCHEMY_CONN"


class AuditError(Exception):
    """The audit could not run (unreachable database, not an Airflow 3 metadata DB, ...)."""


class AuditUsageError(AuditError):
    """An argument is unusable; ``argument`` names it as the command line spells it."""

    def __init__(self, argument: str, message: str) -> None:
        super().__init__(f"argument {argument}: {message}")
        self.argument = argument
        self.message = message


# --------------------------------------------------------------------- kit equivalents
@dataclass(frozen=True)
class Equivalent:
    """The sensor of this kit that can replace a given operator, and what to watch for."""

    sensor: str
    note: str = ""

    @property
    def name(self) -> str:
        return self.sensor.rsplit(".", 1)[-1]


_KIT = "airflow_deferrable_kit.sensors."
_DATETIME = Equivalent(_KIT + "temporal.DateTimeSensor")
_S3 = Equivalent(_KIT + "s3.S3KeySensor")
_HTTP = Equivalent(_KIT + "http.HttpBatchReadySensor", "a response_check becomes success=/failure= acceptors")
_POSTGRES = Equivalent(_KIT + "postgres.PostgresBatchMarkerSensor", "PostgreSQL databases only")
_KAFKA = Equivalent(_KIT + "kafka.KafkaMessageSensor")

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


def is_sensor(*names: str | None) -> bool:
    """Whether an operator waits for something (so time held beyond one check is idle)."""
    return any(name and "sensor" in name.lower() for name in names)


# ------------------------------------------------------------------ measuring one try
@dataclass(frozen=True)
class Event:
    """A state change of one try, as the ``log`` table recorded it (server clock)."""

    name: str
    at: dt.datetime


@dataclass(frozen=True)
class Try:
    """One try of a task instance: a ``task_instance`` row (the current try) or a
    ``task_instance_history`` row (an earlier one)."""

    dag_id: str
    task_id: str
    run_id: str
    map_index: int
    try_number: int
    state: str | None
    operator: str | None
    custom_operator_name: str | None
    start: dt.datetime | None
    end: dt.datetime | None
    queued: dt.datetime | None = None
    reschedules: int = 0
    first_reschedule_end: dt.datetime | None = None

    @property
    def operator_name(self) -> str:
        """What the UI shows: the custom name (``@task.sensor``, ...) or the class name."""
        return self.custom_operator_name or self.operator or "?"

    @property
    def sensor(self) -> bool:
        return is_sensor(self.operator, self.custom_operator_name)


@dataclass(frozen=True)
class Usage:
    """How one try used worker slots. Seconds; ``estimated`` when the ``log`` rows were missing."""

    mode: str
    wall: float
    worker: float
    segments: int
    shortest: float
    estimated: bool = False

    def idle(self, *, sensor: bool, check_seconds: float) -> float:
        """Worker-held seconds beyond one check: what a sensor held while only waiting.

        One check is the try's shortest worker interval, at most ``check_seconds`` (a poke-mode
        sensor has a single interval spanning the whole wait). Non-sensors are working: 0.
        """
        if not sensor:
            return 0.0
        return max(0.0, self.worker - min(self.shortest, check_seconds))


def _seconds(start: dt.datetime, end: dt.datetime) -> float:
    return (end - start).total_seconds()


def worker_intervals(events: Sequence[Event], end: dt.datetime | None) -> list[tuple[dt.datetime, dt.datetime]]:
    """Pair each ``running`` event with the next event that ended the worker's hold.

    A second ``running`` without a stop in between closes the first (its worker was replaced);
    an interval still open at the end closes at the try's ``end_date``.
    """
    intervals: list[tuple[dt.datetime, dt.datetime]] = []
    opened: dt.datetime | None = None
    for event in events:
        if event.name == WORKER_START:
            if opened is not None:
                intervals.append((opened, event.at))
            opened = event.at
        elif opened is not None:
            intervals.append((opened, event.at))
            opened = None
    if opened is not None and end is not None and end > opened:
        intervals.append((opened, end))
    return intervals


#: How far a worker's clock may be behind the scheduler's before a try looks started by the
#: scheduler: more than this between ``start_date`` and ``queued_dttm`` is a real deferral.
CLOCK_SKEW_ALLOWANCE = dt.timedelta(seconds=1)


def _started_in_triggerer(attempt: Try, intervals: Sequence[tuple[dt.datetime, dt.datetime]]) -> bool:
    """The scheduler deferred the try itself (``start_from_trigger``): no worker ran before it.

    The scheduler sets ``start_date`` when it defers such a try and writes no ``log`` row; a
    worker only appears once the try is queued again to resume, after ``start_date``.
    """
    if attempt.start is None or attempt.queued is None or not intervals:
        return False
    return attempt.queued - attempt.start > CLOCK_SKEW_ALLOWANCE and attempt.queued <= intervals[0][0]


def _use_worker_start(
    intervals: list[tuple[dt.datetime, dt.datetime]], start: dt.datetime | None
) -> list[tuple[dt.datetime, dt.datetime]]:
    """Start the interval ``start_date`` belongs to at ``start_date`` (the worker's clock).

    The worker sends ``start_date`` when it asks to run; the ``running`` row is written when the
    server has handled that request, which can be seconds later on a busy API server while the
    worker already holds its slot. ``start_date`` is kept across a deferral and reset by each
    reschedule poke, so it belongs to the first interval of a deferred try and to the last of a
    rescheduled one: the one whose ``running`` event follows it with no interval ending between.
    """
    if start is None:
        return intervals
    previous_end: dt.datetime | None = None
    for index, (opened, closed) in enumerate(intervals):
        if (previous_end is None or start >= previous_end) and start <= opened:
            return [*intervals[:index], (start, closed), *intervals[index + 1 :]]
        previous_end = closed
    return intervals


def measure(attempt: Try, events: Sequence[Event]) -> Usage | None:
    """Wall and worker-held seconds of one try; ``None`` if it never ran on a worker.

    ``events`` are the try's ``log`` rows in order. Without them the try is estimated (see the
    module docstring and docs/audit.md for the approximations).
    """
    sensor = attempt.sensor
    names = {event.name for event in events}
    intervals = worker_intervals(events, attempt.end)
    from_triggerer = _started_in_triggerer(attempt, intervals)
    if not from_triggerer:  # there start_date is the scheduler's deferral, not a worker's start
        intervals = _use_worker_start(intervals, attempt.start)
    if intervals:
        if "deferred" in names or from_triggerer:
            mode = "deferred"
        elif "up_for_reschedule" in names:
            mode = "reschedule"
        else:
            mode = "poke" if sensor else "worker"
        lengths = [max(0.0, _seconds(opened, closed)) for opened, closed in intervals]
        worker = sum(lengths)
        last = attempt.end if attempt.end is not None and attempt.end > intervals[-1][1] else intervals[-1][1]
        first = attempt.start if from_triggerer and attempt.start is not None else intervals[0][0]
        wall = max(_seconds(first, last), worker)
        return Usage(mode, wall, worker, len(intervals), min(lengths))
    if not events and attempt.queued is None and not attempt.reschedules and attempt.start and attempt.end:
        # Never queued to an executor, yet started and ended: the triggerer ran the whole try
        # (start_from_trigger with end_from_trigger) and no worker was ever held.
        span = _seconds(attempt.start, attempt.end)
        return Usage("deferred", span, 0.0, 0, 0.0) if span > 0 else None
    return _estimate(attempt)


def _estimate(attempt: Try) -> Usage | None:
    """Worker-held time from ``task_instance`` alone, for tries whose ``log`` rows are gone."""
    if attempt.start is None or attempt.end is None:
        return None
    span = max(0.0, _seconds(attempt.start, attempt.end))
    if attempt.reschedules > 0:
        # start_date/duration describe the last poke only; assume every poke took as long.
        first_start = attempt.start
        if attempt.first_reschedule_end is not None:
            first_start = min(first_start, attempt.first_reschedule_end - dt.timedelta(seconds=span))
        pokes = attempt.reschedules + 1
        worker = span * pokes
        wall = max(_seconds(first_start, attempt.end), worker)
        return Usage("reschedule", wall, worker, pokes, span, estimated=True)
    if span <= 0:
        return None
    if attempt.queued is not None and attempt.queued > attempt.start:
        # Queued again after it started: resumed after a deferral. start_date kept the first
        # start, so the span includes the wait; assume the run before deferring took as long
        # as the resumed run (which includes its wait in the queue).
        resumed = max(0.0, _seconds(attempt.queued, attempt.end))
        worker = min(span, 2 * resumed)
        return Usage("deferred", span, worker, 2, worker / 2, estimated=True)
    return Usage("poke" if attempt.sensor else "worker", span, span, 1, span, estimated=True)


# -------------------------------------------------------------------------- aggregating
@dataclass
class Totals:
    """Sums over tries; seconds internally, hours in every output."""

    runs: int = 0
    worker_runs: int = 0
    wall: float = 0.0
    worker: float = 0.0
    idle: float = 0.0
    estimated: int = 0

    def add(self, usage: Usage, idle: float) -> None:
        self.runs += 1
        self.worker_runs += usage.segments
        self.wall += usage.wall
        self.worker += usage.worker
        self.idle += idle
        self.estimated += usage.estimated

    def merge(self, other: Totals) -> None:
        self.runs += other.runs
        self.worker_runs += other.worker_runs
        self.wall += other.wall
        self.worker += other.worker
        self.idle += other.idle
        self.estimated += other.estimated

    def as_dict(self, price: float) -> dict[str, Any]:
        return {
            "runs": self.runs,
            "worker_runs": self.worker_runs,
            "wall_hours": self.wall / 3600,
            "worker_held_hours": self.worker / 3600,
            "idle_held_hours": self.idle / 3600,
            "cost": self.worker / 3600 * price,
            "idle_cost": self.idle / 3600 * price,
            "estimated_runs": self.estimated,
        }


@dataclass
class Row:
    """One line of the report: a task, a DAG or an operator over the window."""

    key: dict[str, str]
    totals: Totals = field(default_factory=Totals)
    modes: dict[str, int] = field(default_factory=dict)
    sensor: bool = False
    operator_classes: set[str] = field(default_factory=set)
    migration_rank: int | None = None

    @property
    def equivalent(self) -> Equivalent | None:
        if "operator" not in self.key:
            return None
        return kit_equivalent(*sorted(self.operator_classes), self.key["operator"])

    @property
    def still_held_while_waiting(self) -> bool:
        """Some tries waited on a worker (poke or reschedule) rather than in the triggerer."""
        return bool(self.modes.get("poke") or self.modes.get("reschedule"))

    def absorb(self, other: Row) -> None:
        self.totals.merge(other.totals)
        for mode, count in other.modes.items():
            self.modes[mode] = self.modes.get(mode, 0) + count
        self.sensor = self.sensor or other.sensor
        self.operator_classes |= other.operator_classes

    def advice(self) -> str:
        equivalent = self.equivalent
        if equivalent is None:
            return "no kit equivalent: write one on PollingTrigger (docs/writing-your-own-wait.md)"
        advice = f"{equivalent.sensor}(deferrable=True)"
        return f"{advice}; {equivalent.note}" if equivalent.note else advice

    def as_dict(self, price: float) -> dict[str, Any]:
        equivalent = self.equivalent
        return {
            **self.key,
            "modes": [mode for mode in MODES if self.modes.get(mode)],
            **self.totals.as_dict(price),
            "sensor": self.sensor,
            "kit_equivalent": equivalent.sensor if equivalent else None,
            "migration_rank": self.migration_rank,
        }


@dataclass(frozen=True)
class Progress:
    """Where a long audit is: DAGs done out of all, tries read so far."""

    dags_done: int
    dags_total: int
    tries: int


@dataclass
class Report:
    """The audit's result, renderable as a table, CSV or JSON."""

    database: str
    since: dt.datetime
    until: dt.datetime
    days: float
    price: float
    check_seconds: float
    group_by: str
    rows: list[Row]
    candidates: list[Row]
    totals: Totals

    def as_dict(self, top: int | None = None) -> dict[str, Any]:
        candidates = self.candidates if top is None else self.candidates[:top]
        return {
            "database": self.database,
            "window": {"days": self.days, "since": self.since.isoformat(), "until": self.until.isoformat()},
            "price_per_slot_hour": self.price,
            "check_seconds": self.check_seconds,
            "group_by": self.group_by,
            "rows": [row.as_dict(self.price) for row in self.rows],
            "candidates": [
                {"rank": row.migration_rank, **row.as_dict(self.price), "advice": row.advice()} for row in candidates
            ],
            "totals": self.totals.as_dict(self.price),
        }

    def to_json(self, top: int | None = None) -> str:
        return json.dumps(self.as_dict(top), indent=2)

    def csv_columns(self) -> list[str]:
        return [
            *GROUP_KEYS[self.group_by],
            "modes",
            "runs",
            "worker_runs",
            "wall_hours",
            "worker_held_hours",
            "idle_held_hours",
            "cost",
            "idle_cost",
            "estimated_runs",
            "sensor",
            "kit_equivalent",
            "migration_rank",
        ]

    def to_csv(self) -> str:
        out = io.StringIO()
        writer = csv.DictWriter(out, fieldnames=self.csv_columns(), lineterminator="\n")
        writer.writeheader()
        for row in self.rows:
            record = row.as_dict(self.price)
            record["modes"] = "+".join(record["modes"])
            record["sensor"] = "yes" if record["sensor"] else "no"
            for name, value in record.items():
                if isinstance(value, float):
                    record[name] = f"{value:.6f}"
                elif value is None:
                    record[name] = ""
            writer.writerow(record)
        return out.getvalue()

    def to_table(self, top: int = 10) -> str:
        head = (
            f"Airflow metadata DB: {self.database}\n"
            f"Window: last {self.days:g} days ({_when(self.since)} to {_when(self.until)}); "
            f"price {self.price:g} per slot-hour; one check allowance {self.check_seconds:g} s\n"
        )
        keys = GROUP_KEYS[self.group_by]
        header = [key.upper().replace("_ID", "") for key in keys]
        header += ["MODE", "RUNS", "WALL h", "WORKER h", "IDLE h", "COST", "IDLE COST"]
        if "operator" in keys:
            header.append("KIT EQUIVALENT")
        lines = []
        for row in self.rows:
            line = [row.key[key] for key in keys]
            line += ["+".join(mode for mode in MODES if row.modes.get(mode)), *self._figures(row.totals)]
            if "operator" in keys:
                equivalent = row.equivalent
                line.append(equivalent.name if equivalent else "-")
            lines.append(line)
        total = ["TOTAL", *([""] * (len(keys) - 1)), "", *self._figures(self.totals)]
        if "operator" in keys:
            total.append("")
        parts = [head, _grid(header, [*lines, total], numeric=range(len(keys) + 1, len(keys) + 7))]
        if top > 0 and self.candidates:
            shown = self.candidates[:top]
            ranked = [
                [
                    str(row.migration_rank),
                    row.key["dag_id"],
                    row.key["task_id"],
                    row.key["operator"],
                    "+".join(mode for mode in MODES if row.modes.get(mode)),
                    f"{row.totals.idle / 3600:,.3f}",
                    f"{row.totals.idle / 3600 * self.price:,.2f}",
                    row.advice(),
                ]
                for row in shown
            ]
            more = len(self.candidates) - len(shown)
            parts.append(
                "\nSensors worth migrating (idle worker-held time, most costly first"
                + (f"; {more} more not shown, see --top" if more > 0 else "")
                + "):\n"
                + _grid(
                    ["#", "DAG", "TASK", "OPERATOR", "MODE", "IDLE h", "IDLE COST", "USE"], ranked, numeric=(0, 5, 6)
                )
            )
        elif top > 0:
            parts.append("\nNo sensor held a worker slot while waiting in this window.\n")
        if self.totals.estimated:
            parts.append(
                f"\n{self.totals.estimated} of {self.totals.runs} runs had no state-change rows in the log table "
                "(pruned?); their worker-held time is estimated (see docs/audit.md).\n"
            )
        return "".join(parts)

    def _figures(self, totals: Totals) -> list[str]:
        return [
            str(totals.runs),
            f"{totals.wall / 3600:,.3f}",
            f"{totals.worker / 3600:,.3f}",
            f"{totals.idle / 3600:,.3f}",
            f"{totals.worker / 3600 * self.price:,.2f}",
            f"{totals.idle / 3600 * self.price:,.2f}",
        ]


def _when(moment: dt.datetime) -> str:
    return moment.astimezone(UTC).strftime("%Y-%m-%d %H:%M UTC")


def _grid(header: list[str], lines: list[list[str]], *, numeric: Container[int]) -> str:
    """Plain fixed-width columns, the ``numeric`` ones right-aligned."""
    widths = [max(len(str(cell)) for cell in column) for column in zip(header, *lines, strict=True)]

    def render(cells: list[str]) -> str:
        out = [
            cell.rjust(widths[i]) if i in numeric else cell.ljust(widths[i]) for i, cell in enumerate(map(str, cells))
        ]
        return "  ".join(out).rstrip()

    return "\n".join([render(header), *(render(line) for line in lines)]) + "\n"


# ----------------------------------------------------------------- the metadata schema
class _UtcDateTime(TypeDecorator[dt.datetime]):
    """Airflow's ``UtcDateTime`` without importing Airflow: UTC in, aware UTC out.

    SQLite and MySQL columns hold naive UTC (SQLite as text); PostgreSQL holds timestamptz.
    """

    impl = sa.DateTime(timezone=True)
    cache_ok = True

    def process_bind_param(self, value: dt.datetime | None, dialect: sa.Dialect) -> dt.datetime | None:
        if value is None:
            return None
        value = value.astimezone(UTC) if value.tzinfo else value.replace(tzinfo=UTC)
        return value.replace(tzinfo=None) if dialect.name in ("sqlite", "mysql") else value

    def process_result_value(self, value: Any, dialect: sa.Dialect) -> dt.datetime | None:
        if value is None:
            return None
        if isinstance(value, str):
            value = dt.datetime.fromisoformat(value)
        return value.replace(tzinfo=UTC) if value.tzinfo is None else value.astimezone(UTC)


_md = sa.MetaData()


def _try_columns() -> list[sa.Column[Any]]:
    return [
        sa.Column("dag_id", sa.String),
        sa.Column("task_id", sa.String),
        sa.Column("run_id", sa.String),
        sa.Column("map_index", sa.Integer),
        sa.Column("try_number", sa.Integer),
        sa.Column("state", sa.String),
        sa.Column("operator", sa.String),
        sa.Column("custom_operator_name", sa.String),
        sa.Column("start_date", _UtcDateTime()),
        sa.Column("end_date", _UtcDateTime()),
        sa.Column("queued_dttm", _UtcDateTime()),
    ]


# Only the columns the audit reads; every one exists throughout Airflow 3.x.
TI = sa.Table("task_instance", _md, sa.Column("id", sa.String), *_try_columns())
TIH = sa.Table("task_instance_history", _md, *_try_columns())
RESCHEDULE = sa.Table(
    "task_reschedule",
    _md,
    sa.Column("id", sa.Integer),
    sa.Column("ti_id", sa.String),
    sa.Column("end_date", _UtcDateTime()),
)
LOG = sa.Table(
    "log",
    _md,
    sa.Column("id", sa.Integer),
    sa.Column("dttm", _UtcDateTime()),
    sa.Column("dag_id", sa.String),
    sa.Column("task_id", sa.String),
    sa.Column("run_id", sa.String),
    sa.Column("map_index", sa.Integer),
    sa.Column("try_number", sa.Integer),
    sa.Column("event", sa.String),
)
_TRY_KEY = ("task_id", "run_id", "map_index", "try_number")


def _same_try(a: sa.Table, b: sa.Table) -> sa.ColumnElement[bool]:
    return sa.and_(a.c.dag_id == b.c.dag_id, *(a.c[name] == b.c[name] for name in _TRY_KEY))


def _in_window(table: sa.Table, dag_id: str, since: dt.datetime, until: dt.datetime) -> list[sa.ColumnElement[bool]]:
    conditions = [table.c.dag_id == dag_id, table.c.end_date >= since, table.c.end_date < until]
    if table is TI:
        conditions.append(TI.c.state.in_(FINISHED))
    else:
        # An archived try whose number is also the current try's (a retry not yet re-queued) is
        # counted once, from task_instance.
        conditions += [
            sa.or_(TIH.c.state.is_(None), TIH.c.state.not_in(NEVER_RAN)),
            ~sa.exists().where(_same_try(TI, TIH)),
        ]
    return conditions


def tries_query(dag_id: str, since: dt.datetime, until: dt.datetime) -> sa.CompoundSelect[Any]:
    """Every try of ``dag_id`` that ended in the window: current tries and archived ones."""
    reschedules = sa.select(sa.func.count()).where(RESCHEDULE.c.ti_id == TI.c.id).scalar_subquery()
    first_reschedule = sa.select(sa.func.min(RESCHEDULE.c.end_date)).where(RESCHEDULE.c.ti_id == TI.c.id)
    current = sa.select(
        *(TI.c[c.name] for c in TIH.columns),
        reschedules.label("reschedules"),
        first_reschedule.scalar_subquery().label("first_reschedule_end"),
    ).where(*_in_window(TI, dag_id, since, until))
    # task_reschedule rows of earlier tries are deleted when a task is retried.
    archived = sa.select(
        *TIH.columns,
        sa.literal(0, sa.Integer).label("reschedules"),
        sa.null().label("first_reschedule_end"),
    ).where(*_in_window(TIH, dag_id, since, until))
    return sa.union_all(current, archived)


def events_query(dag_id: str, since: dt.datetime, until: dt.datetime) -> sa.CompoundSelect[Any]:
    """The worker start/stop ``log`` rows of those same tries (index ``idx_log_task_instance``)."""
    parts = []
    for table in (TI, TIH):
        parts.append(
            sa.select(*(LOG.c[name] for name in _TRY_KEY), LOG.c.event, LOG.c.dttm, LOG.c.id)
            .select_from(LOG.join(table, _same_try(LOG, table)))
            .where(*_in_window(table, dag_id, since, until), LOG.c.event.in_((WORKER_START, *WORKER_STOP)))
        )
    return sa.union_all(*parts)


# ---------------------------------------------------------------------- the database
def mask(url: str | URL) -> str:
    """The URL with its password hidden, for messages and reports."""
    try:
        return make_url(url).render_as_string(hide_password=True)
    except Exception:
        return "<unparseable URL>"


def resolve_url(url: str | None) -> str:
    """The URL given, else Airflow's ``[database] sql_alchemy_conn``.

    The environment variable is read directly (fast); otherwise Airflow's configuration is
    loaded, which honours ``airflow.cfg``, ``_cmd`` and ``_secret`` variants.
    """
    if url:
        return url
    if os.environ.get(SQL_ALCHEMY_CONN_ENV):
        return os.environ[SQL_ALCHEMY_CONN_ENV]
    try:
        from airflow.configuration import conf

        configured = conf.get("database", "sql_alchemy_conn")
    except Exception as exc:
        raise AuditError(
            f"could not read [database] sql_alchemy_conn from Airflow's configuration ({exc}); "
            "pass --sql-alchemy-conn URL"
        ) from exc
    if not configured:
        raise AuditError("Airflow's [database] sql_alchemy_conn is empty; pass --sql-alchemy-conn URL")
    return str(configured)


def open_engine(url: str) -> Engine:
    """A read-only engine on the metadata DB: SQLite opened ``mode=ro`` and ``query_only``,
    PostgreSQL and MySQL sessions set to read-only transactions."""
    try:
        parsed = make_url(url)
    except Exception as exc:
        raise AuditUsageError("--sql-alchemy-conn", f"not a database URL: {url!r}") from exc
    backend = parsed.get_backend_name()
    if backend == "sqlite":
        return _sqlite_engine(parsed)
    try:
        engine = sa.create_engine(parsed)
    except sa.exc.NoSuchModuleError as exc:
        raise AuditUsageError(
            "--sql-alchemy-conn",
            f"unknown database URL scheme {parsed.drivername!r} in {mask(parsed)}; "
            "expected sqlite:///PATH, postgresql://... or mysql://...",
        ) from exc
    except ImportError as exc:
        raise AuditError(f"the database driver for {parsed.drivername!r} is not installed: {exc}") from exc
    statement = {
        "postgresql": "SET SESSION CHARACTERISTICS AS TRANSACTION READ ONLY",
        "mysql": "SET SESSION TRANSACTION READ ONLY",
    }.get(backend)

    if statement is not None:

        @sa.event.listens_for(engine, "connect")
        def _read_only(dbapi_connection: Any, _record: Any) -> None:
            cursor = dbapi_connection.cursor()
            cursor.execute(statement)
            cursor.close()
            dbapi_connection.commit()  # a SET inside a transaction that rolls back would not stick

    return engine


def _sqlite_engine(parsed: URL) -> Engine:
    if not parsed.database or parsed.database == ":memory:":
        raise AuditUsageError("--sql-alchemy-conn", "an in-memory SQLite database has no Airflow metadata")
    path = Path(parsed.database).expanduser().resolve()
    if not path.is_file():
        raise AuditUsageError("--sql-alchemy-conn", f"no SQLite database at {path}")
    uri = f"{path.as_uri()}?mode=ro"

    def connect() -> sqlite3.Connection:
        connection = sqlite3.connect(uri, uri=True, check_same_thread=False)
        connection.execute("PRAGMA query_only = ON")
        return connection

    return sa.create_engine("sqlite+pysqlite://", creator=connect, poolclass=sa.pool.NullPool)


_REQUIRED = {
    TI.name: {column.name for column in TI.columns},
    TIH.name: {column.name for column in TIH.columns},
    RESCHEDULE.name: {column.name for column in RESCHEDULE.columns},
    LOG.name: {column.name for column in LOG.columns},
}


def check_schema(connection: sa.Connection, database: str) -> None:
    """Fail clearly unless this is an Airflow 3 metadata DB (``task_instance.id``,
    ``task_reschedule.ti_id`` and ``task_instance_history`` all arrived with 3.0)."""
    inspector = sa.inspect(connection)
    tables = set(inspector.get_table_names())
    for table, needed in _REQUIRED.items():
        if table not in tables:
            raise AuditError(f"{database} is not an Airflow 3 metadata database: it has no {table} table")
        missing = needed - {column["name"] for column in inspector.get_columns(table)}
        if missing:
            raise AuditError(
                f"{database} is not an Airflow 3 metadata database: {table} lacks {', '.join(sorted(missing))}"
            )


# --------------------------------------------------------------------------- the audit
def validate(*, days: float, price: float, check_seconds: float, group_by: str) -> None:
    """Reject unusable arguments with the option name a user typed."""
    if not isinstance(days, (int, float)) or not math.isfinite(days) or days <= 0:
        raise AuditUsageError("--days", f"must be a positive number of days, got {days!r}")
    if not isinstance(price, (int, float)) or not math.isfinite(price) or price < 0:
        raise AuditUsageError("--price-per-slot-hour", f"must be a non-negative number, got {price!r}")
    if not isinstance(check_seconds, (int, float)) or not math.isfinite(check_seconds) or check_seconds < 0:
        raise AuditUsageError("--check-seconds", f"must be a non-negative number of seconds, got {check_seconds!r}")
    if group_by not in GROUP_BY:
        raise AuditUsageError("--by", f"must be one of {', '.join(GROUP_BY)}, got {group_by!r}")


def run_audit(
    url: str | None = None,
    *,
    days: float = 7,
    price: float = 1.0,
    group_by: str = "task",
    check_seconds: float = 5.0,
    dag_ids: Sequence[str] | None = None,
    now: dt.datetime | None = None,
    progress: Callable[[Progress], None] | None = None,
    progress_every: int = 5000,
) -> Report:
    """Audit the tries that ended in the last ``days`` before ``now``, DAG by DAG.

    One DAG at a time keeps memory bounded by the largest DAG's window, and every query uses
    an index prefix on ``dag_id``.
    """
    validate(days=days, price=price, check_seconds=check_seconds, group_by=group_by)
    resolved = resolve_url(url)
    database = mask(resolved)
    until = (now or dt.datetime.now(UTC)).astimezone(UTC)
    since = until - dt.timedelta(days=days)
    engine = open_engine(resolved)
    tasks: dict[tuple[str, str, str], Row] = {}
    tries = 0
    try:
        try:
            connection = engine.connect()
        except sa.exc.DBAPIError as exc:
            raise AuditError(f"could not connect to {database}: {exc.orig}") from exc
        with connection:
            check_schema(connection, database)
            dags = list(dag_ids) if dag_ids else sorted(connection.scalars(sa.select(TI.c.dag_id).distinct()))
            for done, dag_id in enumerate(dags):
                for attempt, events in _dag_tries(connection, dag_id, since, until):
                    tries += 1
                    if progress is not None and tries % progress_every == 0:
                        progress(Progress(done, len(dags), tries))
                    _account(tasks, attempt, events, check_seconds)
                if progress is not None:
                    progress(Progress(done + 1, len(dags), tries))
    except sa.exc.DBAPIError as exc:
        raise AuditError(f"reading {database} failed: {exc.orig}") from exc
    finally:
        engine.dispose()
    return _report(tasks, database, since, until, days, price, check_seconds, group_by)


def _dag_tries(
    connection: sa.Connection, dag_id: str, since: dt.datetime, until: dt.datetime
) -> Iterable[tuple[Try, list[Event]]]:
    by_try: dict[tuple[str, str, int, int], list[tuple[dt.datetime, int, str]]] = {}
    for row in connection.execute(events_query(dag_id, since, until)):
        if row.dttm is not None:
            key = (row.task_id, row.run_id, row.map_index, row.try_number)
            by_try.setdefault(key, []).append((row.dttm, row.id, row.event))
    for row in connection.execute(tries_query(dag_id, since, until)):
        attempt = Try(
            dag_id=row.dag_id,
            task_id=row.task_id,
            run_id=row.run_id,
            map_index=row.map_index,
            try_number=row.try_number,
            state=row.state,
            operator=row.operator,
            custom_operator_name=row.custom_operator_name,
            start=row.start_date,
            end=row.end_date,
            queued=row.queued_dttm,
            reschedules=row.reschedules or 0,
            first_reschedule_end=row.first_reschedule_end,
        )
        rows = sorted(by_try.pop((row.task_id, row.run_id, row.map_index, row.try_number), []))
        yield attempt, [Event(name, at) for at, _, name in rows]


def _account(tasks: dict[tuple[str, str, str], Row], attempt: Try, events: list[Event], check_seconds: float) -> None:
    usage = measure(attempt, events)
    if usage is None:
        return
    sensor = attempt.sensor or usage.mode == "reschedule"
    key = (attempt.dag_id, attempt.task_id, attempt.operator_name)
    row = tasks.get(key)
    if row is None:
        row = tasks[key] = Row({"dag_id": key[0], "task_id": key[1], "operator": key[2]})
    row.totals.add(usage, usage.idle(sensor=sensor, check_seconds=check_seconds))
    row.modes[usage.mode] = row.modes.get(usage.mode, 0) + 1
    row.sensor = row.sensor or sensor
    if attempt.operator:
        row.operator_classes.add(attempt.operator)


def _report(
    tasks: dict[tuple[str, str, str], Row],
    database: str,
    since: dt.datetime,
    until: dt.datetime,
    days: float,
    price: float,
    check_seconds: float,
    group_by: str,
) -> Report:
    candidates = sorted(
        (row for row in tasks.values() if row.sensor and row.totals.idle > 0 and row.still_held_while_waiting),
        key=lambda row: (-row.totals.idle, -row.totals.worker, tuple(row.key.values())),
    )
    for rank, row in enumerate(candidates, start=1):
        row.migration_rank = rank
    if group_by == "task":
        rows = list(tasks.values())
    else:
        names = GROUP_KEYS[group_by]
        grouped: dict[tuple[str, ...], Row] = {}
        for task in tasks.values():
            key = tuple(task.key[name] for name in names)
            if key not in grouped:
                grouped[key] = Row(dict(zip(names, key, strict=True)))
            grouped[key].absorb(task)
        rows = list(grouped.values())
    rows.sort(key=lambda row: (-row.totals.worker, tuple(row.key.values())))
    totals = Totals()
    for row in rows:
        totals.merge(row.totals)
    return Report(database, since, until, days, price, check_seconds, group_by, rows, candidates, totals)
