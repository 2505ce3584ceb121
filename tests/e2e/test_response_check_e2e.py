"""The official ``response_check`` on a real Airflow: refused candidates re-defer, then success."""

from __future__ import annotations

import json
import time
import urllib.request
import uuid

import pytest

from scripts.airflow_local import WatchedRun
from scripts.demo import API_TOKEN, Showcase

pytestmark = pytest.mark.e2e

DAG_ID = "adk_e2e_response_check"


def put_batch(showcase: Showcase, batch: str, **fields: object) -> None:
    request = urllib.request.Request(
        f"{showcase.batch_api_url}/v1/batches/{batch}",
        data=json.dumps(fields).encode(),
        method="PUT",
        headers={"Content-Type": "application/json", "Authorization": f"Bearer {API_TOKEN}"},
    )
    with urllib.request.urlopen(request, timeout=10):
        pass


def test_a_refusing_response_check_re_defers_until_it_accepts(showcase: Showcase) -> None:
    airflow = showcase.airflow
    airflow.wait_for_dag(DAG_ID)
    batch = f"rc-{uuid.uuid4().hex[:8]}"
    run_id = airflow.trigger(DAG_ID, {"batch": batch})  # unknown batch: 404, not yet
    deferrals: list[float] = []
    made = [False]

    def on_change(task_id: str, state: str, previous: str | None) -> None:
        if state == "deferred":
            deferrals.append(time.monotonic())
            if len(deferrals) == 3:  # refused by the event's response, then by the worker's look
                put_batch(showcase, batch, state="ready", rows=150)

    def on_tick(watched: WatchedRun) -> None:
        # The trigger is waiting: 10 s on (never a resume right after a deferral, see the DAG),
        # make the batch a 2xx the callable will refuse.
        if len(deferrals) == 1 and time.monotonic() - deferrals[0] > 10 and not made[0]:
            made[0] = True
            put_batch(showcase, batch, state="pending", rows=10)

    watched = airflow.watch_run(DAG_ID, run_id, timeout=420, on_change=on_change, on_tick=on_tick)
    log = airflow.task_log(DAG_ID, run_id, "rows_enough")
    assert watched.run_state == "success", (watched.states, log[-6000:])
    states = watched.states["rows_enough"]
    assert states.count("deferred") >= 3, states
    payload = airflow.xcom(DAG_ID, run_id, "rows_enough")
    assert payload["status"] == "success" and payload["status_code"] == 200
    assert json.loads(payload["body_excerpt"])["rows"] == 150
    assert "response" not in payload  # it travelled for the check, never as the XCom
    assert "response_check said not yet" in log
