"""End-to-end DAG: waits on one API routed to a pool of triggerers (tests/e2e/test_trigger_queues_e2e.py).

Three waits carry ``trigger_queue``: their triggers go to the triggerers started with
``--queues trg-e2e-api``, while the tasks keep their own queue. A fourth has none and goes
where every other deferral goes (its task's queue, ``default``). None looks before deferring,
so each holds a deferred task until the test sets the run's batch ready.
"""

from __future__ import annotations

import datetime as dt

from airflow.sdk import DAG

from airflow_deferrable_kit.sensors.http import HttpBatchReadySensor

TRIGGER_QUEUE = "trg-e2e-api"
ALWAYS_DEFER = {"deferrable": True, "check_before_defer": False, "poke_interval": 2, "timeout": 600}
WAIT = {
    "http_conn_id": "adk_e2e_api",
    "endpoint": "v1/batches/{{ dag_run.conf['batch'] }}/status",
    "success": [{"path": "state", "equals": "ready"}],
}

with DAG(dag_id="adk_e2e_trigger_queues", schedule=None, start_date=dt.datetime(2024, 1, 1), catchup=False):
    for number in range(3):
        HttpBatchReadySensor(task_id=f"routed_{number}", trigger_queue=TRIGGER_QUEUE, **WAIT, **ALWAYS_DEFER)
    HttpBatchReadySensor(task_id="unrouted", **WAIT, **ALWAYS_DEFER)
