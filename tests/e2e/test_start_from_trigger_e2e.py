"""``start_from_trigger`` on a real Airflow 3.3.2: tasks that start and end in the triggerer.

One run of ``adk_e2e_start_from_trigger`` (tests/e2e/dags/e2e_start_from_trigger.py), then per
task: its states, its tries, how many worker processes ran it (a worker's log says
``Worker startup parse complete`` once per start) and its XCom. The success paths never touch a
worker; a timeout that fails the task goes to a worker to raise the sensor timeout (never
retried), as with ``end_from_trigger`` alone.
"""

from __future__ import annotations

import contextlib
import dataclasses
import datetime as dt
import json
import time
import urllib.error
from typing import Any

import pytest

from scripts import services
from scripts.airflow_local import LocalAirflow, WatchedRun
from scripts.demo import Showcase

pytestmark = pytest.mark.e2e

DAG_ID = "adk_e2e_start_from_trigger"
BUCKET = "adk-e2e-start"
TIMEOUT_SECONDS = 10
WORKER_STARTED = "Worker startup parse complete"
#: The tasks that succeed without a worker: every wait kind, templated from the run's conf.
IN_TRIGGERER_ONLY = (
    "key_arrives",
    "moment_from_conf",
    "http_ready",
    "postgres_marker",
    "kafka_message",
    "delta_after_run",
    "wait_from_start",
    "time_of_run_date",
)


@pytest.fixture(scope="module")
def started(showcase: Showcase, s3_server: services.S3Server) -> tuple[WatchedRun, dict[str, Any]]:
    import botocore.session

    client = botocore.session.get_session().create_client(
        "s3", endpoint_url=s3_server.endpoint_url, region_name="us-east-1",
        aws_access_key_id="demo", aws_secret_access_key="demo",
    )  # fmt: skip
    with contextlib.suppress(client.exceptions.BucketAlreadyOwnedByYou):
        client.create_bucket(Bucket=BUCKET)
    airflow = showcase.airflow
    airflow.wait_for_dag(DAG_ID)
    key = f"drop/{int(time.time())}.csv"
    soon = (dt.datetime.now(dt.timezone.utc) + dt.timedelta(seconds=15)).replace(microsecond=0)
    upstream = dataclasses.replace(showcase, batch=f"start-{int(time.time())}")
    upstream.produce_kafka_message()  # before the task started: not one it waits for
    conf = {"key": key, "soon": soon.isoformat(), "batch": upstream.batch}
    run_id = airflow.trigger(DAG_ID, conf)
    time.sleep(8)  # deferred by the scheduler, waiting in the triggerer
    conf["made_true"] = time.time()
    client.put_object(Bucket=BUCKET, Key=key, Body=b"1,2,3\n")
    upstream.mark_http_batch_ready()
    upstream.insert_marker_row()
    upstream.produce_kafka_message()
    return airflow.watch_run(DAG_ID, run_id, timeout=240), conf


def worker_starts(airflow: LocalAirflow, run_id: str, task_id: str, try_number: int = 1) -> int:
    try:
        return airflow.task_log(DAG_ID, run_id, task_id, try_number).count(WORKER_STARTED)
    except urllib.error.HTTPError as exc:
        if exc.code == 404:  # no log at all: nothing ran it on a worker
            return 0
        raise


def tries(airflow: LocalAirflow, run_id: str, task_id: str) -> list[tuple[int, str]]:
    data = airflow.api("GET", f"/api/v2/dags/{DAG_ID}/dagRuns/{run_id}/taskInstances/{task_id}/tries")
    return sorted((t["try_number"], t["state"]) for t in data["task_instances"])


def test_a_templated_wait_starts_and_ends_in_the_triggerer_with_no_worker(
    airflow: LocalAirflow, started: tuple[WatchedRun, dict[str, Any]]
) -> None:
    run, conf = started
    for task_id in IN_TRIGGERER_ONLY:
        states = run.states[task_id]
        assert states[-1] == "success" and "running" not in states and "queued" not in states, run.states
        assert tries(airflow, run.run_id, task_id) == [(1, "success")]
        assert worker_starts(airflow, run.run_id, task_id) == 0  # the scheduler deferred it, the triggerer ended it
    found = airflow.xcom(DAG_ID, run.run_id, "key_arrives")
    [key] = found["keys"]
    # Rendered from the run's conf, in the triggerer.
    assert key["key"] == conf["key"] and key["bucket"] == BUCKET, found
    moment = airflow.xcom(DAG_ID, run.run_id, "moment_from_conf")
    assert dt.datetime.fromisoformat(moment["target_time"]) == dt.datetime.fromisoformat(conf["soon"])
    http = airflow.xcom(DAG_ID, run.run_id, "http_ready")
    assert http["observed"] == {"path:state": "ready"} and conf["batch"] in http["url"], http
    assert airflow.xcom(DAG_ID, run.run_id, "postgres_marker")["row"]["batch_id"] == conf["batch"]
    message = airflow.xcom(DAG_ID, run.run_id, "kafka_message")
    # The message produced before the task started is not the one: the wait read from its start.
    assert message["key"] == f"batch-{conf['batch']}" and message["timestamp"] >= (conf["made_true"] - 1) * 1000


def test_moments_a_worker_worked_out_at_start_are_worked_out_in_the_triggerer(
    airflow: LocalAirflow, started: tuple[WatchedRun, dict[str, Any]]
) -> None:
    run, _ = started
    dag_run = airflow.api("GET", f"/api/v2/dags/{DAG_ID}/dagRuns/{run.run_id}")
    base = dt.datetime.fromisoformat(dag_run["data_interval_end"] or dag_run["run_after"])

    def moment(task_id: str) -> dt.datetime:
        return dt.datetime.fromisoformat(airflow.xcom(DAG_ID, run.run_id, task_id)["target_time"])

    assert moment("delta_after_run") == base + dt.timedelta(seconds=20)
    assert moment("time_of_run_date") == base.replace(hour=0, minute=0, second=0, microsecond=0)
    started_at = dt.datetime.fromisoformat(run.last["wait_from_start"]["start_date"])
    assert dt.timedelta(seconds=11) <= moment("wait_from_start") - started_at <= dt.timedelta(seconds=14)


def test_a_timeout_counts_from_the_start_in_the_triggerer_and_is_not_retried(
    airflow: LocalAirflow, started: tuple[WatchedRun, dict[str, Any]]
) -> None:
    run, _ = started
    task_id = "timeout_fails_once"
    assert run.states[task_id][-1] == "failed", run.states
    assert tries(airflow, run.run_id, task_id) == [(1, "failed")]  # retries=2, none used
    ti = run.last[task_id]
    waited = (dt.datetime.fromisoformat(ti["end_date"]) - dt.datetime.fromisoformat(ti["start_date"])).total_seconds()
    assert TIMEOUT_SECONDS <= waited < 3 * TIMEOUT_SECONDS + 30, ti
    assert worker_starts(airflow, run.run_id, task_id) == 1  # only to raise the sensor timeout


def test_a_timeout_with_soft_fail_skips_from_the_triggerer(
    airflow: LocalAirflow, started: tuple[WatchedRun, dict[str, Any]]
) -> None:
    run, _ = started
    task_id = "timeout_soft_fail_skips"
    assert run.states[task_id][-1] == "skipped", run.states
    assert tries(airflow, run.run_id, task_id) == [(1, "skipped")]
    assert worker_starts(airflow, run.run_id, task_id) == 0


def test_a_rendered_value_that_is_not_valid_fails_the_task_with_the_reason(
    airflow: LocalAirflow, started: tuple[WatchedRun, dict[str, Any]]
) -> None:
    run, _ = started
    task_id = "bad_rendered_value"
    assert run.states[task_id][-1] == "failed", run.states
    log = json.dumps(airflow.task_log(DAG_ID, run.run_id, task_id, run.last[task_id]["try_number"]))
    assert "rendered in the triggerer are not valid" in log and "target_time" in log, log[-3000:]
    assert airflow.processes["triggerer"].poll() is None  # the triggerer kept running


def test_a_mapped_sensor_with_start_from_trigger_starts_on_a_worker_and_still_waits(
    airflow: LocalAirflow, started: tuple[WatchedRun, dict[str, Any]]
) -> None:
    """Airflow 3.3.2's scheduler does not start mapped tasks in the triggerer (it logs "Starting a
    mapped task from triggerer is currently unsupported"); the kit's sensor then defers from a worker."""
    run, _ = started
    path = f"/api/v2/dags/{DAG_ID}/dagRuns/{run.run_id}/taskInstances/mapped_keys/listMapped"
    mapped = airflow.api("GET", path)["task_instances"]
    assert sorted((ti["map_index"], ti["state"]) for ti in mapped) == [(0, "success"), (1, "success")], mapped
    for ti in mapped:
        log = airflow.api(
            "GET",
            f"/api/v2/dags/{DAG_ID}/dagRuns/{run.run_id}/taskInstances/mapped_keys/logs/1"
            f"?full_content=true&map_index={ti['map_index']}",
        )
        assert WORKER_STARTED in json.dumps(log)  # started on a worker, then deferred


def test_a_kafka_timeout_skips_and_a_postgres_error_fails_from_the_triggerer(
    airflow: LocalAirflow, started: tuple[WatchedRun, dict[str, Any]]
) -> None:
    run, _ = started
    assert run.states["kafka_timeout_soft_fail_skips"][-1] == "skipped", run.states
    assert tries(airflow, run.run_id, "kafka_timeout_soft_fail_skips") == [(1, "skipped")]
    assert worker_starts(airflow, run.run_id, "kafka_timeout_soft_fail_skips") == 0
    task_id = "postgres_error_fails"
    assert run.states[task_id][-1] == "failed", run.states
    assert tries(airflow, run.run_id, task_id) == [(1, "failed")]
    log = json.dumps(airflow.task_log(DAG_ID, run.run_id, task_id, 1))
    assert "no_such_table" in log, log[-3000:]
