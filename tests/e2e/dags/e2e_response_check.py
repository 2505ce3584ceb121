"""End-to-end DAG: the official ``response_check`` through a real scheduler, triggerer and worker.

The trigger waits while the batch is unknown (404), then finds a candidate (the batch exists: any
2xx); the event carries the response to the worker, and the callable says "not yet" until the
batch has enough rows: the task pauses in the triggerer, looks again from the worker, and so on
within its one deadline, until the callable says yes. The 15 s interval keeps every resume well
after its deferral: Airflow 3.3.2's LocalExecutor fails a task whose trigger fires before the
worker process that deferred it has been reported finished ("finished with state success, but
the task instance's state attribute is queued"), which took 5 s on a loaded machine.
"""

from __future__ import annotations

import datetime as dt

from airflow.sdk import DAG

from airflow_deferrable_kit.sensors.http import HttpBatchReadySensor


def enough_rows(response, task_instance):  # type: ignore[no-untyped-def]
    """Written as for the official HttpSensor (its docstring's example): a requests.Response, plus a
    context key (a manually triggered run has no logical date, so no ``ds``)."""
    body = response.json()
    return response.status_code == 200 and task_instance.task_id == "rows_enough" and (body.get("rows") or 0) >= 100


with DAG(dag_id="adk_e2e_response_check", schedule=None, start_date=dt.datetime(2024, 1, 1), catchup=False):
    HttpBatchReadySensor(
        task_id="rows_enough",
        http_conn_id="batch_api",
        endpoint="v1/batches/{{ dag_run.conf['batch'] }}/status",
        response_check=enough_rows,
        deferrable=True,
        check_before_defer=False,
        poke_interval=15,
        timeout=600,
        retries=0,
    )
