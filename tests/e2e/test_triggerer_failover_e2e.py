"""HA on a real Airflow: two triggerers share a PostgreSQL metadata DB; SIGKILL the one holding
a deferred task's trigger, and the other adopts it and the task succeeds. Among them, waits the
scheduler started in the triggerer (``start_from_trigger``): the adopter keeps their deadline
and moment, and no worker ever runs them.

Runs on the HA deployment (tests/e2e/event_deployment.py: a PostgreSQL metadata DB). The
triggerers are started one after the other so each Airflow job id maps to its process.
"""

from __future__ import annotations

import datetime as dt
import os
import signal
from collections.abc import Iterator
from pathlib import Path
from typing import TypeVar

import pytest

from scripts.airflow_local import LocalAirflow
from tests.e2e.event_deployment import EventDeployment
from tests.e2e.metadata import outdate_heartbeat, query, running_triggerers, wait_for

pytestmark = pytest.mark.e2e

DAG = Path(__file__).parent / "dags" / "e2e_datetime.py"
DAG_ID = "adk_e2e_datetime"
START_DAG = Path(__file__).parent / "dags" / "e2e_start_ha.py"
START_DAG_ID = "adk_e2e_start_ha"
WAIT_SECONDS = 50  # start_wait's time_to_wait in e2e_start_ha.py
T = TypeVar("T")


@pytest.fixture
def ha_airflow(ha_deployment: EventDeployment) -> Iterator[tuple[LocalAirflow, str]]:
    deployment = ha_deployment
    # Large enough that a live triggerer starved of CPU is never taken for dead; the killed one's
    # heartbeat is made old at once instead (outdate_heartbeat).
    deployment.restart_triggerers(1, AIRFLOW__TRIGGERER__TRIGGERER_HEALTH_CHECK_THRESHOLD="120")
    deployment.install(DAG, START_DAG)
    try:
        yield deployment.airflow, deployment.dsn
    finally:
        deployment.uninstall([DAG, START_DAG], [DAG_ID, START_DAG_ID], [])


def test_the_other_triggerer_adopts_the_trigger_of_a_killed_one(ha_airflow: tuple[LocalAirflow, str]) -> None:
    airflow, dsn = ha_airflow
    first_job = wait_for("the first triggerer job", lambda: running_triggerers(dsn))[0]
    airflow.start_component("triggerer", name="triggerer-2")
    jobs = wait_for("a second triggerer job", lambda: [j for j in running_triggerers(dsn) if j != first_job])
    second_job = jobs[0]
    process = {first_job: "triggerer", second_job: "triggerer-2"}

    airflow.wait_for_dag(DAG_ID)
    airflow.wait_for_dag(START_DAG_ID)
    target = (dt.datetime.now(dt.timezone.utc) + dt.timedelta(seconds=WAIT_SECONDS)).replace(microsecond=0)
    run_id = airflow.trigger(DAG_ID, {"target": target.isoformat()})
    start_run_id = airflow.trigger(START_DAG_ID, {"target": target.isoformat()})

    def assigned() -> list[tuple[object, ...]]:
        rows = query(
            dsn, "SELECT ti.task_id, t.triggerer_id FROM trigger t JOIN task_instance ti ON ti.trigger_id = t.id"
        )
        return rows if len(rows) == 4 and all(row[1] is not None for row in rows) else []

    rows = wait_for("all four triggers assigned to a triggerer", assigned)
    # The scheduler has taken in the exit of each worker that deferred before the moment fires
    # (a resume before then can lose to Airflow's own race, docs/operations.md).
    wait_for(
        "the deferring workers' exits taken in",
        lambda: {"resume_on_worker", "end_from_trigger"} <= airflow.worker_exits(DAG_ID, run_id),
    )
    # The one running the wait whose moment counts from its start: the adopter must keep that start.
    victim = int(str(dict(rows)["start_wait"]))
    survivor = second_job if victim == first_job else first_job
    left = (target - dt.datetime.now(dt.timezone.utc)).total_seconds()
    print(f"\nevery trigger assigned {WAIT_SECONDS - left:.0f}s after the runs were triggered")
    assert left > 15, "too slow to test adoption"
    os.killpg(airflow.processes[process[victim]].pid, signal.SIGKILL)
    airflow.processes[process[victim]].wait(timeout=30)
    outdate_heartbeat(dsn, victim)

    def adopted() -> bool:
        rows = query(dsn, "SELECT t.triggerer_id FROM trigger t JOIN task_instance ti ON ti.trigger_id = t.id")
        return len(rows) == 4 and all(row[0] == survivor for row in rows)

    wait_for("the surviving triggerer adopting every trigger", adopted)
    assert dt.datetime.now(dt.timezone.utc) < target  # adopted before the moment: the survivor fires it
    watched = airflow.watch_run(DAG_ID, run_id, timeout=240)
    assert watched.run_state == "success", watched.states
    for task_id in ("resume_on_worker", "end_from_trigger"):
        assert "deferred" in watched.states[task_id]
        assert watched.states[task_id][-1] == "success"
        assert airflow.xcom(DAG_ID, run_id, task_id) == {"status": "success", "target_time": target.isoformat()}
    assert airflow.processes[process[victim]].poll() is not None  # the killed one stayed dead

    started = airflow.watch_run(START_DAG_ID, start_run_id, timeout=240)
    assert started.run_state == "success", started.states
    for task_id in ("start_datetime", "start_wait"):  # never queued to an executor: no worker ran them
        ti = started.last[task_id]
        assert ti["queued_when"] is None and ti["try_number"] == 1 and ti["state"] == "success", ti
    assert airflow.xcom(START_DAG_ID, start_run_id, "start_datetime")["target_time"] == target.isoformat()
    # The moment is the first start's + WAIT_SECONDS: adopted seconds later, a fresh start would be later.
    moment = dt.datetime.fromisoformat(airflow.xcom(START_DAG_ID, start_run_id, "start_wait")["target_time"])
    scheduled = dt.datetime.fromisoformat(started.last["start_wait"]["start_date"])
    assert abs((moment - scheduled).total_seconds() - WAIT_SECONDS) < 3, (moment, scheduled)
