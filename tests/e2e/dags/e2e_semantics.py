"""End-to-end DAG for the sensor semantics that only a real scheduler can show.

* a timeout with ``soft_fail`` skips the task;
* an error event fails the task even with ``soft_fail`` (the batch API reports the batch failed);
* ``deferrable=False`` in reschedule mode frees the slot between pokes and still returns the payload.
"""

from __future__ import annotations

import datetime as dt

from airflow.sdk import DAG

from airflow_deferrable_kit.sensors.http import HttpBatchReadySensor
from airflow_deferrable_kit.sensors.temporal import DateTimeSensor

SOON = "{{ dag_run.conf['soon'] }}"

with DAG(dag_id="adk_e2e_semantics", schedule=None, start_date=dt.datetime(2024, 1, 1), catchup=False):
    DateTimeSensor(
        task_id="timeout_soft_fail",
        target_time="2999-01-01T00:00:00+00:00",
        deferrable=True,
        poke_interval=60,
        # Long enough that the timeout event comes well after the deferral: a resume within a
        # second or so of deferring can race Airflow 3.3.2's bookkeeping of the worker's exit.
        timeout=20,
        soft_fail=True,
    )
    HttpBatchReadySensor(
        task_id="error_despite_soft_fail",
        http_conn_id="batch_api",
        endpoint="v1/batches/{{ dag_run.conf['failed_batch'] }}/status",
        success=[{"path": "state", "equals": "ready"}],
        failure=[{"path": "state", "in": ["failed"]}],
        deferrable=True,
        check_before_defer=False,
        poke_interval=2,
        timeout=600,
        soft_fail=True,
        retries=0,
    )
    DateTimeSensor(
        task_id="reschedule_mode",
        target_time=SOON,
        deferrable=False,
        mode="reschedule",
        # Airflow 3.3.2 fails a rescheduled task whose executor "finished" event for the previous
        # poke is processed only after the task was scheduled again (same try number; only a
        # resume after defer() is excepted): a short interval invites that race on a busy host.
        poke_interval=10,
        timeout=600,
    )
