"""End-to-end DAG: wall-clock waits that defer to the real triggerer and resume."""

from __future__ import annotations

import datetime as dt

from airflow.sdk import DAG

from airflow_deferrable_kit.sensors.temporal import DateTimeSensor

TARGET = "{{ dag_run.conf['target'] }}"
# Always defer, even if a slow machine starts the task after the target: these tasks exist to
# prove the trip through the triggerer.
ALWAYS_DEFER = {"deferrable": True, "check_before_defer": False, "poke_interval": 60, "timeout": 600}

with DAG(dag_id="adk_e2e_datetime", schedule=None, start_date=dt.datetime(2024, 1, 1), catchup=False):
    DateTimeSensor(task_id="resume_on_worker", target_time=TARGET, **ALWAYS_DEFER)
    DateTimeSensor(task_id="end_from_trigger", target_time=TARGET, end_from_trigger=True, **ALWAYS_DEFER)
