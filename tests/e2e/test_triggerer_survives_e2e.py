"""A real triggerer that cannot build some kit triggers keeps running and finishes the others.

Airflow's trigger runner dies on any exception but ``TypeError`` from a trigger's constructor, and
the trigger row stays, so every restart would die on it again. Here the triggerer's host differs
from the rest, as real deployments do: it lacks the ``s3`` extra (a smaller triggerer image), and
it lacks the module of an ``as_event_trigger()`` watcher's wait (code shipped to the DAG processor
only). The S3 wait must end alone with the pip command, the watcher must keep trying without
firing, and a healthy wait on the same triggerer must succeed.
"""

from __future__ import annotations

import datetime as dt
import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from scripts.airflow_local import LocalAirflow
from tests.e2e.event_deployment import EventDeployment

pytestmark = pytest.mark.e2e

HERE = Path(__file__).parent
DAGS = sorted((HERE / "survival_dags").glob("*.py"))
DAG_ID = "adk_e2e_survival"
WATCHER_DAG_ID = "adk_e2e_unbuildable_consumer"


@pytest.fixture(scope="module")
def uneven_airflow(ha_deployment: EventDeployment) -> Iterator[LocalAirflow]:
    """The HA deployment with one triggerer on a host of its own: no ``s3`` extra there, and
    not the wait module the DAG processor has (``ha_deployment`` puts it on that path alone)."""
    deployment = ha_deployment
    deployment.restart_triggerers(1, path=HERE / "survival_hosts" / "no_s3_extra")
    deployment.install(*DAGS)
    try:
        yield deployment.airflow
    finally:
        deployment.uninstall(DAGS, [DAG_ID, WATCHER_DAG_ID], ["adk_e2e_unbuildable"])
        deployment.restart_triggerers(1)  # the host as the other modules expect it


def test_the_triggerer_survives_triggers_it_cannot_build_and_finishes_the_others(
    uneven_airflow: LocalAirflow,
) -> None:
    airflow = uneven_airflow
    airflow.wait_for_dag(DAG_ID)
    airflow.wait_for_dag(WATCHER_DAG_ID)
    # Well after the worker's deferral is recorded: a trigger that fires while Airflow 3.3.2 is
    # still recording a worker's exit can fail the task (10 s was too close on a busy machine).
    target = (dt.datetime.now(dt.timezone.utc) + dt.timedelta(seconds=25)).replace(microsecond=0)
    run_id = airflow.trigger(DAG_ID, conf={"target": target.isoformat()})
    run = airflow.watch_run(DAG_ID, run_id, timeout=240)
    log = airflow.log_tail("triggerer", chars=200_000)

    assert airflow.processes["triggerer"].poll() is None, log[-3000:]
    assert "Trigger runner process has died" not in log
    assert run.state("healthy") == "success", run.states
    assert run.state("needs_s3_extra") == "failed", run.states
    logs = airflow.api(
        "GET", f"/api/v2/dags/{DAG_ID}/dagRuns/{run_id}/taskInstances/needs_s3_extra/logs/1?full_content=true"
    )
    task_log = json.dumps(logs)  # the error sits in the structured fields of the log lines
    assert "airflow-deferrable-kit[s3]" in task_log and "S3KeyTrigger could not be built" in task_log, task_log[-3000:]
    # The watcher whose wait module the triggerer lacks: built, not running, retried with backoff.
    assert "AlwaysThere" in log and "could not be built in the triggerer" in log, log[-3000:]
    assert "nothing fires until this is fixed" in log
    runs = airflow.api("GET", f"/api/v2/dags/{WATCHER_DAG_ID}/dagRuns")["dag_runs"]
    assert runs == []
    health = airflow.api("GET", "/api/v2/monitor/health")
    assert health["triggerer"]["status"] == "healthy", health
