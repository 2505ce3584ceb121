"""What the end-to-end tests share: a PostgreSQL metadata DB of their own, reading it, waiting.

Each Airflow that runs more than one triggerer (or event watchers) gets a database of its own
on the session's PostgreSQL server (SQLite allows one writer). The tests read the truth from it
(trigger rows, triggerer jobs, asset events and the runs they started) rather than from logs.
"""

from __future__ import annotations

import json
import time
import urllib.request
import uuid
from collections import Counter
from collections.abc import Callable
from typing import Any, TypeVar

import psycopg2

from scripts import services
from scripts.demo import API_TOKEN

T = TypeVar("T")


def wait_for(what: str, probe: Callable[[], T], *, timeout: float = 120, step: float = 0.5) -> T:
    """``probe()``'s first truthy value; fails naming ``what`` after ``timeout`` seconds."""
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        value = probe()
        if value:
            return value
        time.sleep(step)
    raise AssertionError(f"{what} did not happen within {timeout:.0f}s")


def new_database(postgres_server: services.Postgres, prefix: str) -> str:
    """A fresh database named ``<prefix>_<random>`` on the session server; its DSN."""
    database = f"{prefix}_{uuid.uuid4().hex[:8]}"
    postgres_server.psql(f"CREATE DATABASE {database}")
    return f"postgresql://postgres@127.0.0.1:{postgres_server.port}/{database}"


def sqlalchemy_url(dsn: str) -> str:
    """The DSN as Airflow's ``sql_alchemy_conn`` takes it (psycopg2 driver)."""
    return dsn.replace("postgresql://", "postgresql+psycopg2://")


def query(dsn: str, sql: str, *args: Any) -> list[tuple[Any, ...]]:
    conn = psycopg2.connect(dsn)
    try:
        with conn.cursor() as cur:
            cur.execute(sql, args)
            return list(cur.fetchall())
    finally:
        conn.close()


def execute(dsn: str, sql: str, *args: Any) -> None:
    """Run one statement and commit it."""
    conn = psycopg2.connect(dsn)
    try:
        with conn, conn.cursor() as cur:
            cur.execute(sql, args)
    finally:
        conn.close()


def items_of(payload: Any) -> list[Any]:
    """What one asset event's payload carries: the items of an item event, else the payload itself."""
    if isinstance(payload, dict) and isinstance(payload.get("items"), list):
        return list(payload["items"])
    return [payload]


#: Seconds since its last heartbeat (every 2 s here) after which a running triggerer job is dead:
#: the largest ``triggerer_health_check_threshold`` the tests set, as Airflow itself judges it.
HEARTBEAT_WITHIN = 30


def running_triggerers(dsn: str) -> list[int]:
    """The ids of the triggerer jobs alive now, oldest first: running, with a heartbeat in the
    last ``HEARTBEAT_WITHIN`` seconds. A killed triggerer's job stays ``running`` in the table for
    ever; a live one's heartbeat can be late by many seconds on a busy machine."""
    rows = query(
        dsn,
        "SELECT id FROM job WHERE job_type = 'TriggererJob' AND state = 'running' "
        f"AND latest_heartbeat > now() - interval '{HEARTBEAT_WITHIN} seconds' ORDER BY id",
    )
    return [int(row[0]) for row in rows]


def outdate_heartbeat(dsn: str, job_id: int) -> None:
    """Make a killed triggerer's job look dead to the others now, not a health-check threshold later.

    What Airflow judges (``latest_heartbeat`` older than ``triggerer_health_check_threshold``) is
    made true at once: the threshold can stay large enough that a live triggerer starved of CPU
    on a busy machine is never taken for dead, and no test waits it out. Only for a job whose
    process the test has seen exit.
    """
    execute(dsn, "UPDATE job SET latest_heartbeat = latest_heartbeat - interval '1 hour' WHERE id = %s", job_id)


def watcher_holders(dsn: str) -> Counter[int | None]:
    """How many asset watchers' triggers each triggerer job holds (``None``: not assigned)."""
    rows = query(dsn, "SELECT t.triggerer_id FROM trigger t JOIN asset_watcher w ON w.trigger_id = t.id")
    return Counter(None if row[0] is None else int(row[0]) for row in rows)


def watermarks(dsn: str, *assets: str) -> dict[str, Any]:
    """Each asset's saved watermark (the state inside the kit's envelope), of ``assets`` or of all."""
    rows = query(
        dsn,
        "SELECT a.name, s.value FROM asset_state_store s JOIN asset a ON a.id = s.asset_id "
        "WHERE s.key LIKE 'airflow_deferrable_kit/%%'",
    )
    return {
        str(name): (value if isinstance(value, dict) else json.loads(value))["state"]
        for name, value in rows
        if not assets or name in assets
    }


def events_in_runs(dsn: str, dag_id: str) -> Counter[int]:
    """How many DAG runs of ``dag_id`` each asset event is in."""
    rows = query(
        dsn,
        "SELECT l.event_id FROM dagrun_asset_event l JOIN dag_run r ON r.id = l.dag_run_id WHERE r.dag_id = %s",
        dag_id,
    )
    return Counter(int(row[0]) for row in rows)


def event_connections(api_url: str, s3_server: services.S3Server, postgres_server: services.Postgres) -> dict[str, str]:
    """The environment defining the event DAGs' connections: S3, the Postgres server, the batch API."""
    host, port = api_url.removeprefix("http://").split(":")
    connections = {
        "ADK_E2E_S3": {"conn_type": "aws", "login": "e2e", "password": "e2e",
                       "extra": {"region_name": "us-east-1", "endpoint_url": s3_server.endpoint_url}},
        "ADK_E2E_PG": {"conn_type": "postgres", "host": "127.0.0.1", "port": postgres_server.port,
                       "login": "postgres", "schema": "postgres"},
        "ADK_E2E_API": {"conn_type": "http", "host": host, "port": int(port), "schema": "http",
                        "password": API_TOKEN, "extra": {"auth_type": "bearer"}},
    }  # fmt: skip
    return {f"AIRFLOW_CONN_{name}": json.dumps(conn) for name, conn in connections.items()}


def set_batch(api_url: str, batch: str, state: str) -> None:
    """Set a batch's state on the demo batch API (what the HTTP watchers poll)."""
    request = urllib.request.Request(
        f"{api_url}/v1/batches/{batch}",
        data=json.dumps({"state": state}).encode(),
        method="PUT",
        headers={"Content-Type": "application/json", "Authorization": f"Bearer {API_TOKEN}"},
    )
    with urllib.request.urlopen(request, timeout=10):
        pass
