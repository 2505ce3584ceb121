"""End-to-end DAG: with ``end_from_trigger=True`` every outcome is the worker path's, retries included.

* a timeout that fails the task resumes on the worker and fails it after one try, retries or not
  (a sensor timeout is never retried), and with ``soft_fail`` it skips the task from the triggerer;
* an error event fails the task from the triggerer under the normal retry rules, and with
  ``never_fail`` skips it;
* a success with ``do_xcom_push=False`` ends the task from the triggerer without an XCom.

All five tasks run at once in one DAG run, so the whole check costs about one timeout.
"""

from __future__ import annotations

import datetime as dt
from typing import Any

from airflow.sdk import DAG

from airflow_deferrable_kit.sensors.http import HttpBatchReadySensor
from airflow_deferrable_kit.sensors.temporal import DateTimeSensor

#: The wait's whole budget in the timeout tasks. Long enough that the timeout event comes well
#: after the deferral: a resume within a second or so of deferring can race Airflow 3.3.2's
#: bookkeeping of the worker's exit.
TIMEOUT_SECONDS = 10
NEVER = "2999-01-01T00:00:00+00:00"
RETRY_FAST: dict[str, Any] = {"retry_delay": dt.timedelta(seconds=1)}
FROM_TRIGGER: dict[str, Any] = {"deferrable": True, "end_from_trigger": True}
FAILED_BATCH = "v1/batches/{{ dag_run.conf['failed_batch'] }}/status"
BATCH_CONDITIONS: dict[str, Any] = {
    "success": [{"path": "state", "equals": "ready"}],
    "failure": [{"path": "state", "in": ["failed"]}],
}

with DAG(dag_id="adk_e2e_outcomes", schedule=None, start_date=dt.datetime(2024, 1, 1), catchup=False):
    DateTimeSensor(
        task_id="timeout_fails_once",
        target_time=NEVER,
        poke_interval=60,
        timeout=TIMEOUT_SECONDS,
        retries=2,
        **RETRY_FAST,
        **FROM_TRIGGER,
    )
    DateTimeSensor(
        task_id="timeout_soft_fail_skips",
        target_time=NEVER,
        poke_interval=60,
        timeout=TIMEOUT_SECONDS,
        soft_fail=True,
        retries=2,
        **RETRY_FAST,
        **FROM_TRIGGER,
    )
    # check_before_defer=False: the failed batch must be seen by the trigger, not by the worker.
    HttpBatchReadySensor(
        task_id="error_is_retried",
        http_conn_id="batch_api",
        endpoint=FAILED_BATCH,
        **BATCH_CONDITIONS,
        check_before_defer=False,
        poke_interval=2,
        timeout=600,
        retries=1,
        **RETRY_FAST,
        **FROM_TRIGGER,
    )
    HttpBatchReadySensor(
        task_id="error_never_fail_skips",
        http_conn_id="batch_api",
        endpoint=FAILED_BATCH,
        **BATCH_CONDITIONS,
        check_before_defer=False,
        poke_interval=2,
        timeout=600,
        never_fail=True,
        retries=1,
        **RETRY_FAST,
        **FROM_TRIGGER,
    )
    DateTimeSensor(
        task_id="success_without_xcom",
        target_time="{{ dag_run.conf['soon'] }}",
        check_before_defer=False,
        poke_interval=60,
        timeout=600,
        do_xcom_push=False,
        **FROM_TRIGGER,
    )
