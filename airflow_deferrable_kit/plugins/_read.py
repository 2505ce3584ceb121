"""What the Waits page shows, read from the metadata DB: deferred tasks, triggerers, watchers.

Read with SQLAlchemy Core on the few columns the page needs, every one present in Airflow 3.2
and 3.3 (the asset state store, 3.3 only, is read when its table exists), never written. The
DAGs a user may read are decided by the caller (the auth manager); every query here takes them
as ``dag_ids`` and returns nothing of any other DAG.

The deferred list is built for many rows: filters, sorting and paging happen in SQL, and only the
rows of the page shown have their trigger kwargs decoded (:mod:`._describe`), so 10,000
deferred tasks cost one indexed count, two small group-bys and one page of rows.
"""

from __future__ import annotations

import datetime as dt
import statistics
from collections.abc import Collection, Sequence
from dataclasses import dataclass, field
from typing import Any

import sqlalchemy as sa

from airflow_deferrable_kit._asset_state import KEY_PREFIX
from airflow_deferrable_kit.audit._triggers import KIT_TRIGGERS, kind_of
from airflow_deferrable_kit.audit.schema import (
    ASSET,
    ASSET_EVENT,
    ASSET_STATE,
    ASSET_WATCHER,
    JOB,
    SCHEDULE_REFERENCE,
    TI,
    TRIGGER,
)
from airflow_deferrable_kit.plugins._describe import Wait, classpaths_prefixes, describe

UTC = dt.timezone.utc
DEFERRED = "deferred"
TRIGGERER_JOB = "TriggererJob"

#: How the deferred list can be sorted: name -> the columns, in order.
SORTS: dict[str, tuple[Any, ...]] = {
    "since": (TRIGGER.c.created_date, TI.c.dag_id, TI.c.task_id),
    "dag": (TI.c.dag_id, TI.c.run_id, TI.c.task_id, TI.c.map_index),
    "task": (TI.c.task_id, TI.c.dag_id, TI.c.run_id, TI.c.map_index),
    "budget": (TI.c.trigger_timeout, TI.c.dag_id, TI.c.task_id),
    "triggerer": (JOB.c.hostname, TRIGGER.c.created_date),
    "trigger": (TRIGGER.c.classpath, TRIGGER.c.created_date),
}
UNASSIGNED = "(unassigned)"


# ------------------------------------------------------------------------ deferred now
@dataclass(frozen=True)
class Filters:
    """What the user asked the deferred list for; every field optional but the paging."""

    dag: str | None = None
    kind: str | None = None
    triggerer: str | None = None
    min_age_minutes: float | None = None
    sort: str = "since"
    descending: bool = False
    page: int = 1
    per_page: int = 100


@dataclass(frozen=True)
class Deferred:
    """One deferred task instance and the trigger that holds it."""

    dag_id: str
    run_id: str
    task_id: str
    map_index: int
    try_number: int
    operator: str
    classpath: str
    wait: Wait
    since: dt.datetime | None
    budget_left: float | None
    triggerer: str | None
    queue: str | None


@dataclass
class DeferredPage:
    """One page of the deferred list, the count behind it and what the filters can offer."""

    rows: list[Deferred]
    total: int
    by_dag: list[tuple[str, int]]
    triggerers: list[str]
    filters: Filters

    @property
    def pages(self) -> int:
        return max(1, -(-self.total // self.filters.per_page))


def deferred_dag_ids(connection: sa.Connection) -> dict[str, int]:
    """DAG id -> how many of its task instances are deferred now (to decide which a user sees)."""
    query = sa.select(TI.c.dag_id, sa.func.count()).where(TI.c.state == DEFERRED).group_by(TI.c.dag_id)
    return {dag_id: count for dag_id, count in connection.execute(query)}


def _conditions(filters: Filters, dag_ids: Collection[str], now: dt.datetime) -> list[sa.ColumnElement[bool]]:
    conditions: list[sa.ColumnElement[bool]] = [TI.c.state == DEFERRED, TI.c.dag_id.in_(sorted(dag_ids))]
    if filters.dag:
        conditions.append(TI.c.dag_id == filters.dag)
    if filters.kind == "other":
        conditions.append(sa.not_(TRIGGER.c.classpath.startswith(KIT_TRIGGERS, autoescape=True)))
    elif filters.kind:
        prefixes = classpaths_prefixes(filters.kind)
        conditions.append(sa.or_(*(TRIGGER.c.classpath.startswith(p, autoescape=True) for p in prefixes), sa.false()))
    if filters.triggerer == UNASSIGNED:
        conditions.append(TRIGGER.c.triggerer_id.is_(None))
    elif filters.triggerer:
        conditions.append(JOB.c.hostname == filters.triggerer)
    if filters.min_age_minutes:
        conditions.append(TRIGGER.c.created_date <= now - dt.timedelta(minutes=filters.min_age_minutes))
    return conditions


def _joined() -> Any:
    return TI.join(TRIGGER, TRIGGER.c.id == TI.c.trigger_id).outerjoin(JOB, JOB.c.id == TRIGGER.c.triggerer_id)


def _budget(deadline: dt.datetime | None, timeout: dt.datetime | None, now: dt.datetime) -> float | None:
    """Seconds left: the kit's own deadline where it carries one, else Airflow's trigger timeout."""
    ends = [moment for moment in (deadline, timeout) if moment is not None]
    return (min(ends) - now).total_seconds() if ends else None


def deferred(connection: sa.Connection, dag_ids: Collection[str], filters: Filters, now: dt.datetime) -> DeferredPage:
    """The page of deferred task instances ``filters`` asks for, among ``dag_ids`` only."""
    if not dag_ids:
        return DeferredPage([], 0, [], [], filters)
    conditions = _conditions(filters, dag_ids, now)
    total = connection.scalar(sa.select(sa.func.count()).select_from(_joined()).where(*conditions)) or 0
    order = [column.desc() if filters.descending else column.asc() for column in SORTS[filters.sort]]
    query = (
        sa.select(
            TI.c.dag_id,
            TI.c.run_id,
            TI.c.task_id,
            TI.c.map_index,
            TI.c.try_number,
            TI.c.operator,
            TI.c.custom_operator_name,
            TI.c.trigger_timeout,
            TRIGGER.c.classpath,
            TRIGGER.c.kwargs,
            TRIGGER.c.created_date,
            TRIGGER.c.queue,
            JOB.c.hostname,
        )
        .select_from(_joined())
        .where(*conditions)
        .order_by(*order)
        .limit(filters.per_page)
        .offset((filters.page - 1) * filters.per_page)
    )
    rows = []
    for row in connection.execute(query):
        # Another provider's kwargs are never decoded; only this page's rows are.
        wait = describe(row.classpath, row.kwargs if kind_of(row.classpath) else None)
        rows.append(
            Deferred(
                dag_id=row.dag_id,
                run_id=row.run_id,
                task_id=row.task_id,
                map_index=row.map_index,
                try_number=row.try_number,
                operator=row.custom_operator_name or row.operator or "?",
                classpath=row.classpath,
                wait=wait,
                since=row.created_date,
                budget_left=_budget(wait.deadline, row.trigger_timeout, now),
                triggerer=row.hostname,
                queue=row.queue,
            )
        )
    visible = [TI.c.state == DEFERRED, TI.c.dag_id.in_(sorted(dag_ids))]
    by_dag = connection.execute(
        sa.select(TI.c.dag_id, sa.func.count()).where(*visible).group_by(TI.c.dag_id).order_by(TI.c.dag_id)
    ).all()
    hosts = connection.scalars(
        sa.select(sa.func.coalesce(JOB.c.hostname, UNASSIGNED)).select_from(_joined()).where(*visible).distinct()
    ).all()
    return DeferredPage(rows, total, [(d, c) for d, c in by_dag], sorted(hosts), filters)


# -------------------------------------------------------------------------- triggerers
@dataclass
class Triggerer:
    """One triggerer job: its host, heartbeat, the triggers it holds, and what looks wrong."""

    job_id: int
    hostname: str
    state: str | None
    heartbeat: dt.datetime | None
    heartbeat_age: float | None
    held: int
    capacity: int
    queues: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)


def _warn(triggerers: list[Triggerer], threshold: float) -> None:
    """A triggerer holding triggers without a heartbeat for ``threshold`` s holds them for nobody;
    one holding far more than its live peers (over twice their median, and 50 more) is uneven."""
    for triggerer in triggerers:
        stale = triggerer.heartbeat_age is None or triggerer.heartbeat_age > threshold
        if triggerer.held and stale:
            age = "never" if triggerer.heartbeat_age is None else f"{triggerer.heartbeat_age:.0f} s ago"
            triggerer.warnings.append(
                f"holds {triggerer.held} trigger(s) but last heartbeat {age} (threshold {threshold:g} s): "
                "they wait until another triggerer adopts them"
            )
        if triggerer.held > triggerer.capacity:
            triggerer.warnings.append(f"holds more than its capacity ({triggerer.capacity})")
        peers = [other.held for other in triggerers if other is not triggerer and other.state == "running"]
        if peers:
            median = statistics.median(peers)
            if triggerer.held > 2 * median and triggerer.held - median >= 50:
                triggerer.warnings.append(f"holds far more than its peers (median {median:g})")


def triggerers(
    connection: sa.Connection, now: dt.datetime, *, capacity: int, threshold: float
) -> tuple[list[Triggerer], int]:
    """Live triggerer jobs and any job still holding triggers; and how many triggers no one holds.

    Live is Airflow's own test (``Job.is_alive``): ``running`` with a heartbeat within
    ``threshold`` seconds. A killed triggerer's job stays ``running`` in the table for ever, so
    without the heartbeat every triggerer that ever died would be listed; one that died holding
    triggers is still listed, with its warning, until another triggerer adopts them.
    """
    held: dict[int | None, int] = {
        triggerer_id: count
        for triggerer_id, count in connection.execute(
            sa.select(TRIGGER.c.triggerer_id, sa.func.count()).group_by(TRIGGER.c.triggerer_id)
        )
    }
    queues: dict[int, list[str]] = {}
    for triggerer_id, queue in connection.execute(
        sa.select(TRIGGER.c.triggerer_id, TRIGGER.c.queue)
        .where(TRIGGER.c.triggerer_id.is_not(None), TRIGGER.c.queue.is_not(None))
        .distinct()
    ):
        queues.setdefault(triggerer_id, []).append(queue)
    holding = [job_id for job_id in held if job_id is not None]
    jobs = connection.execute(
        sa.select(JOB.c.id, JOB.c.hostname, JOB.c.state, JOB.c.latest_heartbeat)
        .where(
            JOB.c.job_type == TRIGGERER_JOB,
            sa.or_(
                sa.and_(JOB.c.state == "running", JOB.c.latest_heartbeat > now - dt.timedelta(seconds=threshold)),
                JOB.c.id.in_(holding) if holding else sa.false(),
            ),
        )
        .order_by(JOB.c.hostname, JOB.c.id)
    ).all()
    rows = [
        Triggerer(
            job_id=job.id,
            hostname=job.hostname or "?",
            state=job.state,
            heartbeat=job.latest_heartbeat,
            heartbeat_age=(now - job.latest_heartbeat).total_seconds() if job.latest_heartbeat else None,
            held=held.get(job.id, 0),
            capacity=capacity,
            queues=sorted(queues.get(job.id, [])),
        )
        for job in jobs
    ]
    _warn(rows, threshold)
    return rows, held.get(None, 0)


# ---------------------------------------------------------------------------- watchers
@dataclass(frozen=True)
class Watcher:
    """One ``AssetWatcher``: its trigger, its asset, the asset's last event, the kit's watermark."""

    name: str
    asset: str
    asset_uri: str
    classpath: str
    wait: Wait
    triggerer: str | None
    dag_ids: tuple[str, ...]
    last_event: dt.datetime | None
    last_event_age: float | None
    watermark_age: float | None


def watched_dag_ids(connection: sa.Connection) -> set[str]:
    """DAGs scheduled on a watched asset (to decide which watchers a user sees)."""
    query = (
        sa.select(SCHEDULE_REFERENCE.c.dag_id)
        .join(ASSET_WATCHER, ASSET_WATCHER.c.asset_id == SCHEDULE_REFERENCE.c.asset_id)
        .distinct()
    )
    return set(connection.scalars(query))


def _has_table(connection: sa.Connection, name: str) -> bool:
    return sa.inspect(connection).has_table(name)


def _latest(connection: sa.Connection, query: sa.Select[Any]) -> dict[int, dt.datetime]:
    return {asset_id: moment for asset_id, moment in connection.execute(query) if moment is not None}


def watchers(connection: sa.Connection, dag_ids: Collection[str], now: dt.datetime) -> list[Watcher]:
    """Every watcher whose asset schedules at least one of ``dag_ids``, with its asset's news."""
    if not dag_ids:
        return []
    rows = connection.execute(
        sa.select(
            ASSET_WATCHER.c.name,
            ASSET.c.id.label("asset_id"),
            ASSET.c.name.label("asset"),
            ASSET.c.uri,
            TRIGGER.c.classpath,
            TRIGGER.c.kwargs,
            JOB.c.hostname,
        )
        .select_from(
            ASSET_WATCHER.join(ASSET, ASSET.c.id == ASSET_WATCHER.c.asset_id)
            .join(TRIGGER, TRIGGER.c.id == ASSET_WATCHER.c.trigger_id)
            .outerjoin(JOB, JOB.c.id == TRIGGER.c.triggerer_id)
        )
        .order_by(ASSET.c.name, ASSET_WATCHER.c.name)
    ).all()
    asset_ids = sorted({row.asset_id for row in rows})
    if not asset_ids:
        return []
    consumers: dict[int, list[str]] = {}
    for asset_id, dag_id in connection.execute(
        sa.select(SCHEDULE_REFERENCE.c.asset_id, SCHEDULE_REFERENCE.c.dag_id)
        .where(SCHEDULE_REFERENCE.c.asset_id.in_(asset_ids), SCHEDULE_REFERENCE.c.dag_id.in_(sorted(dag_ids)))
        .order_by(SCHEDULE_REFERENCE.c.dag_id)
    ):
        consumers.setdefault(asset_id, []).append(dag_id)
    events = _latest(
        connection,
        sa.select(ASSET_EVENT.c.asset_id, sa.func.max(ASSET_EVENT.c.timestamp))
        .where(ASSET_EVENT.c.asset_id.in_(asset_ids))
        .group_by(ASSET_EVENT.c.asset_id),
    )
    watermarks: dict[int, dt.datetime] = {}
    if _has_table(connection, "asset_state_store"):  # Airflow 3.3 and later
        watermarks = _latest(
            connection,
            sa.select(ASSET_STATE.c.asset_id, sa.func.max(ASSET_STATE.c.updated_at))
            .where(ASSET_STATE.c.asset_id.in_(asset_ids), ASSET_STATE.c.key.startswith(KEY_PREFIX + "/"))
            .group_by(ASSET_STATE.c.asset_id),
        )
    shown = []
    for row in rows:
        if row.asset_id not in consumers:
            continue
        last = events.get(row.asset_id)
        mark = watermarks.get(row.asset_id) if kind_of(row.classpath) else None
        shown.append(
            Watcher(
                name=row.name,
                asset=row.asset,
                asset_uri=row.uri,
                classpath=row.classpath,
                wait=describe(row.classpath, row.kwargs if kind_of(row.classpath) else None),
                triggerer=row.hostname,
                dag_ids=tuple(consumers[row.asset_id]),
                last_event=last,
                last_event_age=(now - last).total_seconds() if last else None,
                watermark_age=(now - mark).total_seconds() if mark else None,
            )
        )
    return shown


__all__: Sequence[str] = (
    "SORTS",
    "UNASSIGNED",
    "Deferred",
    "DeferredPage",
    "Filters",
    "Triggerer",
    "Watcher",
    "deferred",
    "deferred_dag_ids",
    "triggerers",
    "watched_dag_ids",
    "watchers",
)
