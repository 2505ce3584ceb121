"""The tables of Airflow's metadata DB the kit reads (the audit and the Waits page), in one place.

Declared for SQLAlchemy Core, never through Airflow's models, with only the columns the kit
reads: every one exists throughout Airflow 3.x (the asset state store, 3.3 only, is read when
its table exists), so the readers work across schema versions and without Airflow importable.
"""

from __future__ import annotations

import datetime as dt
from typing import Any

import sqlalchemy as sa
from sqlalchemy.types import TypeDecorator

UTC = dt.timezone.utc


class UtcDateTime(TypeDecorator[dt.datetime]):
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
        sa.Column("start_date", UtcDateTime()),
        sa.Column("end_date", UtcDateTime()),
        sa.Column("queued_dttm", UtcDateTime()),
    ]


# ------------------------------------------------------------------------- task instances
TI = sa.Table(
    "task_instance",
    _md,
    sa.Column("id", sa.String),
    *_try_columns(),
    sa.Column("trigger_id", sa.Integer),
    sa.Column("trigger_timeout", UtcDateTime()),
)
#: The tries before the current one (the audit's columns only).
TIH = sa.Table("task_instance_history", _md, *_try_columns())
#: What names one try, after ``dag_id``.
TRY_KEY = ("task_id", "run_id", "map_index", "try_number")
RESCHEDULE = sa.Table(
    "task_reschedule",
    _md,
    sa.Column("id", sa.Integer),
    sa.Column("ti_id", sa.String),
    sa.Column("end_date", UtcDateTime()),
)
LOG = sa.Table(
    "log",
    _md,
    sa.Column("id", sa.Integer),
    sa.Column("dttm", UtcDateTime()),
    sa.Column("dag_id", sa.String),
    sa.Column("task_id", sa.String),
    sa.Column("run_id", sa.String),
    sa.Column("map_index", sa.Integer),
    sa.Column("try_number", sa.Integer),
    sa.Column("event", sa.String),
)

# ------------------------------------------------------------------------------- DAGs
SERIALIZED_DAG = sa.Table(
    "serialized_dag",
    _md,
    sa.Column("dag_id", sa.String),
    sa.Column("data", sa.Text),
    sa.Column("data_compressed", sa.LargeBinary),
    sa.Column("created_at", UtcDateTime()),
)
IMPORT_ERROR = sa.Table("import_error", _md, sa.Column("filename", sa.String), sa.Column("stacktrace", sa.Text))
DAG = sa.Table(
    "dag", _md, sa.Column("dag_id", sa.String), sa.Column("bundle_name", sa.String), sa.Column("is_stale", sa.Boolean)
)

# ------------------------------------------------------------------- triggers, triggerers
TRIGGER = sa.Table(
    "trigger",
    _md,
    sa.Column("id", sa.Integer),
    sa.Column("classpath", sa.String),
    sa.Column("kwargs", sa.Text),
    sa.Column("created_date", UtcDateTime()),
    sa.Column("triggerer_id", sa.Integer),
    sa.Column("queue", sa.String),
)
JOB = sa.Table(
    "job",
    _md,
    sa.Column("id", sa.Integer),
    sa.Column("job_type", sa.String),
    sa.Column("state", sa.String),
    sa.Column("hostname", sa.String),
    sa.Column("latest_heartbeat", UtcDateTime()),
)

# ------------------------------------------------------------------------------ assets
ASSET = sa.Table("asset", _md, sa.Column("id", sa.Integer), sa.Column("name", sa.String), sa.Column("uri", sa.String))
ASSET_WATCHER = sa.Table(
    "asset_watcher",
    _md,
    sa.Column("name", sa.String),
    sa.Column("asset_id", sa.Integer),
    sa.Column("trigger_id", sa.Integer),
)
ASSET_EVENT = sa.Table("asset_event", _md, sa.Column("asset_id", sa.Integer), sa.Column("timestamp", UtcDateTime()))
SCHEDULE_REFERENCE = sa.Table(
    "dag_schedule_asset_reference", _md, sa.Column("asset_id", sa.Integer), sa.Column("dag_id", sa.String)
)
#: Airflow 3.3 only: read when it exists.
ASSET_STATE = sa.Table(
    "asset_state_store",
    _md,
    sa.Column("asset_id", sa.Integer),
    sa.Column("key", sa.String),
    sa.Column("updated_at", UtcDateTime()),
)
