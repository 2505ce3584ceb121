"""End-to-end DAG: waits that start and end in the triggerer, for the HA failover test.

tests/e2e/test_triggerer_failover_e2e.py kills the triggerer running them; the other one adopts
them and must keep what the first one fixed when the scheduler started them: the deadline and,
for ``start_wait``, its moment (``time_to_wait`` after the start, not after the adoption).
"""

from __future__ import annotations

import datetime as dt

from airflow.sdk import DAG

from airflow_deferrable_kit.sensors.temporal import DateTimeSensor, WaitSensor

IN_TRIGGERER = {"start_from_trigger": True, "end_from_trigger": True, "poke_interval": 60, "timeout": 600}
#: How long ``start_wait`` waits after the scheduler starts it.
WAIT_SECONDS = 50

with DAG(dag_id="adk_e2e_start_ha", schedule=None, start_date=dt.datetime(2024, 1, 1), catchup=False):
    DateTimeSensor(task_id="start_datetime", target_time="{{ dag_run.conf['target'] }}", **IN_TRIGGERER)
    WaitSensor(task_id="start_wait", time_to_wait=dt.timedelta(seconds=WAIT_SECONDS), **IN_TRIGGERER)
