"""Reporting: tries summed into rows (task, DAG or operator), sensors ranked, text rendered.

The ranking is the point of the audit: sensors whose tries held a worker slot while only
waiting (poke or reschedule mode), most idle worker-held time first, each with the kit sensor
that moves its wait to the triggerer; and for every sensor, the change that would save the most
worker time (:mod:`~airflow_deferrable_kit.audit._advice`); and, per sensor class and mode,
what the tries held against what a poke-mode sensor would have held (:class:`Held`), so the saving
can be said in words. Rows render as a fixed-width table (each duration in the unit its size
calls for), CSV or JSON (raw hours and seconds); ``_html`` renders the same report as a page.
"""

from __future__ import annotations

import csv
import datetime as dt
import io
import json
from collections.abc import Container
from dataclasses import dataclass, field
from typing import Any

from airflow_deferrable_kit.audit._advice import (
    LISTENER_PLUGINS,
    MODES,
    Equivalent,
    Listeners,
    Recommendation,
    Savings,
    kit_equivalent,
    migration_advice,
    origin,
    recommend,
)
from airflow_deferrable_kit.audit._fleet import Spread
from airflow_deferrable_kit.audit._measure import Try, Usage

UTC = dt.timezone.utc
GROUP_BY = ("task", "dag", "operator")
GROUP_KEYS: dict[str, tuple[str, ...]] = {
    "task": ("dag_id", "task_id", "operator"),
    "dag": ("dag_id",),
    "operator": ("operator",),
}


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


#: Said under the advice wherever ``start_from_trigger`` is advised: what the audit cannot know.
START_NOTE = (
    "start_from_trigger is advised on condition: it needs Airflow 3.3 or later, which the metadata DB does not "
    "tell; mapped tasks are not advised it (Airflow 3.3.2 starts them on a worker whatever the flag)."
)


@dataclass
class Row:
    """One line of the report: a task, a DAG or an operator over the window."""

    key: dict[str, str]
    totals: Totals = field(default_factory=Totals)
    modes: dict[str, int] = field(default_factory=dict)
    sensor: bool = False
    operator_classes: set[str] = field(default_factory=set)
    migration_rank: int | None = None
    savings: Savings = field(default_factory=Savings)
    #: A sensor's tries summed per mode, for what a poke-mode sensor would have held instead.
    by_mode: dict[str, Totals] = field(default_factory=dict)
    #: Whether the task is the first of a DAG that only waits on it to start work (``None``:
    #: the DAG's shape could not be read).
    starts_dag: bool | None = None
    #: The module of the task's operator class, from its serialized DAG (``None`` if unread).
    module: str | None = None

    @property
    def equivalent(self) -> Equivalent | None:
        if "operator" not in self.key:
            return None
        return kit_equivalent(*sorted(self.operator_classes), self.key["operator"], module=self.module)

    @property
    def label(self) -> str:
        """The operator as the chart names it: with who ships it where the module is known, so
        this kit's ``S3KeySensor`` and amazon's are two rows, not one."""
        who = origin(self.module)
        return f"{self.key['operator']} ({who})" if who else self.key["operator"]

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
        self.savings.merge(other.savings)
        for mode, totals in other.by_mode.items():
            self.by_mode.setdefault(mode, Totals()).merge(totals)

    def advice(self) -> str:
        """What this sensor should become to stop waiting on a worker."""
        return migration_advice(self.equivalent)

    def recommendation(self, listeners: Listeners | None = None) -> Recommendation | None:
        """The change that would save this sensor task the most worker time, if any."""
        if not self.sensor or "operator" not in self.key:
            return None
        return recommend(
            self.key, self.modes, self.equivalent, self.savings, starts_dag=self.starts_dag, listeners=listeners
        )

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
class Held:
    """Sensor tries of one class in one mode: what they held, and what a poke-mode sensor would have.

    A poke-mode sensor holds its worker from its first start to its end, so what it would have
    held for the same tries is their wall time (measured, see ``_measure``); ``held`` is the
    worker time they did hold.
    """

    operator: str
    mode: str
    runs: int
    poke_would_hold: float
    held: float

    def sentence(self) -> str:
        """The saving in words, as the table and the HTML page state it."""
        what = "All sensors" if not self.operator else f"{self.operator} in {self.mode} mode"
        runs = f"{self.runs} run" + ("" if self.runs == 1 else "s")
        return (
            f"{what} ({runs}): a poke-mode sensor would have held {worker_hours(self.poke_would_hold)} "
            f"worker-hours; these held {worker_hours(self.held)} worker-hours."
        )

    def as_dict(self) -> dict[str, Any]:
        return {
            "operator": self.operator or None,
            "mode": self.mode or None,
            "runs": self.runs,
            "poke_would_hold_hours": self.poke_would_hold / 3600,
            "worker_held_hours": self.held / 3600,
            "saved_hours": max(0.0, self.poke_would_hold - self.held) / 3600,
            "sentence": self.sentence(),
        }


def held_by_sensor(rows: list[Row]) -> list[Held]:
    """Per sensor class and mode, most held first; non-sensor tasks are working, not waiting."""
    sums: dict[tuple[str, str], Totals] = {}
    for row in rows:
        for mode, totals in row.by_mode.items():
            sums.setdefault((row.label, mode), Totals()).merge(totals)
    held = [Held(operator, mode, t.runs, t.wall, t.worker) for (operator, mode), t in sums.items()]
    return sorted(held, key=lambda h: (-h.held, -h.poke_would_hold, h.operator, MODES.index(h.mode)))


def all_held(held: list[Held]) -> Held:
    """The sum over every sensor class and mode (``operator`` and ``mode`` empty)."""
    return Held("", "", sum(h.runs for h in held), sum(h.poke_would_hold for h in held), sum(h.held for h in held))


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
    #: One per sensor task that could hold less: the changes available today first, then the
    #: future ones, each most worker time saved first.
    recommendations: list[Recommendation] = field(default_factory=list)
    #: Sensor tries per class and mode: what they held against what poke mode would have.
    held: list[Held] = field(default_factory=list)
    listeners: Listeners = field(default_factory=Listeners)
    #: Upstreams whose waits several triggerers hold now, each making the shared request.
    spread: list[Spread] = field(default_factory=list)

    @property
    def held_total(self) -> Held:
        return all_held(self.held)

    def saving_sentences(self) -> list[str]:
        """The saving in words, per sensor class and mode, then in total (none without sensors)."""
        if not self.held:
            return []
        return [*(held.sentence() for held in self.held), self.held_total.sentence()]

    def start_note(self) -> str:
        """What ``start_from_trigger`` advice depends on, where some is given; else empty."""
        return START_NOTE if any(advice.change == "start_from_trigger" for advice in self.recommendations) else ""

    def listeners_note(self) -> str:
        """What the audit knows of listener plugins, which decides whether end_from_trigger is advised."""
        if self.listeners.registered:
            return f"end_from_trigger is not advised: listener plugins are registered ({self.listeners.source})."
        if self.listeners.registered is False:
            return f"end_from_trigger is advised: no listener plugins ({self.listeners.source})."
        return (
            f"end_from_trigger is advised on condition: Airflow refuses it while listener plugins ({LISTENER_PLUGINS}) "
            f"are registered, and whether any are is {self.listeners.source}."
        )

    def as_dict(self, top: int | None = None) -> dict[str, Any]:
        candidates = self.candidates if top is None else self.candidates[:top]
        recommendations = self.recommendations if top is None else self.recommendations[:top]
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
            "recommendations": [advice.as_dict(self.price) for advice in recommendations],
            "held_by_sensor": [held.as_dict() for held in self.held],
            "sensors_total": self.held_total.as_dict(),
            "listeners": self.listeners.as_dict(),
            "totals": self.totals.as_dict(self.price),
            "shared_requests_multiplied": [spread.as_dict() for spread in self.spread],
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
        """The fixed-width report: rows, totals, what sensors held, and what to change (``top`` each)."""
        head = (
            f"Airflow metadata DB: {self.database}\n"
            f"Window: last {self.days:g} days ({_when(self.since)} to {_when(self.until)}); "
            f"price {self.price:g} per slot-hour; one check allowance {self.check_seconds:g} s\n"
        )
        keys = GROUP_KEYS[self.group_by]
        header = [key.upper().replace("_ID", "") for key in keys]
        header += ["MODE", "RUNS", "WALL", "WORKER", "IDLE", "COST", "IDLE COST"]
        if "operator" in keys:
            header.append("KIT EQUIVALENT")
        lines = []
        for row in self.rows:
            line = [row.key[key] for key in keys]
            line += [_modes(row.modes), *self._figures(row.totals)]
            if "operator" in keys:
                equivalent = row.equivalent
                line.append(equivalent.name if equivalent else "-")
            lines.append(line)
        total = ["TOTAL", *([""] * (len(keys) - 1)), "", *self._figures(self.totals)]
        if "operator" in keys:
            total.append("")
        parts = [head, _grid(header, [*lines, total], numeric=range(len(keys) + 1, len(keys) + 7))]
        parts.append("\n" + self._held_summary() + "\n")
        sentences = self.saving_sentences()
        if sentences:
            parts.append("\nWhat poke mode would have held, per sensor and mode:\n")
            parts.extend(f"  {sentence}\n" for sentence in sentences)
        if top > 0 and self.candidates:
            parts.append(self._candidates_table(top))
        deferred = [advice for advice in self.recommendations if advice.change != "deferrable"]
        if top > 0 and deferred:
            parts.append(self._deferred_table(deferred, top))
        if (
            any("end_from_trigger=True" in advice.advice for advice in self.recommendations)
            or self.listeners.registered
        ):
            parts.append("\n" + self.listeners_note() + "\n")
        if self.start_note():
            parts.append("\n" + self.start_note() + "\n")
        if self.totals.estimated:
            parts.append(
                f"\n{self.totals.estimated} of {self.totals.runs} runs had no state-change rows in the log table "
                "(pruned?); their worker-held time is estimated (see docs/audit.md).\n"
            )
        if self.spread:
            parts.append(self._spread_table())
        return "".join(parts)

    def _spread_table(self) -> str:
        lines = [
            [spread.upstream.kind, spread.upstream.name, str(spread.waits), str(spread.triggerers), spread.advice()]
            for spread in self.spread
        ]
        return "\nShared requests made by several triggerers (the waits deferred now):\n" + _grid(
            ["KIND", "UPSTREAM", "WAITS", "TRIGGERERS", "ADVICE"], lines, numeric=(2, 3)
        )

    def _held_summary(self) -> str:
        """What sensors held while waiting, in words that stay true at any size, zero included."""
        if self.totals.idle == 0:
            return "No sensor held a worker slot while waiting in this window."
        text = f"Sensors held worker slots for {duration(self.totals.idle)} beyond one check per try (IDLE)"
        if not self.candidates:
            text += ", none of it waiting in poke or reschedule mode: no sensor to migrate"
        return text + "."

    def _candidates_table(self, top: int) -> str:
        shown = self.candidates[:top]
        ranked = [
            [
                str(row.migration_rank),
                *(row.key[key] for key in GROUP_KEYS["task"]),
                _modes(row.modes),
                duration(row.totals.idle),
                money(row.totals.idle / 3600 * self.price),
                duration(row.savings.deferring),
                row.advice(),
            ]
            for row in shown
        ]
        header = ["#", "DAG", "TASK", "OPERATOR", "MODE", "IDLE", "IDLE COST", "SAVES", "USE"]
        return (
            "\nSensors worth migrating (idle worker-held time, most costly first; SAVES: worker time "
            "deferrable=True would no longer hold"
            + _more(len(self.candidates) - len(shown))
            + "):\n"
            + _grid(header, ranked, numeric=(0, 5, 6, 7))
        )

    def _deferred_table(self, deferred: list[Recommendation], top: int) -> str:
        shown = deferred[:top]
        lines = [
            [
                *(advice.key[key] for key in GROUP_KEYS["task"]),
                "+".join(advice.modes),
                duration(advice.saves),
                advice.advice,
            ]
            for advice in shown
        ]
        return (
            "\nOther changes that would hold less (SAVES: worker time the change would no longer hold"
            + _more(len(deferred) - len(shown))
            + "):\n"
            + _grid(["DAG", "TASK", "OPERATOR", "MODE", "SAVES", "CHANGE"], lines, numeric=(4,))
        )

    def _figures(self, totals: Totals) -> list[str]:
        return [
            str(totals.runs),
            duration(totals.wall),
            duration(totals.worker),
            duration(totals.idle),
            money(totals.worker / 3600 * self.price),
            money(totals.idle / 3600 * self.price),
        ]


def duration(seconds: float) -> str:
    """Seconds as the text report shows them: in s, min or h by size, never a zero that is not one."""
    if seconds == 0:
        return "0 s"
    if seconds < 0.05:
        return "<0.1 s"
    if seconds < 59.95:
        return f"{seconds:.1f} s"
    if seconds < 3597:
        return f"{seconds / 60:.1f} min"
    return f"{seconds / 3600:,.1f} h"


def worker_hours(seconds: float) -> str:
    """Seconds as a number of hours for a sentence: 2 decimals from one hour, 2 significant digits below."""
    hours = seconds / 3600
    if hours == 0:
        return "0"
    if hours < 0.0001:
        return "<0.0001"
    if hours >= 1:
        return f"{hours:,.2f}"
    return f"{hours:.2g}"


def money(amount: float) -> str:
    """A cost to the cent, with ``<0.01`` for an amount too small to show as one."""
    if 0 < amount < 0.005:
        return "<0.01"
    return f"{amount:,.2f}"


def _modes(modes: dict[str, int]) -> str:
    return "+".join(mode for mode in MODES if modes.get(mode))


def _more(hidden: int) -> str:
    return f"; {hidden} more not shown, see --top" if hidden > 0 else ""


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


#: The per-task rows of an audit, keyed by (dag_id, task_id, operator name).
Tasks = dict[tuple[str, str, str], Row]


def account(tasks: Tasks, attempt: Try, usage: Usage, check_seconds: float, *, module: str | None = None) -> Row:
    """Add one measured try to its task's row, and return the row (``module``: its operator's)."""
    sensor = attempt.sensor or usage.mode == "reschedule"
    key = (attempt.dag_id, attempt.task_id, attempt.operator_name)
    row = tasks.get(key)
    if row is None:
        row = tasks[key] = Row({"dag_id": key[0], "task_id": key[1], "operator": key[2]})
    idle = usage.idle(sensor=sensor, check_seconds=check_seconds)
    row.totals.add(usage, idle)
    if sensor:
        row.savings.add(usage, check_seconds, mapped=attempt.map_index >= 0)
        row.by_mode.setdefault(usage.mode, Totals()).add(usage, idle)
    row.modes[usage.mode] = row.modes.get(usage.mode, 0) + 1
    row.sensor = row.sensor or sensor
    row.module = module or row.module
    if attempt.operator:
        row.operator_classes.add(attempt.operator)
    return row


def build_report(
    tasks: Tasks,
    database: str,
    since: dt.datetime,
    until: dt.datetime,
    days: float,
    price: float,
    check_seconds: float,
    group_by: str,
    listeners: Listeners | None = None,
    spread: list[Spread] | None = None,
) -> Report:
    """The report: rows grouped as asked, sorted by worker-held time, and the ranked candidates.

    Candidates are always tasks (a DAG or operator row mixes sensors that migrate separately).
    """
    candidates = sorted(
        (row for row in tasks.values() if row.sensor and row.totals.idle > 0 and row.still_held_while_waiting),
        key=lambda row: (-row.totals.idle, -row.totals.worker, tuple(row.key.values())),
    )
    for rank, row in enumerate(candidates, start=1):
        row.migration_rank = rank
    listeners = listeners or Listeners()
    recommendations = sorted(
        (advice for advice in (row.recommendation(listeners) for row in tasks.values()) if advice is not None),
        key=lambda advice: (-advice.saves, tuple(advice.key.values())),
    )
    held = held_by_sensor(list(tasks.values()))
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
    return Report(
        database,
        since,
        until,
        days,
        price,
        check_seconds,
        group_by,
        rows,
        candidates,
        totals,
        recommendations,
        held,
        listeners,
        spread or [],
    )
