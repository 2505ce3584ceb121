"""Wait for an internal "is batch X ready?" API without holding a worker slot.

Needs an Airflow connection ``batch_api`` of type http, for example::

    AIRFLOW_CONN_BATCH_API='{"conn_type": "http", "host": "https://batches.internal/api",
                             "extra": {"bearer_token": "...", "X-Team": "data-eng"}}'

Parsing this file makes no network call; the sensors only talk to the API when they run.
"""

from __future__ import annotations

import datetime as dt

from airflow.sdk import DAG, task

from airflow_deferrable_kit.sensors.http import HttpBatchReadySensor

with DAG(
    dag_id="example_http_batch_ready",
    schedule="@daily",
    start_date=dt.datetime(2024, 1, 1, tzinfo=dt.timezone.utc),
    catchup=False,
    tags=["example", "deferrable-kit", "http"],
) as dag:
    # The batch API answers {"state": "pending" | "ready" | "failed", "rows": N}; it returns 404
    # until the batch exists (404 is "not yet" by default).
    batch_ready = HttpBatchReadySensor(
        task_id="batch_ready",
        http_conn_id="batch_api",
        endpoint="v1/batches/{{ ds }}/status",
        query={"include": "summary"},
        success=[{"path": "state", "equals": "ready"}],
        failure=[{"path": "state", "in": ["failed", "cancelled"]}],
        select=["rows", "summary.files"],
        deferrable=True,
        poke_interval=60,  # seconds between polls; errors back off from here, with jitter
        timeout=6 * 3600,  # one budget for the whole wait, across triggerer restarts
        end_from_trigger=False,
    )

    # A plain "is it there yet?" endpoint: no conditions means any 2xx is ready (404 = not yet).
    export_published = HttpBatchReadySensor(
        task_id="export_published",
        http_conn_id="batch_api",
        endpoint="v1/exports/{{ ds }}",
        method="HEAD",
        deferrable=True,
        poke_interval=120,
        timeout=12 * 3600,
        soft_fail=True,  # skip on timeout only; an error (e.g. 403) still fails the task
    )

    # A POST query endpoint: status 202 means "accepted, not done yet" (its Retry-After is honoured).
    report_ready = HttpBatchReadySensor(
        task_id="report_ready",
        http_conn_id="batch_api",
        endpoint="v1/reports/query",
        method="POST",
        json_body={"report": "daily_revenue", "date": "{{ ds }}"},
        not_yet_codes=[404, 202],
        success=[{"status": 200}],
        failure=[{"status": 422}],
        deferrable=True,
        poke_interval=30,
        timeout=2 * 3600,
    )

    @task
    def load(status: dict) -> None:
        print(f"batch has {status['fields']['rows']} rows (decided by {status['decision']})")

    load(batch_ready.output) >> [export_published, report_ready]
