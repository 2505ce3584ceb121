"""Run a job on an HTTP job API: submit it once, wait for it without a worker, get its result.

Needs an Airflow connection ``batch_api`` of type http, for example::

    AIRFLOW_CONN_BATCH_API='{"conn_type": "http", "host": "https://jobs.internal/api",
                             "extra": {"bearer_token": "..."}}'

The API answers ``POST v1/exports`` with ``202 Accepted`` and a ``Location`` of the job's status;
the status is ``{"state": "queued" | "running" | "succeeded" | "failed", "error": {...}}`` and,
once done, ``{"result_url": ...}`` whose pages list ``rows`` with a ``next`` link.

Parsing this file makes no network call; the job is only submitted when the task runs, once.
"""

from __future__ import annotations

import datetime as dt

from airflow.sdk import DAG, task

from airflow_deferrable_kit.operators.http import HttpJobOperator


class ExportJob(HttpJobOperator):
    """The in-house export service, declared once as data; every DAG uses it in a few lines."""

    http_conn_id = "batch_api"
    endpoint = "v1/exports"
    success = [{"path": "state", "equals": "succeeded"}]
    failure = [{"path": "state", "in": ["failed", "cancelled"]}]
    running = [{"path": "state", "in": ["queued", "running"]}]
    select = ["error.message", "rows_written"]
    result_link_path = "result_url"
    items_path = "rows"
    next_link_path = "next"
    max_pages = 20


with DAG(
    dag_id="example_http_job",
    schedule="@daily",
    start_date=dt.datetime(2024, 1, 1, tzinfo=dt.timezone.utc),
    catchup=False,
    tags=["example", "deferrable-kit", "http"],
) as dag:
    export = ExportJob(
        task_id="export_orders",
        data={"table": "orders", "date": "{{ ds }}"},
        deferrable=True,
        poll_interval=30,  # seconds between status polls; errors back off from here, with jitter
        timeout=4 * 3600,  # one budget for the wait; on timeout the job is cancelled (DELETE)
        retries=2,  # a retry re-attaches to the running job, never submits it again
    )

    @task
    def count(result: dict) -> None:
        print(f"{len(result['result'])} rows in {result['pages']} page(s); complete: {result['complete']}")

    count(export.output)
