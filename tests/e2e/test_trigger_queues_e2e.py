"""Trigger queues on a real Airflow: waits routed to a pool of two triggerers, failover kept.

The deployment users run for affinity (docs/operations.md, "One upstream, one pool of
triggerers"): ``[triggerer] queues_enabled`` on in every component, two triggerers started
with ``--queues trg-e2e-api`` and one with ``--queues default``. Three waits on one API carry
``trigger_queue="trg-e2e-api"``, a fourth none. The routed triggers are held only by the pool,
the other one only by the default triggerer, and the tasks' own queue stays ``default`` (what
an executor routes workers by). The pool member holding a routed trigger is killed: its peer
adopts every routed trigger, the default triggerer none, and each task succeeds on its first
try once the batch is ready.

Runs on the HA deployment (a PostgreSQL metadata DB). The option is read by the workers, which
the scheduler starts, so the scheduler is restarted with it, and without it afterwards.
"""

from __future__ import annotations

import os
import signal
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.e2e.event_deployment import EventDeployment
from tests.e2e.metadata import outdate_heartbeat, running_triggerers, set_batch, wait_for

pytestmark = pytest.mark.e2e

DAG = Path(__file__).parent / "dags" / "e2e_trigger_queues.py"
DAG_ID = "adk_e2e_trigger_queues"
QUEUE = "trg-e2e-api"  # e2e_trigger_queues.TRIGGER_QUEUE
ROUTED = ("routed_0", "routed_1", "routed_2")
QUEUES_ON = {"AIRFLOW__TRIGGERER__QUEUES_ENABLED": "True"}
#: The triggerers of this deployment, by process name: the pool of the queue twice, then the
#: one every other deferral goes to (a task's queue is ``default`` unless set).
ROLES = {"triggerer": QUEUE, "triggerer-2": QUEUE, "triggerer-3": "default"}


def _restart_scheduler(deployment: EventDeployment) -> None:
    """Stop the scheduler and start it again; return once its new job heartbeats."""
    [(last,)] = deployment.query("SELECT coalesce(max(id), 0) FROM job WHERE job_type = 'SchedulerJob'")
    deployment.airflow.stop_component("scheduler")
    deployment.airflow.start_component("scheduler")
    wait_for(
        "the restarted scheduler's job heartbeating",
        lambda: deployment.query(
            "SELECT 1 FROM job WHERE job_type = 'SchedulerJob' AND id > %s AND state = 'running' "
            "AND latest_heartbeat > now() - interval '30 seconds'",
            last,
        ),
        timeout=120,
    )


@pytest.fixture
def pools(ha_deployment: EventDeployment) -> Iterator[tuple[EventDeployment, dict[str, int]]]:
    """The HA deployment with queues on and the three triggerers of ``ROLES``; their job ids by name."""
    deployment = ha_deployment
    airflow = deployment.airflow
    jobs: dict[str, int] = {}
    try:
        airflow.extra_env = {**airflow.extra_env, **QUEUES_ON}
        _restart_scheduler(deployment)
        # Large enough that a live triggerer starved of CPU is never taken for dead; the killed
        # one's heartbeat is made old at once instead (outdate_heartbeat).
        deployment.restart_triggerers(0, AIRFLOW__TRIGGERER__TRIGGERER_HEALTH_CHECK_THRESHOLD="120")
        for name, queue in ROLES.items():
            airflow.start_component("triggerer", name=name, options=["--queues", queue])
            jobs[name] = wait_for(
                f"{name}'s job", lambda: [j for j in running_triggerers(deployment.dsn) if j not in jobs.values()]
            )[0]
        deployment.install(DAG)
        yield deployment, jobs
    finally:
        deployment.uninstall([DAG], [DAG_ID], [])
        airflow.extra_env = {k: v for k, v in airflow.extra_env.items() if k not in QUEUES_ON}
        deployment.restart_triggerers(1)
        _restart_scheduler(deployment)


def test_routed_waits_stay_in_their_pool_and_a_killed_members_waits_go_to_its_peer(
    pools: tuple[EventDeployment, dict[str, int]],
) -> None:
    deployment, jobs = pools
    airflow, dsn = deployment.airflow, deployment.dsn
    batch = f"queues-{uuid.uuid4().hex[:8]}"
    set_batch(deployment.api_url, batch, "pending")
    airflow.wait_for_dag(DAG_ID)
    run_id = airflow.trigger(DAG_ID, {"batch": batch})

    def held() -> dict[str, tuple[str | None, str | None, int | None]]:
        """task id -> (the trigger's queue, the task's queue, the triggerer job holding the trigger)."""
        rows = deployment.query(
            "SELECT ti.task_id, t.queue, ti.queue, t.triggerer_id FROM task_instance ti "
            "JOIN trigger t ON t.id = ti.trigger_id WHERE ti.dag_id = %s AND ti.run_id = %s",
            DAG_ID,
            run_id,
        )
        return {task: (trigger_queue, task_queue, holder) for task, trigger_queue, task_queue, holder in rows}

    every = (*ROUTED, "unrouted")
    assigned = wait_for(
        "all four triggers held by a triggerer",
        lambda: (lambda now: now if len(now) == 4 and all(h is not None for _, _, h in now.values()) else None)(held()),
    )
    pool = {jobs["triggerer"], jobs["triggerer-2"]}
    for task in ROUTED:
        trigger_queue, task_queue, holder = assigned[task]
        assert trigger_queue == QUEUE and holder in pool, (task, assigned)
        assert task_queue == "default", (task, assigned)  # the worker's routing is the task's own
    assert assigned["unrouted"] == ("default", "default", jobs["triggerer-3"]), assigned
    print(f"\ntriggers held: {assigned} (pool {sorted(pool)}, default {jobs['triggerer-3']})")

    victim = next(name for name in ("triggerer", "triggerer-2") if jobs[name] == assigned["routed_0"][2])
    peer = jobs["triggerer-2" if victim == "triggerer" else "triggerer"]
    process = airflow.processes[victim]
    os.killpg(process.pid, signal.SIGKILL)
    process.wait(timeout=30)
    outdate_heartbeat(dsn, jobs[victim])

    adopted = wait_for(
        "the peer holding every routed trigger",
        lambda: (lambda now: now if all(now[task][2] == peer for task in ROUTED) else None)(held()),
        timeout=120,
    )
    assert adopted["unrouted"][2] == jobs["triggerer-3"], adopted  # the default triggerer took none of the pool's

    # The scheduler has taken in the exit of each worker that deferred: a resume before then can
    # lose to Airflow's own race (LocalAirflow.worker_exits, docs/operations.md), seen here as a
    # routed wait failed in one try with "finished with state success, but ... queued".
    wait_for("every deferring worker's exit taken in", lambda: set(every) <= airflow.worker_exits(DAG_ID, run_id))
    set_batch(deployment.api_url, batch, "ready")
    watched = airflow.watch_run(DAG_ID, run_id, timeout=240)
    assert watched.run_state == "success", watched.states
    for task in every:
        assert "deferred" in watched.states[task], watched.states
        assert watched.last[task]["state"] == "success" and watched.last[task]["try_number"] == 1, watched.last[task]
        assert airflow.xcom(DAG_ID, run_id, task)["status"] == "success"
    assert process.poll() is not None  # the killed one stayed dead
