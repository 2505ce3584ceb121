"""End-to-end DAG: one HTTP wait for the Waits page to show (tests/e2e/test_waits_page_e2e.py).

It never looks before deferring, so the run always holds one deferred task in the triggerer
until the test sets the run's batch (its conf) ready on the deployment's batch API: the test
decides when the wait ends, not a clock racing a busy machine.
"""

from __future__ import annotations

import datetime as dt

from airflow.sdk import DAG

from airflow_deferrable_kit.sensors.http import HttpBatchReadySensor

ALWAYS_DEFER = {"deferrable": True, "check_before_defer": False, "poke_interval": 2, "timeout": 600}

with DAG(dag_id="adk_e2e_waits_page", schedule=None, start_date=dt.datetime(2024, 1, 1), catchup=False):
    HttpBatchReadySensor(
        task_id="wait_for_the_batch",
        http_conn_id="adk_e2e_api",
        endpoint="v1/batches/{{ dag_run.conf['batch'] }}/status",
        success=[{"path": "state", "equals": "ready"}],
        **ALWAYS_DEFER,
    )
