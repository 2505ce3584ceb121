"""With ``end_from_trigger=True`` a real Airflow ends each task as the worker path would.

One run of ``adk_e2e_outcomes`` (its five tasks at once), then per task: its state, its tries
(Airflow's own try history), how long the wait took, where it ended (a worker or the triggerer)
and its XCom. The timeout task has ``retries=2``: a sensor timeout is never retried, so it fails
after one try and about one timeout, not three. An error fails from the triggerer under the
normal retry rules. Where the triggerer ends a task with a failure or a skip, its XCom is the
error or timeout payload (a worker's raise pushes none).
"""

from __future__ import annotations

import datetime as dt
import json
import urllib.error
import urllib.request
from typing import Any

import pytest

from scripts.airflow_local import LocalAirflow, WatchedRun
from scripts.demo import API_TOKEN, Showcase

pytestmark = pytest.mark.e2e

DAG_ID = "adk_e2e_outcomes"
TIMEOUT_SECONDS = 10  # the timeout tasks' ``timeout`` in tests/e2e/dags/e2e_outcomes.py
FAILED_BATCH = "outcomes-broken-batch"
#: A worker's log says this once per process that ran the task (first start, and each resume).
WORKER_STARTED = "Worker startup parse complete"


@pytest.fixture(scope="module")
def outcomes(showcase: Showcase) -> WatchedRun:
    body = json.dumps({"state": "failed", "message": "upstream gave up"}).encode()
    request = urllib.request.Request(
        f"{showcase.batch_api_url}/v1/batches/{FAILED_BATCH}",
        data=body,
        method="PUT",
        headers={"Content-Type": "application/json", "Authorization": f"Bearer {API_TOKEN}"},
    )
    with urllib.request.urlopen(request, timeout=10):
        pass
    airflow = showcase.airflow
    airflow.wait_for_dag(DAG_ID)
    soon = (dt.datetime.now(dt.timezone.utc) + dt.timedelta(seconds=12)).replace(microsecond=0)
    run_id = airflow.trigger(DAG_ID, {"soon": soon.isoformat(), "failed_batch": FAILED_BATCH})
    return airflow.watch_run(DAG_ID, run_id, timeout=240)


def tries(airflow: LocalAirflow, run_id: str, task_id: str) -> list[dict[str, Any]]:
    """Every try Airflow recorded for the task, oldest first."""
    data = airflow.api("GET", f"/api/v2/dags/{DAG_ID}/dagRuns/{run_id}/taskInstances/{task_id}/tries")
    return sorted(data["task_instances"], key=lambda t: t["try_number"])


def worker_starts(airflow: LocalAirflow, run_id: str, task_id: str, try_number: int = 1) -> int:
    return airflow.task_log(DAG_ID, run_id, task_id, try_number).count(WORKER_STARTED)


def log_records(airflow: LocalAirflow, run_id: str, task_id: str, try_number: int = 1) -> str:
    """The try's log as its raw records (JSON), exception details included."""
    path = f"/api/v2/dags/{DAG_ID}/dagRuns/{run_id}/taskInstances/{task_id}/logs/{try_number}?full_content=true"
    return json.dumps(airflow.api("GET", path).get("content"))


def seconds_between(start: str, end: str) -> float:
    return (dt.datetime.fromisoformat(end) - dt.datetime.fromisoformat(start)).total_seconds()


def has_return_value(airflow: LocalAirflow, run_id: str, task_id: str) -> bool:
    try:
        airflow.xcom(DAG_ID, run_id, task_id)
    except urllib.error.HTTPError as exc:
        if exc.code == 404:
            return False
        raise
    return True


def test_a_failing_timeout_is_not_retried_and_takes_one_timeout(airflow: LocalAirflow, outcomes: WatchedRun) -> None:
    task_id = "timeout_fails_once"
    states = outcomes.states[task_id]
    assert states[-1] == "failed", outcomes.states
    assert "deferred" in states and "up_for_retry" not in states, states
    history = tries(airflow, outcomes.run_id, task_id)
    assert [(t["try_number"], t["state"]) for t in history] == [(1, "failed")], history
    # One budget. The try waited the whole timeout (its start_date is kept across the resume)...
    ti = outcomes.last[task_id]
    waited = seconds_between(ti["start_date"], ti["end_date"])
    assert waited >= TIMEOUT_SECONDS, ti
    # ...and the run took less than three timeouts, the least three tries of one timeout each
    # could take; the rest is worker start-up and the resume.
    run = airflow.api("GET", f"/api/v2/dags/{DAG_ID}/dagRuns/{outcomes.run_id}")
    took = seconds_between(run["start_date"], ti["end_date"])
    assert took < 3 * TIMEOUT_SECONDS, (took, ti, run)
    # The timeout went back to the worker, which raised the sensor timeout.
    records = log_records(airflow, outcomes.run_id, task_id)
    assert '"exc_type": "AirflowSensorTimeout"' in records, records[-3000:]
    assert records.count(WORKER_STARTED) == 2, records[-3000:]
    assert not has_return_value(airflow, outcomes.run_id, task_id)


def test_a_timeout_with_soft_fail_skips_from_the_triggerer_after_one_try(
    airflow: LocalAirflow, outcomes: WatchedRun
) -> None:
    task_id = "timeout_soft_fail_skips"
    assert outcomes.states[task_id][-2:] == ["deferred", "skipped"], outcomes.states
    history = tries(airflow, outcomes.run_id, task_id)
    assert [(t["try_number"], t["state"]) for t in history] == [(1, "skipped")], history
    assert worker_starts(airflow, outcomes.run_id, task_id) == 1
    # Like a worker's skip, the skip sent from the triggerer pushes no XCom.
    assert not has_return_value(airflow, outcomes.run_id, task_id)


def test_an_error_fails_from_the_triggerer_with_the_normal_retries(airflow: LocalAirflow, outcomes: WatchedRun) -> None:
    task_id = "error_is_retried"
    states = outcomes.states[task_id]
    assert states[-1] == "failed" and "deferred" in states, outcomes.states
    # Airflow archives a retried try as "failed", on the worker path too (TaskInstanceHistory
    # records it before the state becomes up_for_retry): two tries, the second the current one.
    history = tries(airflow, outcomes.run_id, task_id)
    assert [(t["try_number"], t["state"]) for t in history] == [(1, "failed"), (2, "failed")], history
    assert outcomes.last[task_id]["try_number"] == 2
    # Each try deferred, its trigger saw the failed batch and the triggerer ended the try: one
    # worker start per try.
    logs = [airflow.task_log(DAG_ID, outcomes.run_id, task_id, n) for n in (1, 2)]
    assert all("Wait failed (" in log for log in logs), logs
    assert [log.count(WORKER_STARTED) for log in logs] == [1, 1], logs
    # Like the worker path (WaitFailedError), the failure sent from the triggerer pushes no XCom.
    assert not has_return_value(airflow, outcomes.run_id, task_id)


def test_an_error_with_never_fail_skips_after_one_try(airflow: LocalAirflow, outcomes: WatchedRun) -> None:
    task_id = "error_never_fail_skips"
    states = outcomes.states[task_id]
    assert states[-1] == "skipped" and "deferred" in states, outcomes.states
    history = tries(airflow, outcomes.run_id, task_id)
    assert [(t["try_number"], t["state"]) for t in history] == [(1, "skipped")], history
    log = airflow.task_log(DAG_ID, outcomes.run_id, task_id)
    assert "Wait failed (" in log, log[-3000:]
    # Ended by the triggerer: the one worker start is the one that deferred. In some runs (two of
    # nine on 2026-12-07), Airflow 3.3.2 instead schedules the task again after the trigger's
    # skip event and a worker ends it the same way (docs/development.md, the outcome matrix):
    # the outcome is the same, the place differs. Printed so the runs that hit it show it.
    starts = log.count(WORKER_STARTED)
    after_deferral = states[states.index("deferred") :]
    print(f"{task_id}: {starts} worker start(s), states {states}")
    assert starts == 1 or (starts == 2 and "scheduled" in after_deferral), (starts, states, log[-3000:])
    assert not has_return_value(airflow, outcomes.run_id, task_id)


def test_a_success_with_do_xcom_push_false_leaves_no_xcom(airflow: LocalAirflow, outcomes: WatchedRun) -> None:
    task_id = "success_without_xcom"
    assert outcomes.states[task_id][-2:] == ["deferred", "success"], outcomes.states
    assert worker_starts(airflow, outcomes.run_id, task_id) == 1
    assert not has_return_value(airflow, outcomes.run_id, task_id)
