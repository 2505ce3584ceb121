"""HttpJobOperator on a real Airflow: each task one scenario of the job API the test serves.

Installed on the event deployment by tests/e2e/test_http_jobs_e2e.py, which also creates the
connection ``adk_e2e_jobs`` (the API's port is only known then) and decides when each job ends:
every job runs until the test finishes it, so no event can come while Airflow still records the
worker's exit after a deferral. Each task's body names its scenario, so the server counts each
one's submits.
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
#: The result: its URL in the status body, five items two a page, the next page's URL in the body.
PAGES = {"result_link_path": "result_url", "items_path": "items", "next_link_path": "next"}

with DAG(
    dag_id="adk_e2e_http_jobs",
    schedule=None,
    start_date=dt.datetime(2024, 1, 1, tzinfo=dt.timezone.utc),
    catchup=False,
    tags=["e2e"],
) as dag:
    common = {"http_conn_id": "adk_e2e_jobs", "endpoint": "jobs", "deferrable": True, "poll_interval": 1, **STATUS}
    # Ends once the test finishes it; its result (three pages) is the XCom.
    HttpJobOperator(task_id="succeeds", data={"scenario": "succeeds"}, timeout=300, **PAGES, **common)
    # The test SIGKILLs the triggerer holding this one while it waits; the other adopts it, then the job ends.
    HttpJobOperator(
        task_id="survives_kill", data={"scenario": "survives_kill"}, timeout=300, end_from_trigger=True, **PAGES,
        **common,
    )  # fmt: skip
    # A poll is refused (403): the wait fails, the retry re-attaches to the same job.
    HttpJobOperator(
        task_id="reattaches", data={"scenario": "reattaches"}, timeout=300, retries=1,
        retry_delay=dt.timedelta(0), **PAGES, **common,
    )  # fmt: skip
    # Never finished: the timeout (seconds after the deferral) cancels it with a DELETE of its status URL.
    HttpJobOperator(task_id="times_out", data={"scenario": "times_out"}, timeout=12, **common)
