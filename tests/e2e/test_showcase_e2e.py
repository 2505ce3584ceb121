"""The showcase through a real Airflow, as `make demo` runs it, plus semantics only a real
scheduler shows: timeout -> skipped with soft_fail, error -> failed despite soft_fail, and
deferrable=False in reschedule mode.
"""

from __future__ import annotations

import datetime as dt
import json
import urllib.request
from typing import Any

import pytest

from scripts.demo import DAG_ID, TASKS, Showcase, report, run_showcase

pytestmark = pytest.mark.e2e


@pytest.fixture(scope="module")
def showcase_run(showcase: Showcase) -> tuple[Any, list[dict[str, Any]]]:
    watched = run_showcase(showcase, delay=1.0, log=lambda line: print(line, flush=True))
    return watched, report(showcase, watched)


def test_every_wait_deferred_and_succeeded(showcase: Showcase, showcase_run: tuple[Any, list[dict[str, Any]]]) -> None:
    watched, _ = showcase_run
    failed_logs = {
        task_id: showcase.airflow.task_log(DAG_ID, watched.run_id, task_id)[-3000:]
        for task_id in TASKS
        if watched.states[task_id][-1] != "success"
    }
    assert watched.run_state == "success", (watched.states, failed_logs)
    for task_id in TASKS:
        states = watched.states[task_id]
        assert "deferred" in states, (task_id, states)
        assert states[-1] == "success", (task_id, states)


def test_each_payload_says_what_was_found(showcase: Showcase, showcase_run: tuple[Any, list[dict[str, Any]]]) -> None:
    _, rows = showcase_run
    payloads = {row["task_id"]: row["payload"] for row in rows}
    print(json.dumps(payloads, indent=1, default=str))
    assert all(p["status"] == "success" for p in payloads.values()), payloads
    s3 = payloads["wait_s3_object"]
    assert [k["key"] for k in s3["keys"]] == [f"exports/{showcase.batch}/_SUCCESS"]
    assert s3["keys"][0]["size"] == len(b"42 files\n")
    http = payloads["wait_http_batch_ready"]
    assert http["status_code"] == 200
    assert http["decision"]["actual"] == "ready"
    marker = payloads["wait_postgres_marker"]
    assert marker["row"]["batch_id"] == showcase.batch
    assert marker["row"]["status"] == "done"
    message = payloads["wait_kafka_message"]
    assert (message["topic"], message["key"]) == ("batch-events", f"batch-{showcase.batch}")
    assert message["value"] == {"batch": showcase.batch, "rows": 1234}
    assert payloads["wait_moment"]["target_time"].endswith("+00:00")


def test_end_from_trigger_tasks_never_went_back_to_a_worker(
    showcase: Showcase, showcase_run: tuple[Any, list[dict[str, Any]]]
) -> None:
    watched, _ = showcase_run
    for task_id in ("wait_kafka_message", "wait_moment"):
        assert watched.states[task_id][-2:] == ["deferred", "success"], watched.states[task_id]
        log = showcase.airflow.task_log(DAG_ID, watched.run_id, task_id)
        assert log.count("Worker startup parse complete") == 1, log[-2000:]


def test_worker_time_is_a_small_part_of_the_wait(showcase_run: tuple[Any, list[dict[str, Any]]]) -> None:
    _, rows = showcase_run
    for row in rows:
        assert row["wall_seconds"] is not None
        assert row["worker_seconds"] < row["wall_seconds"], row


def test_timeout_skips_with_soft_fail_errors_fail_anyway_and_reschedule_mode_works(showcase: Showcase) -> None:
    airflow = showcase.airflow
    failed_batch = "broken-batch"
    body = json.dumps({"state": "failed", "message": "upstream gave up"}).encode()
    request = urllib.request.Request(
        f"{showcase.batch_api_url}/v1/batches/{failed_batch}",
        data=body,
        method="PUT",
        headers={"Content-Type": "application/json", "Authorization": "Bearer demo-token"},
    )
    with urllib.request.urlopen(request, timeout=10):
        pass
    soon = (dt.datetime.now(dt.timezone.utc) + dt.timedelta(seconds=12)).replace(microsecond=0)
    airflow.wait_for_dag("adk_e2e_semantics")
    run_id = airflow.trigger("adk_e2e_semantics", {"soon": soon.isoformat(), "failed_batch": failed_batch})
    watched = airflow.watch_run("adk_e2e_semantics", run_id, timeout=300)
    states = watched.states
    assert states["timeout_soft_fail"][-1] == "skipped", states
    assert "deferred" in states["timeout_soft_fail"]
    assert states["error_despite_soft_fail"][-1] == "failed", states
    assert "deferred" in states["error_despite_soft_fail"]
    log = airflow.task_log("adk_e2e_semantics", run_id, "error_despite_soft_fail")
    assert "condition_failed" in log, log[-2000:]
    assert states["reschedule_mode"][-1] == "success", states
    assert "up_for_reschedule" in states["reschedule_mode"]
    assert "deferred" not in states["reschedule_mode"]
    assert airflow.xcom("adk_e2e_semantics", run_id, "reschedule_mode") == {
        "status": "success",
        "target_time": soon.isoformat(),
    }
