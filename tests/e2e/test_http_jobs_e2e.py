"""HttpJobOperator on a real Airflow 3.3.2: one submit per job, whatever happens to the triggerer.

One run of ``adk_e2e_http_jobs`` (its four tasks at once) against a job API served by this test
(``tests/integration/http/job_api.py``), which counts every submit and cancel:

* ``succeeds``: one submit, the result (three pages) as its XCom;
* ``survives_kill``: the triggerer is SIGKILLed while it waits and started again: one submit;
* ``reattaches``: the wait fails (a 403), the retry re-attaches to the handle saved in the task
  state store: one submit, success on the second try;
* ``times_out``: the timeout cancels the job (one DELETE) and fails the task.

The triggerer is restarted healthy before the test ends, for the modules after this one.
"""

from __future__ import annotations

import contextlib
import os
import signal
import sqlite3
from collections.abc import Iterator

import pytest

from scripts.airflow_local import LocalAirflow
from scripts.demo import Showcase
from tests.e2e.metadata import wait_for
from tests.integration.http.conftest import Server
from tests.integration.http.job_api import JobApi

pytestmark = pytest.mark.e2e

DAG_ID = "adk_e2e_http_jobs"
CONN_ID = "e2e_jobs_api"


@pytest.fixture(scope="module")
def job_api() -> Iterator[JobApi]:
    api = JobApi(runs_for=2, items=5, page_size=2)
    api.server = Server(api.handler).start()
    yield api
    api.server.stop()


def _connection(airflow: LocalAirflow, api: JobApi) -> None:
    assert api.server is not None
    body = {"connection_id": CONN_ID, "conn_type": "http", "host": "127.0.0.1", "port": api.server.port}
    with contextlib.suppress(Exception):  # left over from an earlier run of this deployment
        airflow.api("DELETE", f"/api/v2/connections/{CONN_ID}")
    airflow.api("POST", "/api/v2/connections", body)


def _kill_triggerer(airflow: LocalAirflow) -> None:
    """SIGKILL the triggerer, age its heartbeat (SQLite metadata DB), start a new one."""
    os.killpg(airflow.processes.pop("triggerer").pid, signal.SIGKILL)
    db = airflow.metadata_url.removeprefix("sqlite:///")
    with sqlite3.connect(db, timeout=30) as conn:
        conn.execute(
            "UPDATE job SET latest_heartbeat = '2000-01-01 00:00:00.000000', state = 'failed' "
            "WHERE job_type = 'TriggererJob' AND state = 'running'"
        )
    airflow.start_component("triggerer")
    airflow.wait_healthy(timeout=120)


def test_one_submit_per_job_through_kill_retry_and_timeout(showcase: Showcase, job_api: JobApi) -> None:
    airflow = showcase.airflow
    assert airflow.metadata_url.startswith("sqlite:///")
    _connection(airflow, job_api)
    airflow.wait_for_dag(DAG_ID)
    run_id = airflow.trigger(DAG_ID)
    try:
        wait_for("survives_kill to be polled", lambda: job_api.job_of("survives_kill").polls >= 2, timeout=180)
        _kill_triggerer(airflow)
        job_api.job_of("survives_kill").runs_for = job_api.job_of("survives_kill").polls + 1
        run = airflow.watch_run(DAG_ID, run_id, timeout=300)
    finally:
        if "triggerer" not in airflow.processes or airflow.processes["triggerer"].poll() is not None:
            airflow.processes.pop("triggerer", None)
            airflow.start_component("triggerer")
            airflow.wait_healthy(timeout=120)

    states = {task_id: ti["state"] for task_id, ti in airflow.task_instances(DAG_ID, run_id).items()}
    assert states == {"succeeds": "success", "survives_kill": "success", "reattaches": "success",
                      "times_out": "failed"}, (states, run)  # fmt: skip
    for scenario in ("succeeds", "survives_kill", "reattaches", "times_out"):
        assert job_api.submits_of(scenario) == 1, (scenario, job_api.submits_of(scenario))
    xcom = airflow.xcom(DAG_ID, run_id, "succeeds")
    assert xcom["status"] == "success" and xcom["result"] == [{"n": n} for n in range(5)] and xcom["pages"] == 3
    assert airflow.xcom(DAG_ID, run_id, "survives_kill")["complete"] is True
    reattached = airflow.task_instances(DAG_ID, run_id)["reattaches"]
    assert reattached["try_number"] == 2
    assert job_api.cancels == [("DELETE", job_api.job_of("times_out").id)]
    assert airflow.processes["triggerer"].poll() is None  # left healthy for the modules after this one
