"""What the compose file sets up for the examples, run against the real local services.

Without Docker the containers cannot run here, but what they run can: the postgres-demo schema
goes into a throw-away PostgreSQL database, the s3-init script runs against the moto server,
and the kit's triggers then wait through the ``warehouse`` and ``s3_demo`` connections as
the compose file defines them (only host, port and database moved to the local services).
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import uuid
from collections.abc import AsyncIterator
from typing import Any

import asyncpg
import boto3
import botocore.config
import pytest

from airflow_deferrable_kit.testing import run_trigger_payload
from airflow_deferrable_kit.triggers.postgres import PostgresBatchMarkerTrigger
from airflow_deferrable_kit.triggers.s3 import S3KeyTrigger
from scripts import services
from tests.release.compose_file import connections, environment, load_compose

DemoDb = tuple[str, asyncpg.Connection]


def compose_services() -> dict[str, Any]:
    return load_compose()["services"]


def schema_sql() -> str:
    """The SQL the postgres-demo container runs at its first start."""
    compose = load_compose()
    (mount,) = compose["services"]["postgres-demo"]["configs"]
    assert mount["target"].startswith("/docker-entrypoint-initdb.d/") and mount["target"].endswith(".sql")
    return str(compose["configs"][mount["source"]]["content"])


def define(monkeypatch: pytest.MonkeyPatch, conn_id: str, **changes: Any) -> str:
    conn = connections(compose_services()["triggerer-1"])[conn_id]
    conn.update(changes)
    monkeypatch.setenv(f"AIRFLOW_CONN_{conn_id.upper()}", json.dumps(conn))
    return conn_id


# ------------------------------------------------------------------------------ Postgres
@pytest.fixture
async def warehouse_db(postgres_server: services.Postgres) -> AsyncIterator[DemoDb]:
    """A fresh database with the postgres-demo schema applied; yields (name, session)."""
    name = f"adk_compose_{uuid.uuid4().hex[:10]}"
    admin = await asyncpg.connect(postgres_server.dsn)
    await admin.execute(f'CREATE DATABASE "{name}"')
    session = await asyncpg.connect(postgres_server.dsn.rsplit("/", 1)[0] + f"/{name}")
    try:
        await session.execute(schema_sql())
        yield name, session
    finally:
        await session.close()
        await admin.execute(f'DROP DATABASE "{name}" WITH (FORCE)')
        await admin.close()


@pytest.fixture
def warehouse(monkeypatch: pytest.MonkeyPatch, postgres_server: services.Postgres, warehouse_db: DemoDb) -> str:
    """The compose ``warehouse`` connection, moved to the throw-away cluster (trusts "postgres")."""
    return define(
        monkeypatch, "warehouse", host="127.0.0.1", port=postgres_server.port, schema=warehouse_db[0], login="postgres"
    )


def orders_marker(conn_id: str, batch_date: str, **kwargs: Any) -> PostgresBatchMarkerTrigger:
    """The declarative wait of dags/example_postgres.py (``ds`` rendered)."""
    options: dict[str, Any] = {
        "postgres_conn_id": conn_id,
        "table": "etl.batch_markers",
        "match": {"batch_id": "orders", "batch_date": batch_date},
        "status_column": "status",
        "ready_values": ["done"],
        "failed_values": ["failed", "aborted"],
        "order_by": ["created_at desc"],
        "notify_channel": "batch_markers",
        "poll_interval": 0.05,
        **kwargs,
    }
    return PostgresBatchMarkerTrigger(**options)


def clicks_loaded(conn_id: str, run_date: str) -> PostgresBatchMarkerTrigger:
    """The custom-SQL wait of dags/example_postgres.py (``ds`` rendered)."""
    options: dict[str, Any] = {
        "postgres_conn_id": conn_id,
        "sql": "SELECT state, row_count, finished_at FROM etl.load_runs WHERE dataset = $1 AND run_date = $2 "
        "ORDER BY finished_at DESC NULLS FIRST",
        "parameters": ["clicks", run_date],
        "success": [{"column": "state", "equals": "succeeded"}],
        "failure": [{"column": "state", "in": ["failed", "cancelled"]}],
        "poll_interval": 0.05,
    }
    return PostgresBatchMarkerTrigger(**options)


async def test_schema_applies_twice_and_notifies_on_every_marker_write(warehouse_db: DemoDb) -> None:
    _, session = warehouse_db
    await session.execute(schema_sql())  # idempotent: a re-run does not fail
    notified: asyncio.Queue[str] = asyncio.Queue()

    def on_notify(conn: Any, pid: int, channel: str, payload: str) -> None:
        notified.put_nowait(f"{channel}:{payload}")

    await session.add_listener("batch_markers", on_notify)
    await session.execute("INSERT INTO etl.batch_markers (batch_id, batch_date) VALUES ('orders', '2024-01-01')")
    await session.execute("UPDATE etl.batch_markers SET status = 'done' WHERE batch_id = 'orders'")
    got = [await asyncio.wait_for(notified.get(), 30) for _ in range(2)]
    assert got == ["batch_markers:orders", "batch_markers:orders"]


async def test_newest_done_marker_ends_the_wait_with_the_row(warehouse_db: DemoDb, warehouse: str) -> None:
    _, session = warehouse_db
    await session.execute(
        """INSERT INTO etl.batch_markers (batch_id, batch_date, status, meta, created_at) VALUES
           ('orders', '2024-01-01', 'failed', NULL, now() - interval '1 hour'),
           ('orders', '2024-01-01', 'done', '{"files": 3}', now()),
           ('orders', '2024-01-02', 'running', NULL, now())"""
    )
    payload = await run_trigger_payload(orders_marker(warehouse, "2024-01-01"))
    assert payload["status"] == "success"
    row = payload["row"]
    assert (row["batch_id"], row["status"], row["meta"]) == ("orders", "done", {"files": 3})
    assert str(row["batch_date"]).startswith("2024-01-01")


async def test_aborted_marker_fails_the_wait(warehouse_db: DemoDb, warehouse: str) -> None:
    _, session = warehouse_db
    await session.execute(
        "INSERT INTO etl.batch_markers (batch_id, batch_date, status) VALUES ('orders', '2024-01-03', 'aborted')"
    )
    payload = await run_trigger_payload(orders_marker(warehouse, "2024-01-03"))
    assert payload["status"] == "error"


async def test_load_runs_custom_sql_wait(warehouse_db: DemoDb, warehouse: str) -> None:
    _, session = warehouse_db
    await session.execute(
        "INSERT INTO etl.load_runs (dataset, run_date, state, row_count, finished_at) "
        "VALUES ('clicks', '2024-01-01', 'succeeded', 1234, now())"
    )
    payload = await run_trigger_payload(clicks_loaded(warehouse, "2024-01-01"))
    assert payload["status"] == "success"
    assert (payload["row"]["state"], payload["row"]["row_count"]) == ("succeeded", 1234)


# ------------------------------------------------------------------------------------ S3
def run_s3_init(endpoint_url: str) -> str:
    """Run the s3-init service's script, with its environment, against ``endpoint_url``."""
    service = compose_services()["s3-init"]
    assert service["entrypoint"] == ["python3", "-c"]
    (code,) = service["command"]
    assert "http://s3:5000" in code
    env = {**os.environ, **environment(service)}
    result = subprocess.run(
        [sys.executable, "-c", code.replace("http://s3:5000", endpoint_url)],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    return result.stdout


@pytest.fixture(scope="module")
def s3_init_output(s3_server: services.S3Server) -> str:
    """s3-init has run once against the local S3 API server."""
    return run_s3_init(s3_server.endpoint_url)


def test_s3_init_creates_the_bucket_and_is_idempotent(s3_server: services.S3Server, s3_init_output: str) -> None:
    assert s3_init_output.strip() == "bucket adk-demo ready"
    assert run_s3_init(s3_server.endpoint_url).strip() == "bucket adk-demo ready"
    client = boto3.client(
        "s3",
        endpoint_url=s3_server.endpoint_url,
        region_name="us-east-1",
        aws_access_key_id="x",
        aws_secret_access_key="x",
        config=botocore.config.Config(s3={"addressing_style": "path"}),
    )
    assert "adk-demo" in [b["Name"] for b in client.list_buckets()["Buckets"]]


async def test_s3_wait_through_the_compose_connection(
    s3_server: services.S3Server, s3_init_output: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    conn = connections(compose_services()["triggerer-1"])["s3_demo"]
    extra = {**conn["extra"], "endpoint_url": s3_server.endpoint_url}
    conn_id = define(monkeypatch, "s3_demo", extra=extra)
    key = f"orders/{uuid.uuid4().hex[:8]}/part-0.csv"
    client = boto3.client(
        "s3",
        endpoint_url=s3_server.endpoint_url,
        region_name="us-east-1",
        aws_access_key_id=conn["login"],
        aws_secret_access_key=conn["password"],
        config=botocore.config.Config(s3={"addressing_style": "path"}),
    )
    client.put_object(Bucket="adk-demo", Key=key, Body=b"id,amount\n1,9.99\n")
    options: dict[str, Any] = {
        "bucket_key": f"s3://adk-demo/{key.rsplit('/', 1)[0]}/*.csv",
        "wildcard_match": True,
        "aws_conn_id": conn_id,
    }
    trigger = S3KeyTrigger(**options)
    payload = await run_trigger_payload(trigger)
    assert payload["status"] == "success"
    assert [(k["bucket"], k["key"], k["size"]) for k in payload["keys"]] == [("adk-demo", key, 17)]
    assert conn["password"] not in json.dumps(trigger.serialize())
