"""A real metadata DB (SQLite and PostgreSQL, Airflow 3.3.2's schema) behind the Waits page.

Airflow's own ORM is pointed at the test database for the test (the page reads through it, as
on the api-server), with :class:`~tests.integration.plugins.auth.NarrowAuthManager` as the auth
manager and real JWTs. Deferred tasks come from real deferrals: the sensor's ``execute()`` raises
Airflow's ``TaskDeferred`` and :meth:`Deployment.defer` stores it as the Execution API does in
3.3.2 (``execution_api/routes/task_instances.py``): a ``trigger`` row with the kwargs serialized
by the Task SDK's serde and JSON-dumped, and the task instance ``deferred`` with its trigger id,
``trigger_timeout`` (now + the deferral's timeout) and next method.
"""

from __future__ import annotations

import datetime as dt
import json
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import pytest
import sqlalchemy as sa
from fastapi import FastAPI
from fastapi.testclient import TestClient

from tests.integration.audit.conftest import (  # noqa: F401 (fixtures)
    MetadataDB,
    airflow_metadata,
    metadata_db,
    postgres_template,
    sqlite_template,
)
from tests.integration.plugins import auth

UTC = dt.timezone.utc


@dataclass
class Deployment:
    """The test's metadata DB as the api-server sees it, with ways to fill it."""

    db: MetadataDB
    tables: dict[str, sa.Table] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.tables = dict(airflow_metadata().tables)

    def _insert(self, table: str, **values: Any) -> Any:
        with self.db.engine.begin() as connection:
            result = connection.execute(self.tables[table].insert().values(**values))
            return result.inserted_primary_key[0] if result.inserted_primary_key else None

    def dag(self, dag_id: str) -> None:
        if dag_id not in self.db._dags:
            self.db.dag(dag_id)

    def run(self, dag_id: str, run_id: str) -> None:
        self.dag(dag_id)
        self.db.run(dag_id, run_id, state="running")

    def triggerer(self, hostname: str, *, heartbeat_age: float = 1.0, state: str = "running") -> int:
        """A triggerer job row, as ``airflow triggerer`` writes it."""
        now = dt.datetime.now(UTC)
        return int(
            self._insert(
                "job",
                job_type="TriggererJob",
                state=state,
                hostname=hostname,
                start_date=now - dt.timedelta(hours=1),
                latest_heartbeat=now - dt.timedelta(seconds=heartbeat_age),
            )
        )

    def trigger(
        self, classpath: str, kwargs: dict[str, Any], *, triggerer_id: int | None = None, created: dt.datetime
    ) -> int:
        """A trigger row as the Execution API writes it (3.3.2): serde-serialized, JSON-dumped."""
        from airflow.sdk.serde import serialize

        return int(
            self._insert(
                "trigger",
                classpath=classpath,
                kwargs=json.dumps(serialize(kwargs)),
                created_date=created,
                triggerer_id=triggerer_id,
            )
        )

    def defer(
        self,
        task: Any,
        *,
        run_id: str = "run_1",
        map_index: int = -1,
        triggerer_id: int | None = None,
        deferred_ago: float = 60.0,
    ) -> Any:
        """Run ``task.execute()`` until it defers and store the deferral as if it had happened
        ``deferred_ago`` seconds ago; returns the trigger.

        Every moment of the deferral moves back together: the trigger's creation, Airflow's
        trigger timeout and the kit's own absolute ``deadline`` in the kwargs (set from the
        clock when ``execute()`` ran), so the two budgets keep the order they have in a real
        deployment (the kit's deadline first, Airflow's backstop after it).
        """
        from airflow.sdk.exceptions import TaskDeferred

        try:
            task.execute({})
        except TaskDeferred as deferral:
            deferred = deferral
        else:  # pragma: no cover - a test set it up to defer
            raise AssertionError(f"{task.task_id} did not defer")
        dag_id = task.dag_id
        self.run(dag_id, run_id)
        now = dt.datetime.now(UTC)
        created = now - dt.timedelta(seconds=deferred_ago)
        classpath, kwargs = deferred.trigger.serialize()
        if isinstance(kwargs.get("deadline"), str):
            deadline = dt.datetime.fromisoformat(kwargs["deadline"]) - dt.timedelta(seconds=deferred_ago)
            kwargs = {**kwargs, "deadline": deadline.isoformat()}
        trigger_id = self.trigger(classpath, kwargs, triggerer_id=triggerer_id, created=created)
        timeout = deferred.timeout
        if isinstance(timeout, (int, float)):
            timeout = dt.timedelta(seconds=timeout)
        self._insert(
            "task_instance",
            id=uuid.uuid4(),
            dag_id=dag_id,
            task_id=task.task_id,
            run_id=run_id,
            map_index=map_index,
            try_number=1,
            state="deferred",
            operator=type(task).__name__,
            pool="default_pool",
            pool_slots=1,
            start_date=created,
            trigger_id=trigger_id,
            trigger_timeout=created + timeout if timeout is not None else None,
            next_method=deferred.method_name,
        )
        return deferred.trigger

    def resume(self, dag_id: str, task_id: str) -> None:
        """What the triggerer and scheduler do when a trigger fires: the task leaves ``deferred``."""
        ti = self.tables["task_instance"]
        with self.db.engine.begin() as connection:
            connection.execute(
                ti.update()
                .where(ti.c.dag_id == dag_id, ti.c.task_id == task_id)
                .values(state="scheduled", trigger_id=None, next_method=None)
            )

    def watcher(
        self,
        *,
        asset: str,
        name: str,
        classpath: str,
        kwargs: dict[str, Any],
        dag_id: str,
        triggerer_id: int | None = None,
        event_ago: float | None = None,
        watermark_ago: float | None = None,
    ) -> int:
        """An AssetWatcher as the dag-processor stores it, with its asset's last event and state."""
        now = dt.datetime.now(UTC)
        self.dag(dag_id)
        asset_id = int(self._insert("asset", name=asset, uri=asset, group="asset", extra={}))
        trigger_id = self.trigger(classpath, kwargs, triggerer_id=triggerer_id, created=now)
        self._insert("asset_watcher", name=name, asset_id=asset_id, trigger_id=trigger_id)
        self._insert("dag_schedule_asset_reference", asset_id=asset_id, dag_id=dag_id)
        if event_ago is not None:
            self._insert("asset_event", asset_id=asset_id, timestamp=now - dt.timedelta(seconds=event_ago), extra={})
        if watermark_ago is not None:
            self._insert(
                "asset_state_store",
                asset_id=asset_id,
                key="airflow_deferrable_kit/s3/abc",
                value="{}",
                updated_at=now - dt.timedelta(seconds=watermark_ago),
            )
        return asset_id

    def client(self, username: str | None, role: str = "viewer") -> TestClient:
        """A client of the plugin's app as the api-server mounts it, logged in as ``username``."""
        from airflow.api_fastapi.app import get_auth_manager
        from airflow.api_fastapi.auth.managers.simple.user import SimpleAuthManagerUser

        from airflow_deferrable_kit.plugins.waits import WaitsPlugin

        host = FastAPI()
        for entry in WaitsPlugin.fastapi_apps:
            host.mount(entry["url_prefix"], entry["app"])
        client = TestClient(host)
        if username is not None:
            token = get_auth_manager().generate_jwt(SimpleAuthManagerUser(username=username, role=role))
            client.headers["Authorization"] = f"Bearer {token}"
        return client


@pytest.fixture
def deployment(metadata_db: MetadataDB, monkeypatch: pytest.MonkeyPatch) -> Iterator[Deployment]:  # noqa: F811
    """Airflow's ORM on the test DB and the narrowing auth manager, for the test only."""
    from airflow import settings
    from airflow.api_fastapi import app as api_app

    monkeypatch.setenv("AIRFLOW__DATABASE__SQL_ALCHEMY_CONN", metadata_db.url)
    monkeypatch.setenv("AIRFLOW__CORE__AUTH_MANAGER", auth.CLASSPATH)
    monkeypatch.setenv("AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_USERS", "admin:admin,narrow:viewer,outsider:viewer")
    monkeypatch.setenv("AIRFLOW__API_AUTH__JWT_SECRET", "waits-page-tests")
    settings.configure_vars()
    settings.reconfigure_orm()
    api_app._AuthManagerState.instance = None
    api_app.init_auth_manager()
    try:
        yield Deployment(metadata_db)
    finally:
        api_app._AuthManagerState.instance = None
        monkeypatch.undo()
        settings.configure_vars()
        settings.reconfigure_orm()
