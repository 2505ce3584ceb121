"""Metadata databases for the audit: Airflow 3.3.2's own schema, on SQLite and on PostgreSQL.

The schema comes from Airflow's models (``Base.metadata``), so the audit's hand-written column
list is checked against the real one. Each test gets a fresh copy of an empty template: a file
copy for SQLite, ``CREATE DATABASE ... TEMPLATE`` for PostgreSQL.
"""

from __future__ import annotations

import datetime as dt
import json
import shutil
import uuid
import zlib
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa

from scripts import services

UTC = dt.timezone.utc


def airflow_metadata() -> sa.MetaData:
    """Airflow's full metadata schema (every model imported)."""
    import airflow.models
    from airflow.models.base import Base

    airflow.models.import_all_models()
    return Base.metadata


@pytest.fixture(scope="session")
def sqlite_template(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("audit-template") / "airflow.db"
    engine = sa.create_engine(f"sqlite:///{path}")
    airflow_metadata().create_all(engine)
    engine.dispose()
    return path


@pytest.fixture(scope="session")
def postgres_template(postgres_server: services.Postgres) -> str:
    name = f"adk_audit_template_{uuid.uuid4().hex[:8]}"
    postgres_server.psql(f"CREATE DATABASE {name}")
    engine = sa.create_engine(f"postgresql+psycopg2://postgres@127.0.0.1:{postgres_server.port}/{name}")
    airflow_metadata().create_all(engine)
    engine.dispose()
    return name


@dataclass
class MetadataDB:
    """A writable handle on a fresh metadata DB; the audit gets ``url`` and opens it read-only."""

    url: str
    engine: sa.Engine
    tables: dict[str, sa.Table] = field(default_factory=dict)
    _runs: set[tuple[str, str]] = field(default_factory=set)
    _dags: set[str] = field(default_factory=set)
    _versions: dict[str, int] = field(default_factory=dict)

    def __post_init__(self) -> None:
        # Airflow's own table objects: their Python-side defaults (ids, run_after, ...) apply.
        metadata = airflow_metadata()
        for name in (
            "dag_run",
            "task_instance",
            "task_instance_history",
            "task_reschedule",
            "log",
            "dag_bundle",
            "dag",
            "dag_version",
            "serialized_dag",
            "import_error",
        ):
            self.tables[name] = metadata.tables[name]

    def _insert(self, table: str, **values: Any) -> None:
        with self.engine.begin() as connection:
            connection.execute(self.tables[table].insert().values(**values))

    def run(self, dag_id: str, run_id: str, *, run_after: dt.datetime | None = None, **values: Any) -> None:
        """A manual ``dag_run`` row, once per run id (``values``: more of its columns)."""
        if (dag_id, run_id) not in self._runs:
            self._insert(
                "dag_run",
                dag_id=dag_id,
                run_id=run_id,
                run_type="manual",
                logical_date=None,
                data_interval_end=None,
                run_after=run_after or dt.datetime.now(UTC),
                **values,
            )
            self._runs.add((dag_id, run_id))

    def attempt(
        self,
        dag_id: str,
        task_id: str,
        *,
        operator: str,
        start: dt.datetime | None,
        end: dt.datetime | None,
        run_id: str = "run_1",
        state: str = "success",
        try_number: int = 1,
        map_index: int = -1,
        queued: dt.datetime | None = None,
        custom_operator_name: str | None = None,
        events: Sequence[tuple[str, dt.datetime]] = (),
        reschedules: Sequence[dt.datetime] = (),
        archived: bool = False,
    ) -> None:
        """One try: a task_instance row (or, ``archived``, a task_instance_history row), its
        ``log`` state changes and, as Airflow 3.3.2 writes them, its task_reschedule rows."""
        self.run(dag_id, run_id, run_after=start or end)
        common: dict[str, Any] = {
            "dag_id": dag_id,
            "task_id": task_id,
            "run_id": run_id,
            "map_index": map_index,
            "try_number": try_number,
            "state": state,
            "operator": operator,
            "custom_operator_name": custom_operator_name,
            "start_date": start,
            "end_date": end,
            "duration": (end - start).total_seconds() if start and end else None,
            "queued_dttm": queued,
            "pool": "default_pool",
            "pool_slots": 1,
        }
        ti_id = uuid.uuid4()
        if archived:
            self._insert("task_instance_history", task_instance_id=ti_id, **common)
        else:
            self._insert("task_instance", id=ti_id, **common)
        for end_of_poke in reschedules:
            # 3.3.2 stamps start_date when the server handles the reschedule: the end of the poke.
            self._insert(
                "task_reschedule",
                ti_id=ti_id,
                start_date=end_of_poke,
                end_date=end_of_poke,
                duration=0,
                reschedule_date=end_of_poke + dt.timedelta(minutes=5),
            )
        for event, at in events:
            self._insert(
                "log",
                dttm=at,
                dag_id=dag_id,
                task_id=task_id,
                run_id=run_id,
                map_index=map_index,
                try_number=try_number,
                event=event,
                extra='{"host_name": "worker-1"}',
            )

    def dag(self, dag_id: str, *, bundle: str = "dags-folder", stale: bool = False) -> None:
        """A ``dag`` row (and its bundle), as the dag-processor writes it."""
        if bundle not in {name for (name,) in self._select("dag_bundle", "name")}:
            self._insert("dag_bundle", name=bundle)
        self._insert(
            "dag",
            dag_id=dag_id,
            bundle_name=bundle,
            is_stale=stale,
            max_active_tasks=16,
            max_consecutive_failed_dag_runs=0,
            has_task_concurrency_limits=False,
        )
        self._dags.add(dag_id)

    def serialized(
        self,
        dag: Any,
        *,
        compressed: bool = False,
        at: dt.datetime | None = None,
        modules: dict[str, str] | None = None,
    ) -> None:
        """A new version of ``dag`` (an ``airflow.sdk.DAG``) serialized as Airflow serializes it,
        stored as the dag-processor stores it (``[core] compress_serialized_dags``: zlib).

        ``modules`` (task id -> module) records a task as Airflow records an operator class of
        that module (``_task_module``): an official provider's sensor without installing it.
        """
        from airflow.serialization.serialized_objects import DagSerialization

        if dag.dag_id not in self._dags:
            self.dag(dag.dag_id)
        data = DagSerialization.to_dict(dag)
        for task in data["dag"]["tasks"]:
            fields = task.get("__var", task)
            if modules and fields["task_id"] in modules:
                fields["_task_module"] = modules[fields["task_id"]]
        version = uuid.uuid4()
        number = self._versions[dag.dag_id] = self._versions.get(dag.dag_id, 0) + 1
        created = at or dt.datetime.now(UTC)
        self._insert("dag_version", id=version, dag_id=dag.dag_id, version_number=number, created_at=created)
        self._insert(
            "serialized_dag",
            id=uuid.uuid4(),
            dag_id=dag.dag_id,
            dag_hash=uuid.uuid4().hex,
            dag_version_id=version,
            created_at=created,
            last_updated=created,
            **(
                {"data": None, "data_compressed": zlib.compress(json.dumps(data).encode())}
                if compressed
                else {"data": data}
            ),
        )

    def import_error(self, filename: str, stacktrace: str) -> None:
        self._insert("import_error", filename=filename, bundle_name="dags-folder", stacktrace=stacktrace)

    def _select(self, table: str, column: str) -> list[tuple[Any, ...]]:
        with self.engine.connect() as connection:
            return [tuple(row) for row in connection.execute(sa.select(self.tables[table].c[column]))]

    def noise(self, at: dt.datetime) -> None:
        """Log rows that are not worker state changes (REST calls, DAG-level events)."""
        self._insert("log", dttm=at, dag_id="etl", event="trigger_dag_run", extra="{}")
        self._insert("log", dttm=at, event="cli_scheduler")


@pytest.fixture(params=["sqlite", "postgresql"])
def metadata_db(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[MetadataDB]:
    if request.param == "sqlite":
        path = tmp_path / "airflow.db"
        shutil.copy(request.getfixturevalue("sqlite_template"), path)
        url = f"sqlite:///{path}"
        engine = sa.create_engine(url)
        yield MetadataDB(url, engine)
        engine.dispose()
        return
    server: services.Postgres = request.getfixturevalue("postgres_server")
    template = request.getfixturevalue("postgres_template")
    name = f"adk_audit_{uuid.uuid4().hex[:10]}"
    server.psql(f"CREATE DATABASE {name} TEMPLATE {template}")
    url = f"postgresql+psycopg2://postgres@127.0.0.1:{server.port}/{name}"
    engine = sa.create_engine(url)
    try:
        yield MetadataDB(url, engine)
    finally:
        engine.dispose()
        server.psql(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")


@pytest.fixture
def sqlite_db(sqlite_template: Path, tmp_path: Path) -> Iterator[MetadataDB]:
    """SQLite only, for tests about the command line rather than the SQL dialect."""
    path = tmp_path / "airflow.db"
    shutil.copy(sqlite_template, path)
    engine = sa.create_engine(f"sqlite:///{path}")
    yield MetadataDB(f"sqlite:///{path}", engine)
    engine.dispose()
