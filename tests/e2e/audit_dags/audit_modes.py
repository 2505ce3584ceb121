"""The same ~30 s wall-clock wait held five ways, so the audit can be checked against reality.

``poke`` holds a worker slot the whole time, ``reschedule`` only while each poke runs,
``deferred`` only before deferring and after resuming, ``end_from_trigger`` only before
deferring, ``start_from_trigger`` (with ``end_from_trigger``) never: the scheduler defers it and
the triggerer ends it. ``adk_audit_warmup`` runs first: the first tasks after Airflow starts wait seconds on
the cold API server, which would blur the measurement.
"""

from __future__ import annotations

import datetime as dt

from airflow.sdk import DAG

from airflow_deferrable_kit.sensors.temporal import DateTimeSensor

TARGET = "{{ dag_run.conf['target'] }}"
START = dt.datetime(2024, 1, 1)

with DAG(dag_id="adk_audit_modes", schedule=None, start_date=START, catchup=False):
    DateTimeSensor(task_id="poke", target_time=TARGET, deferrable=False, mode="poke", poke_interval=5, timeout=600)
    DateTimeSensor(
        task_id="reschedule", target_time=TARGET, deferrable=False, mode="reschedule", poke_interval=8, timeout=600
    )
    DateTimeSensor(task_id="deferred", target_time=TARGET, deferrable=True, poke_interval=5, timeout=600)
    DateTimeSensor(
        task_id="end_from_trigger",
        target_time=TARGET,
        deferrable=True,
        end_from_trigger=True,
        poke_interval=5,
        timeout=600,
    )
    DateTimeSensor(
        task_id="start_from_trigger",
        target_time=TARGET,
        start_from_trigger=True,
        end_from_trigger=True,
        poke_interval=5,
        timeout=600,
    )

with DAG(dag_id="adk_audit_warmup", schedule=None, start_date=START, catchup=False):
    for number in range(4):
        DateTimeSensor(task_id=f"warm_{number}", target_time=START.isoformat(), deferrable=False, timeout=60)
