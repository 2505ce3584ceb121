"""Reading the Airflow metadata DB: read-only engines, the audit's queries, one DAG at a time.

The database is read with SQLAlchemy Core, never through Airflow's models, so the audit works
across Airflow 3.x schema versions and does not need Airflow importable at all when a URL is
given. Every session is read-only (SQLite opened ``mode=ro`` and ``query_only``; PostgreSQL and
MySQL in read-only transactions), and every query uses an index prefix on ``dag_id``.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import json
import os
import sqlite3
import zlib
from collections.abc import Collection, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import URL, Engine, make_url

from airflow_deferrable_kit.audit._advice import LISTENER_REFUSAL, Listeners
from airflow_deferrable_kit.audit._errors import AuditError, AuditUsageError
from airflow_deferrable_kit.audit._measure import WORKER_START, WORKER_STOP, Event, Try
from airflow_deferrable_kit.audit.schema import (
    DAG,
    IMPORT_ERROR,
    LOG,
    RESCHEDULE,
    SERIALIZED_DAG,
    TI,
    TIH,
    TRY_KEY,
)

UTC = dt.timezone.utc

#: Current tries in these states are over; others (running, deferred, up_for_reschedule, ...)
#: are still in progress and left out. Archived tries (``task_instance_history``) are all over.
FINISHED = ("success", "failed", "skipped", "up_for_retry")
#: Tries in these states never ran on a worker.
NEVER_RAN = ("upstream_failed", "removed")
SQL_ALCHEMY_CONN_ENV = "AIRFLOW__DATABASE__SQL_ALCHEMY_CONN"


#: The bundle Airflow puts its example DAGs in when ``[core] load_examples`` is on, which also
#: registers its example listener plugin (``plugins_manager.py``, 3.3.2).
EXAMPLES_BUNDLE = "example_dags"


def _same_try(a: sa.Table, b: sa.Table) -> sa.ColumnElement[bool]:
    return sa.and_(a.c.dag_id == b.c.dag_id, *(a.c[name] == b.c[name] for name in TRY_KEY))


def _in_window(
    table: sa.Table, dag_id: str, since: dt.datetime, until: dt.datetime, run_ids: Collection[str] | None
) -> list[sa.ColumnElement[bool]]:
    conditions = [table.c.dag_id == dag_id, table.c.end_date >= since, table.c.end_date < until]
    if run_ids:
        conditions.append(table.c.run_id.in_(sorted(run_ids)))
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


def tries_query(
    dag_id: str, since: dt.datetime, until: dt.datetime, run_ids: Collection[str] | None = None
) -> sa.CompoundSelect[Any]:
    """Every try of ``dag_id`` that ended in the window (of ``run_ids`` only, if given): current
    tries and archived ones."""
    reschedules = sa.select(sa.func.count()).where(RESCHEDULE.c.ti_id == TI.c.id).scalar_subquery()
    first_reschedule = sa.select(sa.func.min(RESCHEDULE.c.end_date)).where(RESCHEDULE.c.ti_id == TI.c.id)
    current = sa.select(
        *(TI.c[c.name] for c in TIH.columns),
        reschedules.label("reschedules"),
        first_reschedule.scalar_subquery().label("first_reschedule_end"),
    ).where(*_in_window(TI, dag_id, since, until, run_ids))
    # task_reschedule rows of earlier tries are deleted when a task is retried.
    archived = sa.select(
        *TIH.columns,
        sa.literal(0, sa.Integer).label("reschedules"),
        sa.null().label("first_reschedule_end"),
    ).where(*_in_window(TIH, dag_id, since, until, run_ids))
    return sa.union_all(current, archived)


def events_query(
    dag_id: str, since: dt.datetime, until: dt.datetime, run_ids: Collection[str] | None = None
) -> sa.CompoundSelect[Any]:
    """The worker start/stop ``log`` rows of those same tries (index ``idx_log_task_instance``)."""
    parts = []
    for table in (TI, TIH):
        parts.append(
            sa.select(*(LOG.c[name] for name in TRY_KEY), LOG.c.event, LOG.c.dttm, LOG.c.id)
            .select_from(LOG.join(table, _same_try(LOG, table)))
            .where(*_in_window(table, dag_id, since, until, run_ids), LOG.c.event.in_((WORKER_START, *WORKER_STOP)))
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


@contextlib.contextmanager
def metadata_connection(url: str) -> Iterator[sa.Connection]:
    """A read-only connection on an Airflow 3 metadata DB; database errors become :class:`AuditError`."""
    database = mask(url)
    engine = open_engine(url)
    try:
        try:
            connection = engine.connect()
        except sa.exc.DBAPIError as exc:
            raise AuditError(f"could not connect to {database}: {exc.orig}") from exc
        with connection:
            check_schema(connection, database)
            yield connection
    except sa.exc.DBAPIError as exc:
        raise AuditError(f"reading {database} failed: {exc.orig}") from exc
    finally:
        engine.dispose()


def all_dag_ids(connection: sa.Connection) -> list[str]:
    """Every DAG with a task instance, in order."""
    return sorted(connection.scalars(sa.select(TI.c.dag_id).distinct()))


def dag_tries(
    connection: sa.Connection,
    dag_id: str,
    since: dt.datetime,
    until: dt.datetime,
    run_ids: Collection[str] | None = None,
) -> Iterable[tuple[Try, list[Event]]]:
    """Each try of ``dag_id`` that ended in the window (of ``run_ids`` only, if given), with its
    worker start/stop events in order."""
    by_try: dict[tuple[str, str, int, int], list[tuple[dt.datetime, int, str]]] = {}
    for row in connection.execute(events_query(dag_id, since, until, run_ids)):
        if row.dttm is not None:
            key = (row.task_id, row.run_id, row.map_index, row.try_number)
            by_try.setdefault(key, []).append((row.dttm, row.id, row.event))
    for row in connection.execute(tries_query(dag_id, since, until, run_ids)):
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


# ------------------------------------------------------------- what else the DB shows
def _has(connection: sa.Connection, table: sa.Table) -> bool:
    """Whether ``table`` exists with every column the audit reads from it (optional tables)."""
    inspector = sa.inspect(connection)
    if not inspector.has_table(table.name):
        return False
    return {column.name for column in table.columns} <= {column["name"] for column in inspector.get_columns(table.name)}


@dataclass(frozen=True)
class DagShape:
    """What the audit needs of a DAG's structure: its root tasks, how many tasks, which are mapped."""

    roots: frozenset[str]
    tasks: int
    mapped: frozenset[str] = frozenset()
    #: task id -> the module of its operator class (``_task_module``), which tells this kit's
    #: sensors from the official ones of the same class name.
    modules: Mapping[str, str] = field(default_factory=dict)

    def starts_with(self, task_id: str) -> bool:
        """``task_id`` is the DAG's only first task and work follows it: the DAG only waits on it to start.

        Such a DAG can start on an event instead; a DAG with other first tasks (work that does not
        wait) or a mapped first task (several waits) cannot become one asset schedule as it is.
        """
        return self.roots == {task_id} and self.tasks > 1 and task_id not in self.mapped


def shape_from_serialized(data: Any) -> DagShape | None:
    """The shape of a serialized DAG (``serialized_dag.data``, format version 1 to 3); ``None`` if unreadable."""
    try:
        tasks = [task.get("__var", task) for task in data["dag"]["tasks"]]
        ids = {str(task["task_id"]) for task in tasks}
        downstream = {str(child) for task in tasks for child in task.get("downstream_task_ids") or ()}
        mapped = {str(task["task_id"]) for task in tasks if task.get("_is_mapped") or task.get("_needs_expansion")}
        modules = {str(task["task_id"]): str(task["_task_module"]) for task in tasks if task.get("_task_module")}
    except (KeyError, TypeError, AttributeError):
        return None
    return DagShape(frozenset(ids - downstream), len(ids), frozenset(mapped), modules) if ids else None


def dag_shape(connection: sa.Connection, dag_id: str) -> DagShape | None:
    """The shape of the newest serialized version of ``dag_id``; ``None`` when there is none to read."""
    if not _has(connection, SERIALIZED_DAG):
        return None
    row = connection.execute(
        sa.select(SERIALIZED_DAG.c.data, SERIALIZED_DAG.c.data_compressed)
        .where(SERIALIZED_DAG.c.dag_id == dag_id)
        .order_by(SERIALIZED_DAG.c.created_at.desc())
        .limit(1)
    ).first()
    if row is None:
        return None
    try:
        # As Airflow reads it: the compressed form when there is one (``data`` may then hold a JSON null).
        text = zlib.decompress(row.data_compressed) if row.data_compressed else row.data
        return shape_from_serialized(json.loads(text) if isinstance(text, (str, bytes)) else text)
    except (ValueError, zlib.error):
        return None


def listener_evidence(connection: sa.Connection) -> Listeners:
    """Whether the metadata DB shows listener plugins; unknown (``registered=None``) when it shows none.

    Two traces are conclusive: a DAG file Airflow refused because a task asked for
    ``end_from_trigger`` while listeners were registered (``import_error``), and live example
    DAGs (``[core] load_examples``, which registers Airflow's example listener). OpenLineage
    leaves no trace, so their absence proves nothing.
    """
    if _has(connection, IMPORT_ERROR):
        refused = connection.execute(
            sa.select(IMPORT_ERROR.c.filename).where(IMPORT_ERROR.c.stacktrace.contains(LISTENER_REFUSAL)).limit(1)
        ).first()
        if refused is not None:
            return Listeners(
                True, f"Airflow refused end_from_trigger with listeners in {refused.filename} (import_error)"
            )
    if _has(connection, DAG):
        example = connection.execute(
            sa.select(DAG.c.dag_id).where(DAG.c.bundle_name == EXAMPLES_BUNDLE, DAG.c.is_stale.is_not(True)).limit(1)
        ).first()
        if example is not None:
            return Listeners(
                True, "Airflow's example DAGs are loaded (load_examples=True), which registers its example listener"
            )
    return Listeners()
