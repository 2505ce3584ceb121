"""How many worker-slot hours an Airflow 3 deployment spends waiting, read from its metadata DB.

``airflow-deferrable-kit audit`` (see :mod:`airflow_deferrable_kit.cli` and ``docs/audit.md``)
runs :func:`run_audit`. It has three jobs, each in its own module:

* :mod:`~airflow_deferrable_kit.audit.schema` declares the metadata tables the kit reads (the
  audit and the Waits page);
* :mod:`~airflow_deferrable_kit.audit._metadata` reads the metadata DB, read-only, with
  SQLAlchemy Core (no Airflow models, so any Airflow 3.x schema and no Airflow import needed);
* :mod:`~airflow_deferrable_kit.audit._measure` turns one try's state changes into
  worker-held and waited seconds (the module says where those numbers come from);
* :mod:`~airflow_deferrable_kit.audit._report` sums tries into rows, ranks the sensors worth
  migrating and renders the table, CSV or JSON;
* :mod:`~airflow_deferrable_kit.audit._advice` names the kit sensor that replaces each one and,
  per sensor, the change that would hold the least worker time and what it saves;
* :mod:`~airflow_deferrable_kit.audit._html` renders the report as one self-contained HTML page;
* :mod:`~airflow_deferrable_kit.audit._fleet` finds, in the triggers held now, the upstreams
  whose waits several triggerers hold, each making the request the kit shares per triggerer
  (:mod:`~airflow_deferrable_kit.audit._triggers` reads trigger rows for it and the Waits page).

Every name the command, the docs and the benchmarks use is importable from here. Nothing in
this package is imported by triggers or sensors.
"""

from __future__ import annotations

import datetime as dt
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from airflow_deferrable_kit.audit._advice import (
    CHANGES,
    EQUIVALENTS,
    LISTENER_REFUSAL,
    MODES,
    START_CONDITION,
    STARTS_DAG_CONDITION,
    Equivalent,
    Listeners,
    Recommendation,
    kit_equivalent,
)
from airflow_deferrable_kit.audit._errors import AuditError, AuditUsageError
from airflow_deferrable_kit.audit._fleet import Spread, Upstream, spread_upstreams, upstream_of
from airflow_deferrable_kit.audit._html import STYLE, figures_html, render_html
from airflow_deferrable_kit.audit._measure import (
    CLOCK_SKEW_ALLOWANCE,
    WORKER_START,
    WORKER_STOP,
    Event,
    Try,
    Usage,
    first_look,
    is_sensor,
    measure,
    worker_intervals,
)
from airflow_deferrable_kit.audit._metadata import (
    FINISHED,
    NEVER_RAN,
    SQL_ALCHEMY_CONN_ENV,
    UTC,
    DagShape,
    all_dag_ids,
    check_schema,
    dag_shape,
    dag_tries,
    events_query,
    listener_evidence,
    mask,
    metadata_connection,
    open_engine,
    resolve_url,
    shape_from_serialized,
    tries_query,
)
from airflow_deferrable_kit.audit._report import (
    GROUP_BY,
    GROUP_KEYS,
    Held,
    Report,
    Row,
    Tasks,
    Totals,
    account,
    build_report,
    duration,
)
from airflow_deferrable_kit.audit.schema import LOG, RESCHEDULE, TI, TIH, UtcDateTime


@dataclass(frozen=True)
class Progress:
    """Where a long audit is: DAGs done out of all, tries read so far."""

    dags_done: int
    dags_total: int
    tries: int


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
    run_ids: Sequence[str] | None = None,
    now: dt.datetime | None = None,
    progress: Callable[[Progress], None] | None = None,
    progress_every: int = 5000,
    listeners: bool | None = None,
) -> Report:
    """Audit the tries that ended in the last ``days`` before ``now``, DAG by DAG.

    ``dag_ids`` and ``run_ids`` narrow it to those DAGs and DAG runs. One DAG at a time keeps
    memory bounded by the largest DAG's window, and every query uses an index prefix on ``dag_id``.
    ``listeners`` says whether the deployment has listener plugins; ``None`` lets the metadata
    DB tell, if it can (:func:`listener_evidence`), which decides whether ``end_from_trigger``
    is advised. Each DAG with sensors has its newest serialized version read for its shape.
    """
    validate(days=days, price=price, check_seconds=check_seconds, group_by=group_by)
    resolved = resolve_url(url)
    until = (now or dt.datetime.now(UTC)).astimezone(UTC)
    since = until - dt.timedelta(days=days)
    tasks: Tasks = {}
    tries = 0
    with metadata_connection(resolved) as connection:
        if listeners is None:
            known = listener_evidence(connection)
        else:
            known = Listeners(listeners, f"--{'' if listeners else 'no-'}listeners")
        dags = list(dag_ids) if dag_ids else all_dag_ids(connection)
        for done, dag_id in enumerate(dags):
            sensors: dict[int, Row] = {}  # the DAG's sensor rows, to mark from its shape
            measured: list[tuple[Try, Usage]] = []
            deferring: set[tuple[str, str]] = set()  # (task, operator) with a try that deferred
            for attempt, events in dag_tries(connection, dag_id, since, until, run_ids):
                tries += 1
                if progress is not None and tries % progress_every == 0:
                    progress(Progress(done, len(dags), tries))
                usage = measure(attempt, events)
                if usage is not None:
                    measured.append((attempt, usage))
                    if usage.mode == "deferred":
                        deferring.add((attempt.task_id, attempt.operator_name))
            shape = dag_shape(connection, dag_id) if any(a.sensor for a, _ in measured) else None
            shape_read = shape is not None
            for attempt, usage in measured:
                if (attempt.task_id, attempt.operator_name) in deferring:
                    usage = first_look(usage)  # the task defers: a try that did not ended at its first look
                module = shape.modules.get(attempt.task_id) if shape is not None else None
                row = account(tasks, attempt, usage, check_seconds, module=module)
                if row.sensor:
                    sensors[id(row)] = row
            if sensors:
                if not shape_read:
                    shape = dag_shape(connection, dag_id)
                for row in sensors.values():
                    row.starts_dag = None if shape is None else shape.starts_with(row.key["task_id"])
            if progress is not None:
                progress(Progress(done + 1, len(dags), tries))
        spread = spread_upstreams(connection, dag_ids)
    return build_report(tasks, mask(resolved), since, until, days, price, check_seconds, group_by, known, spread)


__all__ = [
    "CHANGES",
    "CLOCK_SKEW_ALLOWANCE",
    "EQUIVALENTS",
    "FINISHED",
    "GROUP_BY",
    "GROUP_KEYS",
    "LISTENER_REFUSAL",
    "LOG",
    "MODES",
    "NEVER_RAN",
    "RESCHEDULE",
    "SQL_ALCHEMY_CONN_ENV",
    "STARTS_DAG_CONDITION",
    "START_CONDITION",
    "STYLE",
    "TI",
    "TIH",
    "UTC",
    "WORKER_START",
    "WORKER_STOP",
    "AuditError",
    "AuditUsageError",
    "DagShape",
    "Equivalent",
    "Event",
    "Held",
    "Listeners",
    "Progress",
    "Recommendation",
    "Report",
    "Row",
    "Spread",
    "Totals",
    "Try",
    "Upstream",
    "Usage",
    "UtcDateTime",
    "check_schema",
    "dag_shape",
    "duration",
    "events_query",
    "figures_html",
    "first_look",
    "is_sensor",
    "kit_equivalent",
    "listener_evidence",
    "mask",
    "measure",
    "open_engine",
    "render_html",
    "resolve_url",
    "run_audit",
    "shape_from_serialized",
    "spread_upstreams",
    "tries_query",
    "upstream_of",
    "validate",
    "worker_intervals",
]
