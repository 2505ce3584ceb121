"""The Waits page with 10,000 deferred tasks: server time per request, as the api-server serves it.

A PostgreSQL metadata DB (Airflow's own schema, from its models) is filled with ``--deferred``
deferred task instances over ``--dags`` DAGs, each held by a trigger row written as the
Execution API writes it (the Task SDK's serde, JSON-dumped): the kit's S3, HTTP, Postgres, Kafka
and wall-clock waits and the standard provider's ``DateTimeTrigger``, spread over three
triggerer jobs with a few left unassigned. The plugin's app is mounted as the api-server mounts
it (``WaitsPlugin.fastapi_apps`` under its prefix) behind Airflow's own auth (a real JWT of
``SimpleAuthManager``'s admin), and each view is requested ``--requests`` times after
``--warmup`` requests. Server time is the time from the request entering the host app to its
response leaving it (a middleware's ``perf_counter``), so the HTTP client is not counted.

Each view is checked before it is timed (its row count), and the whole run holds the benchmark
lock on a quiet machine (:mod:`benchmarks.quiet`), or refuses. One JSON line is appended to
``--out``::

    PYTHONPATH=. .venv/bin/python -m benchmarks.waits_page --out benchmarks/waits_page.jsonl
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import re
import statistics
import time
import uuid
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import sqlalchemy as sa

from benchmarks.quiet import MachineBusy, quiet_cell
from scripts import services

UTC = dt.timezone.utc
PAGE = "/deferrable-kit/waits"
#: What each view asks the page for, and how many rows it must show.
VIEWS: dict[str, dict[str, Any]] = {
    "default (deferred longest first, 100 rows)": {},
    "sorted by budget left, descending": {"sort": "budget", "order": "desc"},
    "one kind (kit s3)": {"kind": "s3"},
    "one DAG": {"dag": "bench_waits_007"},
    "page 50": {"page": 50},
    "500 rows a page": {"per_page": 500},
}
TRIGGERERS = ("triggerer-a.internal", "triggerer-b.internal", "triggerer-c.internal")


def _kwargs(kind: str, number: int, deadline: str) -> tuple[str, dict[str, Any]]:
    """One trigger's classpath and kwargs, as the kit's sensor (or the standard provider's) defers."""
    if kind == "s3":
        kwargs = {"bucket_key": f"s3://landing/orders/{number}/_SUCCESS", "aws_conn_id": "aws_default"}
        return "airflow_deferrable_kit.triggers.s3.S3KeyTrigger", {**kwargs, "deadline": deadline}
    if kind == "http":
        kwargs = {"http_conn_id": "batch_api", "endpoint": f"v1/batches/{number}?token=x", "method": "GET"}
        return "airflow_deferrable_kit.triggers.http.HttpBatchReadyTrigger", {**kwargs, "deadline": deadline}
    if kind == "postgres":
        kwargs = {"postgres_conn_id": "warehouse", "table": "etl.batch_markers", "batch_id": str(number)}
        return "airflow_deferrable_kit.triggers.postgres.PostgresBatchMarkerTrigger", {**kwargs, "deadline": deadline}
    if kind == "kafka":
        kwargs = {"kafka_conn_id": "events", "topics": ["payments"], "key": f"batch-{number}"}
        return "airflow_deferrable_kit.triggers.kafka.KafkaMessageTrigger", {**kwargs, "deadline": deadline}
    if kind == "datetime":
        return "airflow_deferrable_kit.triggers.temporal.DateTimeTrigger", {"target_time": deadline}
    return "airflow.providers.standard.triggers.temporal.DateTimeTrigger", {
        "moment": deadline,
        "end_from_trigger": False,
    }


KINDS = ("s3", "http", "postgres", "kafka", "datetime", "official")


def fill(engine: sa.Engine, *, deferred: int, dags: int) -> None:
    """``deferred`` deferred task instances over ``dags`` DAGs (one run each), with their triggers."""
    from airflow.sdk.serde import serialize

    from tests.integration.audit.conftest import airflow_metadata

    tables = airflow_metadata().tables
    now = dt.datetime.now(UTC)
    with engine.begin() as connection:
        connection.execute(tables["dag_bundle"].insert().values(name="dags-folder"))
        jobs = []
        for host in TRIGGERERS:
            result = connection.execute(
                tables["job"]
                .insert()
                .values(
                    job_type="TriggererJob",
                    state="running",
                    hostname=host,
                    start_date=now - dt.timedelta(hours=1),
                    latest_heartbeat=now,
                )
            )
            jobs.append(result.inserted_primary_key[0])
        dag_ids = [f"bench_waits_{number:03d}" for number in range(dags)]
        connection.execute(
            tables["dag"].insert(),
            [
                {
                    "dag_id": dag_id,
                    "bundle_name": "dags-folder",
                    "is_stale": False,
                    "max_active_tasks": 16,
                    "max_consecutive_failed_dag_runs": 0,
                    "has_task_concurrency_limits": False,
                }
                for dag_id in dag_ids
            ],
        )
        connection.execute(
            tables["dag_run"].insert(),
            [
                {
                    "dag_id": dag_id,
                    "run_id": "scheduled__bench",
                    "run_type": "manual",
                    "logical_date": None,
                    "data_interval_end": None,
                    "run_after": now,
                    "state": "running",
                }
                for dag_id in dag_ids
            ],
        )
        triggers, instances = [], []
        for number in range(deferred):
            created = now - dt.timedelta(seconds=5 * number % 86_400)
            deadline = (created + dt.timedelta(hours=6)).isoformat()
            classpath, kwargs = _kwargs(KINDS[number % len(KINDS)], number, deadline)
            triggers.append(
                {
                    "classpath": classpath,
                    "kwargs": json.dumps(serialize(kwargs)),
                    "created_date": created,
                    # Every 50th not yet picked up by any triggerer.
                    "triggerer_id": None if number % 50 == 0 else jobs[number % len(jobs)],
                }
            )
        insert = tables["trigger"].insert().returning(tables["trigger"].c.id, sort_by_parameter_order=True)
        ids = connection.execute(insert, triggers).scalars()
        for number, trigger_id in enumerate(ids):
            instances.append(
                {
                    "id": uuid.uuid4(),
                    "dag_id": dag_ids[number % dags],
                    "task_id": f"wait_{number // dags:04d}",
                    "run_id": "scheduled__bench",
                    "map_index": -1,
                    "try_number": 1,
                    "state": "deferred",
                    "operator": "DateTimeSensor",
                    "pool": "default_pool",
                    "pool_slots": 1,
                    "start_date": triggers[number]["created_date"],
                    "trigger_id": trigger_id,
                    "trigger_timeout": triggers[number]["created_date"] + dt.timedelta(hours=12),
                    "next_method": "execute_complete",
                }
            )
        connection.execute(tables["task_instance"].insert(), instances)


def airflow_on(url: str) -> None:
    """Point this process's Airflow (ORM, auth manager) at the benchmark's DB, as an api-server's."""
    from airflow import settings
    from airflow.api_fastapi import app as api_app

    os.environ.update(
        {
            "AIRFLOW__DATABASE__SQL_ALCHEMY_CONN": url,
            "AIRFLOW__CORE__AUTH_MANAGER": (
                "airflow.api_fastapi.auth.managers.simple.simple_auth_manager.SimpleAuthManager"
            ),
            "AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_USERS": "admin:admin",
            "AIRFLOW__API_AUTH__JWT_SECRET": "waits-page-benchmark",
        }
    )
    settings.configure_vars()
    settings.reconfigure_orm()
    api_app._AuthManagerState.instance = None
    api_app.init_auth_manager()


def measure(views: dict[str, dict[str, Any]], *, requests: int, warmup: int, deferred: int) -> list[dict[str, Any]]:
    """Each view's server time (ms): median, 95th percentile and most, over ``requests`` requests."""
    from airflow.api_fastapi.app import get_auth_manager
    from airflow.api_fastapi.auth.managers.simple.user import SimpleAuthManagerUser
    from fastapi import FastAPI, Request
    from fastapi.testclient import TestClient

    from airflow_deferrable_kit.plugins.waits import WaitsPlugin

    host = FastAPI()
    timings: list[float] = []

    @host.middleware("http")
    async def server_time(request: Request, call_next: Any) -> Any:
        began = time.perf_counter()
        response = await call_next(request)
        timings.append(time.perf_counter() - began)
        return response

    for entry in WaitsPlugin.fastapi_apps:
        host.mount(entry["url_prefix"], entry["app"])
    client = TestClient(host)
    token = get_auth_manager().generate_jwt(SimpleAuthManagerUser(username="admin", role="admin"))
    client.headers["Authorization"] = f"Bearer {token}"
    results = []
    for name, params in views.items():
        response = client.get(PAGE, params=params)
        response.raise_for_status()
        shown = re.search(r"(\d+) of (\d+) deferred task\(s\) shown", response.text)
        if shown is None:
            raise AssertionError(f"{name}: no deferred rows on the page")
        if not params and int(shown.group(2)) != deferred:
            raise AssertionError(f"{name}: {shown.group(0)}, expected {deferred} in all")
        for _ in range(warmup):
            client.get(PAGE, params=params)
        timings.clear()
        for _ in range(requests):
            client.get(PAGE, params=params)
        ms = sorted(1000 * seconds for seconds in timings)
        results.append(
            {
                "view": name,
                "params": params,
                "rows_shown": int(shown.group(1)),
                "rows_matching": int(shown.group(2)),
                "bytes": len(response.content),
                "requests": len(ms),
                "server_ms_p50": round(statistics.median(ms), 1),
                "server_ms_p95": round(ms[min(len(ms) - 1, int(0.95 * len(ms)))], 1),
                "server_ms_max": round(ms[-1], 1),
            }
        )
    return results


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="benchmarks.waits_page", description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--deferred", type=int, default=10_000, help="deferred task instances (10000)")
    parser.add_argument("--dags", type=int, default=100, help="DAGs they are spread over (100)")
    parser.add_argument("--requests", type=int, default=30, help="timed requests per view (30)")
    parser.add_argument("--warmup", type=int, default=3, help="untimed requests per view first (3)")
    parser.add_argument("--out", type=Path, default=Path("benchmarks/waits_page.jsonl"))
    parser.add_argument("--patience", type=float, default=600.0, help="seconds to wait for a quiet machine")
    parser.add_argument("--allow-busy", action="store_true", help="measure on a busy machine, marked busy")
    return parser.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    from tests.integration.audit.conftest import airflow_metadata

    try:
        with quiet_cell(patience=args.patience, allow_busy=args.allow_busy) as machine, services.postgres() as server:
            database = f"adk_waits_bench_{uuid.uuid4().hex[:8]}"
            server.psql(f"CREATE DATABASE {database}")
            url = f"postgresql+psycopg2://postgres@127.0.0.1:{server.port}/{database}"
            engine = sa.create_engine(url)
            airflow_metadata().create_all(engine)
            began = time.perf_counter()
            fill(engine, deferred=args.deferred, dags=args.dags)
            with engine.connect() as connection:
                connection.execute(sa.text("ANALYZE"))
            engine.dispose()
            filled = time.perf_counter() - began
            airflow_on(url)
            views = measure(VIEWS, requests=args.requests, warmup=args.warmup, deferred=args.deferred)
    except MachineBusy as busy:
        print(f"refused: {busy}")
        return 2
    result = {
        "benchmark": "waits_page",
        "at": dt.datetime.now(UTC).isoformat(timespec="seconds"),
        "deferred": args.deferred,
        "dags": args.dags,
        "metadata_db": "postgresql",
        "fill_s": round(filled, 1),
        **machine,
        "views": views,
    }
    with args.out.open("a") as out:
        out.write(json.dumps(result) + "\n")
    width = max(len(view["view"]) for view in views)
    print(f"{args.deferred} deferred tasks in {args.dags} DAGs; server time per request (ms):")
    for view in views:
        print(
            f"  {view['view']:<{width}}  p50 {view['server_ms_p50']:>7.1f}  p95 {view['server_ms_p95']:>7.1f}  "
            f"max {view['server_ms_max']:>7.1f}  ({view['rows_shown']} of {view['rows_matching']} rows)"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
