"""End-to-end DAG: one wall-clock wait for the Waits page to show (tests/e2e/test_waits_page_e2e.py).

It never looks before deferring, so the run always holds one deferred task in the triggerer
until its moment, which the test sets through the run's conf.
"""

from __future__ import annotations

import datetime as dt

from airflow.sdk import DAG

from airflow_deferrable_kit.sensors.temporal import DateTimeSensor

ALWAYS_DEFER = {"deferrable": True, "check_before_defer": False, "poke_interval": 60, "timeout": 600}

with DAG(dag_id="adk_e2e_waits_page", schedule=None, start_date=dt.datetime(2024, 1, 1), catchup=False):
    DateTimeSensor(task_id="wait_for_the_moment", target_time="{{ dag_run.conf['target'] }}", **ALWAYS_DEFER)
