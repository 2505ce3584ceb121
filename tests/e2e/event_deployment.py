"""The Airflow the event-driven end-to-end tests run on, one module after another, and the HA one.

Two deployments of this shape run side by side, each in its own test process: the event
deployment (watchers, bursts) and the HA deployment (two triggerers, kills, an uneven host). A
PostgreSQL metadata DB (SQLite allows one writer; these tests run two triggerers), the event
DAGs' connections and every name their DAG files read from the environment, fixed when it
starts. Each module brings its own DAG files in (``install``), sets up the triggerers it needs
(``restart_triggerers``: how many, with which settings) and, when it is done, takes its watchers
out (``uninstall``: its DAGs paused, which Airflow turns into "no watcher" at the next parse, then
the files removed), so the next module starts from a deployment holding no watcher of another.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import tempfile
import urllib.error
import uuid
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from scripts import services
from scripts.airflow_local import LocalAirflow
from scripts.demo import batch_api
from tests.e2e.metadata import event_connections, new_database, query, running_triggerers, sqlalchemy_url, wait_for

HERE = Path(__file__).parent
#: The settings every triggerer of this deployment starts with unless a module says otherwise.
TRIGGERER_DEFAULTS = {
    "AIRFLOW__TRIGGERER__TRIGGERER_HEALTH_CHECK_THRESHOLD": "15",
    "AIRFLOW__TRIGGERER__CAPACITY": "1000",
}


@dataclass(frozen=True)
class Names:
    """Every bucket, table, topic and batch the event DAG files read from the environment, one
    set per module (``events``, ``kafka``, ``bursts``, ``ha``), unique to this deployment."""

    tag: str = field(default_factory=lambda: uuid.uuid4().hex[:8])

    def bucket(self, module: str) -> str:
        return f"adk-e2e-{module}-{self.tag}"

    def topic(self, module: str) -> str:
        return f"adk-e2e-{module}-{self.tag}"

    def table(self, module: str) -> str:
        return f"adk_e2e_{module}_{self.tag}"

    def batch(self, module: str) -> str:
        return f"{module}-{self.tag}"

    def env(self, flag: Path) -> dict[str, str]:
        return {
            "ADK_E2E_EVENTS_BUCKET": self.bucket("events"),
            "ADK_E2E_EVENTS_TABLE": self.table("events"),
            "ADK_E2E_EVENTS_BATCH": self.batch("events"),
            "ADK_E2E_EVENTS_TOPIC": self.topic("kafka"),
            "ADK_E2E_BURST_BUCKET": self.bucket("bursts"),
            "ADK_E2E_BURST_TABLE": self.table("bursts"),
            "ADK_E2E_BURST_TOPIC": self.topic("bursts"),
            "ADK_E2E_BURST_BATCH": self.batch("bursts"),
            "ADK_E2E_BURST_FLAG": str(flag),
            "ADK_E2E_HA_BUCKET": self.bucket("ha"),
            "ADK_E2E_HA_TABLE": self.table("ha"),
            "ADK_E2E_HA_BATCH": self.batch("ha"),
        }


@dataclass
class EventDeployment:
    airflow: LocalAirflow
    dsn: str  # the metadata DB
    postgres: services.Postgres
    s3: services.S3Server
    kafka: services.Kafka
    api_url: str
    names: Names
    dags: Path
    #: The file the burst DAGs' own wait reads (a user's wait module shipped with the DAGs).
    flag: Path

    def query(self, sql: str, *args: Any) -> list[tuple[Any, ...]]:
        return query(self.dsn, sql, *args)

    def s3_client(self) -> Any:
        import botocore.session

        return botocore.session.get_session().create_client(
            "s3", endpoint_url=self.s3.endpoint_url, region_name="us-east-1",
            aws_access_key_id="e2e", aws_secret_access_key="e2e",
        )  # fmt: skip

    def live_triggerers(self) -> list[int]:
        return running_triggerers(self.dsn)

    def restart_triggerers(self, count: int = 1, *, path: Path | None = None, **settings: str) -> list[int]:
        """Stop every triggerer, then start ``count`` with the deployment's settings plus
        ``settings`` (``AIRFLOW__TRIGGERER__...``), one after another so each job id maps to its
        process (``triggerer``, ``triggerer-2``, ...); their job ids in that order. ``path`` goes
        first on their ``PYTHONPATH`` (a host that differs from the rest, for this restart only)."""
        for name in [name for name in self.airflow.processes if name.startswith("triggerer")]:
            self.airflow.stop_component(name)
        wait_for("no triggerer alive", lambda: not self.live_triggerers() or None, timeout=60)
        self.airflow.extra_env = {**self.airflow.extra_env, **TRIGGERER_DEFAULTS, **settings}
        jobs: list[int] = []
        for number in range(1, count + 1):
            name = "triggerer" if number == 1 else f"triggerer-{number}"
            self.airflow.component_env = {**self.airflow.component_env, name: _first_on_path(path, self.airflow)}
            self.airflow.start_component("triggerer", name=name)
            job = wait_for(f"triggerer {number} job", lambda: [j for j in self.live_triggerers() if j not in jobs])[0]
            jobs.append(job)
        return jobs

    def install(self, *files: Path) -> None:
        for path in files:
            shutil.copy(path, self.dags / path.name)

    def uninstall(self, files: Iterable[Path], dag_ids: Iterable[str], assets: Iterable[str]) -> None:
        """Take a module's watchers out: pause its DAGs (at its file's next parse Airflow drops the
        watchers of an asset no unpaused DAG is scheduled on), wait until no trigger serves its
        assets, then remove its files."""
        for dag_id in dag_ids:
            with contextlib.suppress(urllib.error.HTTPError):  # a DAG that never parsed has none to pause
                self.airflow.api("PATCH", f"/api/v2/dags/{dag_id}", {"is_paused": True})
        names = list(assets)
        if names:
            wait_for(
                f"no watcher left on {names}",
                lambda: (
                    not self.query(
                        "SELECT 1 FROM asset_watcher w JOIN asset a ON a.id = w.asset_id WHERE a.name = ANY(%s)",
                        names,
                    )
                    or None
                ),
                timeout=120,
            )
        wait_for(
            "every trigger without a watcher or a task cleaned up",
            lambda: (
                not self.query(
                    "SELECT 1 FROM trigger t "
                    "WHERE NOT EXISTS (SELECT 1 FROM asset_watcher w WHERE w.trigger_id = t.id) "
                    "AND NOT EXISTS (SELECT 1 FROM task_instance ti WHERE ti.trigger_id = t.id)"
                )
                or None
            ),
            timeout=120,
        )
        for path in files:
            (self.dags / path.name).unlink(missing_ok=True)


def _first_on_path(path: Path | None, airflow: LocalAirflow) -> dict[str, str]:
    """The environment a component needs to find ``path`` first on its ``PYTHONPATH``."""
    if path is None:
        return {}
    return {"PYTHONPATH": os.pathsep.join([str(path), *filter(None, [airflow.env.get("PYTHONPATH")])])}


@contextlib.contextmanager
def event_deployment(
    postgres: services.Postgres, s3: services.S3Server, kafka: services.Kafka, *, processor_path: Path | None = None
) -> Iterator[EventDeployment]:
    """A deployment of this shape, started; ``processor_path`` goes first on the DAG processor's
    ``PYTHONPATH`` only (code shipped to the DAG processor and to no triggerer)."""
    names = Names()
    dsn = new_database(postgres, "airflow_events")
    dags = Path(tempfile.mkdtemp(prefix="adk-event-dags-"))
    flag = dags / "ready.flag"
    with contextlib.ExitStack() as stack:
        stack.callback(shutil.rmtree, dags, ignore_errors=True)
        api_url = stack.enter_context(batch_api())
        kafka_connection = {"conn_type": "kafka", "extra": {"bootstrap.servers": kafka.bootstrap_servers}}
        airflow = LocalAirflow(
            dags_folder=dags,
            sql_alchemy_conn=sqlalchemy_url(dsn),
            extra_env={
                **event_connections(api_url, s3, postgres),
                "AIRFLOW_CONN_ADK_E2E_KAFKA": json.dumps(kafka_connection),
                **names.env(flag),
                **TRIGGERER_DEFAULTS,
                # A module's DAGs are parsed within seconds of being copied in, and re-parsed
                # within seconds of being paused (which is what takes their watchers out).
                "AIRFLOW__DAG_PROCESSOR__MIN_FILE_PROCESS_INTERVAL": "5",
                # The user's own wait module of the burst DAGs, shipped with the DAGs to every component.
                "PYTHONPATH": os.pathsep.join([str(dags), *filter(None, [os.environ.get("PYTHONPATH")])]),
            },
        )
        airflow.component_env = {"dag-processor": _first_on_path(processor_path, airflow)}
        stack.callback(shutil.rmtree, airflow.home, ignore_errors=True)
        stack.callback(airflow.stop)
        airflow.start()
        yield EventDeployment(airflow, dsn, postgres, s3, kafka, api_url, names, dags, flag)
