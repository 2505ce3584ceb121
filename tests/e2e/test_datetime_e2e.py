"""Through a real scheduler and triggerer: running -> deferred -> success, payload as XCom."""

from __future__ import annotations

import datetime as dt

import pytest

from scripts.airflow_local import LocalAirflow

pytestmark = pytest.mark.e2e


def test_datetime_sensor_defers_resumes_and_returns_its_payload(airflow: LocalAirflow) -> None:
    airflow.wait_for_dag("adk_e2e_datetime")
    target = (dt.datetime.now(dt.timezone.utc) + dt.timedelta(seconds=20)).replace(microsecond=0)
    run_id = airflow.trigger("adk_e2e_datetime", {"target": target.isoformat()})
    watched = airflow.watch_run("adk_e2e_datetime", run_id, timeout=240)
    assert watched.run_state == "success", watched.states
    expected = {"status": "success", "target_time": target.isoformat()}
    for task_id in ("resume_on_worker", "end_from_trigger"):
        states = watched.states[task_id]
        assert "deferred" in states, states
        assert states[-1] == "success", states
        assert states.index("deferred") < len(states) - 1
        assert airflow.xcom("adk_e2e_datetime", run_id, task_id) == expected
        ended = dt.datetime.fromisoformat(watched.last[task_id]["end_date"])
        assert ended >= target
    # Resuming runs the task on a worker a second time; end_from_trigger finishes it in the
    # triggerer, so its worker ran once.
    worker_runs = {
        task_id: airflow.task_log("adk_e2e_datetime", run_id, task_id).count("Worker startup parse complete")
        for task_id in ("resume_on_worker", "end_from_trigger")
    }
    assert worker_runs == {"resume_on_worker": 2, "end_from_trigger": 1}
    assert watched.states["end_from_trigger"][-2:] == ["deferred", "success"]
