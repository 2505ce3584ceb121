"""HttpJobOperator on a real Airflow 3.3.2: one submit per job, whatever happens to the triggerer.

One run of ``adk_e2e_http_jobs`` (tests/e2e/event_dags/e2e_http_jobs.py, its four tasks at once)
on the event deployment (a PostgreSQL metadata DB), against a job API this module serves on
127.0.0.1 (``tests/integration/http/job_api.py``), which counts every submit and cancel:

* ``succeeds``: one submit, the result (three pages) as its XCom;
* ``survives_kill``: the triggerer holding it is SIGKILLed while it waits; the other one (two
  run, as HA runs them) adopts the trigger and polls the same job: one submit, and no cancel (a
  kill runs no ``on_kill``);
* ``reattaches``: a poll is refused (403), so the wait fails; the retry re-attaches to the
  handle saved in the task state store: one submit, success on the second try;
* ``times_out``: the timeout cancels the job (one ``DELETE``) and fails the task.

Every job runs until the test ends it, seconds after every task is seen deferred: an event that
comes while Airflow 3.3.2 still records the worker's exit after a deferral can end a try without
its resume (docs/development.md, the outcome matrix). The module leaves one triggerer, the
survivor, and no watcher.
"""

from __future__ import annotations

import contextlib
import os
import signal
import time
import urllib.error
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from scripts.airflow_local import WatchedRun
from tests.e2e.event_deployment import EventDeployment
from tests.e2e.metadata import outdate_heartbeat
from tests.integration.http.conftest import Server
from tests.integration.http.job_api import JobApi

pytestmark = pytest.mark.e2e

DAG = Path(__file__).parent / "event_dags" / "e2e_http_jobs.py"
DAG_ID = "adk_e2e_http_jobs"
CONN_ID = "adk_e2e_jobs"
TASKS = ("succeeds", "survives_kill", "reattaches", "times_out")
OTHERS = ("succeeds", "reattaches", "times_out")  # every task but survives_kill
#: Seconds every task is seen deferred before a job may end: an event that comes while Airflow
#: 3.3.2 still records the worker's exit after a deferral can end a try without its resume.
DEFERRED_FOR = 5.0
#: The threshold the triggerers of this module start with: large enough that a live triggerer
#: starved of CPU is never taken for dead; the killed one's heartbeat is made old at once instead.
THRESHOLD = {"AIRFLOW__TRIGGERER__TRIGGERER_HEALTH_CHECK_THRESHOLD": "30"}


@dataclass
class Jobs:
    """The deployment, the job API it reaches, and what the test did."""

    deployment: EventDeployment
    api: JobApi
    #: Triggerer job id -> its process name.
    triggerers: dict[int, str]
    ended: bool = False  # succeeds and reattaches were told to end
    killed: list[int] = field(default_factory=list)  # job ids of the triggerers SIGKILLed
    polls_at_kill: int = 0  # polls of survives_kill's job before the kill

    def trigger_holder(self, task_id: str) -> int | None:
        """The triggerer job holding ``task_id``'s trigger, or ``None`` (none yet, or not deferred)."""
        rows = self.deployment.query(
            "SELECT t.triggerer_id FROM trigger t JOIN task_instance ti ON ti.trigger_id = t.id "
            "WHERE ti.dag_id = %s AND ti.task_id = %s",
            DAG_ID,
            task_id,
        )
        return int(rows[0][0]) if rows and rows[0][0] is not None else None

    def kill(self, job: int) -> None:
        """SIGKILL the triggerer of ``job`` and make its heartbeat old: dead, for the other one now."""
        process = self.deployment.airflow.processes.pop(self.triggerers[job])
        os.killpg(process.pid, signal.SIGKILL)
        process.wait(timeout=30)
        self.killed.append(job)
        outdate_heartbeat(self.deployment.dsn, job)


@pytest.fixture(scope="module")
def jobs(event_airflow: EventDeployment) -> Iterator[Jobs]:
    deployment = event_airflow
    started = time.monotonic()
    api = JobApi(runs_for=10**9, items=5, page_size=2)  # every job runs until the test ends it
    api.server = Server(api.handler).start()
    airflow = deployment.airflow
    connection = {"connection_id": CONN_ID, "conn_type": "http", "host": "127.0.0.1", "port": api.server.port}
    try:
        airflow.api("POST", "/api/v2/connections", connection)
        deployment.install(DAG)  # parsed while the triggerers restart
        # Two triggerers, as HA runs them: the one holding survives_kill is killed, the other adopts.
        first, second = deployment.restart_triggerers(2, **THRESHOLD)
        airflow.wait_for_dag(DAG_ID)
        yield Jobs(deployment, api, {first: "triggerer", second: "triggerer-2"})
    finally:
        deployment.uninstall([DAG], [DAG_ID], [])
        with contextlib.suppress(urllib.error.HTTPError):
            airflow.api("DELETE", f"/api/v2/connections/{CONN_ID}")
        api.server.stop()
        print(f"\nthe HTTP job module took {time.monotonic() - started:.0f}s")
    # What the modules after this one start from: one triggerer, healthy, and no watcher.
    alive = [name for name, proc in airflow.processes.items() if name.startswith("triggerer") and proc.poll() is None]
    assert len(alive) == 1 and len(deployment.live_triggerers()) == 1, (alive, deployment.live_triggerers())
    assert deployment.query("SELECT count(*) FROM asset_watcher") == [(0,)]


def test_one_submit_per_job_through_a_kill_a_retry_and_a_timeout(jobs: Jobs) -> None:
    airflow, api = jobs.deployment.airflow, jobs.api
    run_id = airflow.trigger(DAG_ID)

    def act(watched: WatchedRun) -> None:
        """End succeeds' and reattaches' jobs once every task has waited a while; once those two
        and times_out have left the triggerer, SIGKILL the triggerer holding survives_kill (the
        other one adopts it), then end its job. The kill meets no other wait's event half-stored."""
        deferred = [watched.first_seen(task_id, "deferred") for task_id in TASKS]
        if (
            not jobs.ended
            and all(at is not None and time.time() - at >= DEFERRED_FOR for at in deferred)
            and set(TASKS) <= airflow.worker_exits(DAG_ID, run_id)  # Airflow's own race, docs/operations.md
        ):
            api.finish("succeeds")
            api.finish("reattaches", refused=1)  # one 403 fails the wait, then the job is done for the retry
            jobs.ended = True
        if not jobs.ended or jobs.killed or any(watched.state(task_id) == "deferred" for task_id in OTHERS):
            return
        holder = jobs.trigger_holder("survives_kill")
        if holder not in jobs.triggerers or api.job_of("survives_kill").polls < 1:
            return  # not polled by a triggerer yet
        jobs.polls_at_kill = api.job_of("survives_kill").polls
        jobs.kill(holder)
        api.finish("survives_kill")

    run = airflow.watch_run(DAG_ID, run_id, timeout=300, on_tick=act)

    assert len(jobs.killed) == 1, f"the kill never happened: {run.states}"
    assert {task_id: run.state(task_id) for task_id in TASKS} == {
        "succeeds": "success", "survives_kill": "success", "reattaches": "success", "times_out": "failed",
    }, run.states  # fmt: skip
    for task_id in TASKS:
        assert "deferred" in run.states[task_id], run.states
        assert api.submits_of(task_id) == 1, (task_id, api.submits_of(task_id))
    assert api.created == len(TASKS)

    succeeded = airflow.xcom(DAG_ID, run_id, "succeeds")
    assert succeeded["status"] == "success" and succeeded["pages"] == 3 and succeeded["complete"] is True
    assert succeeded["result"] == [{"n": n} for n in range(5)]
    # Ended from the other triggerer, which adopted the trigger and polled the job the killed one had.
    survived = airflow.xcom(DAG_ID, run_id, "survives_kill")
    assert survived["status"] == "success" and survived["result"] == [{"n": n} for n in range(5)]
    assert api.job_of("survives_kill").polls > jobs.polls_at_kill >= 1
    assert run.last["survives_kill"]["try_number"] == 1
    # The retry read the saved handle and followed the same job: two tries, one submit.
    assert run.last["reattaches"]["try_number"] == 2
    assert airflow.xcom(DAG_ID, run_id, "reattaches")["result"] == [{"n": n} for n in range(5)]
    assert api.job_of("reattaches").refuse_polls == 0  # the 403 was served
    # One cancel, of the job that timed out: a SIGKILL of the triggerer cancels nothing.
    assert api.cancels == [("DELETE", api.job_of("times_out").id)]
