"""HttpJobOperator on a real Airflow: each task one scenario of the job API the test serves.

The connection ``e2e_jobs_api`` is created by tests/e2e/test_http_jobs_e2e.py (the API's port is
only known then). Each task's body names its scenario, so the server can count each one's submits.
"""

from __future__ import annotations

import datetime as dt

from airflow.sdk import DAG

from airflow_deferrable_kit.operators.http import HttpJobOperator

STATUS = {
    "success": [{"path": "state", "equals": "succeeded"}],
    "failure": [{"path": "state", "in": ["failed", "cancelled"]}],
    "running": [{"path": "state", "equals": "running"}],
}

with DAG(
    dag_id="adk_e2e_http_jobs",
    schedule=None,
    start_date=dt.datetime(2024, 1, 1, tzinfo=dt.timezone.utc),
    catchup=False,
    tags=["e2e"],
) as dag:
    common = {"http_conn_id": "e2e_jobs_api", "endpoint": "jobs", "deferrable": True, "poll_interval": 1, **STATUS}
    pages = {"result_link_path": "result_url", "items_path": "items", "next_link_path": "next"}
    # Done after a few polls; its result paged in three (next links in the body).
    HttpJobOperator(
        task_id="succeeds",
        data={"scenario": "succeeds", "runs_for": 2},
        **pages,
        timeout=120,
        **common,
    )
    # The test kills the triggerer while this one waits; the job ends once it has restarted.
    HttpJobOperator(
        task_id="survives_kill",
        data={"scenario": "survives_kill", "runs_for": 1000},
        **pages,
        timeout=300,
        end_from_trigger=True,
        **common,
    )
    # The first poll is refused (403): the wait fails, the retry re-attaches to the same job.
    HttpJobOperator(
        task_id="reattaches",
        data={"scenario": "reattaches", "runs_for": 2, "refuse_polls": 1},
        **pages,
        timeout=120,
        retries=1,
        retry_delay=dt.timedelta(seconds=1),
        **common,
    )
    # Never done: the timeout cancels it (DELETE of its status URL).
    HttpJobOperator(
        task_id="times_out",
        data={"scenario": "times_out", "runs_for": 100000},
        timeout=8,
        **common,
    )
