"""End-to-end DAG: waits a triggerer cannot build beside ones it can (tests/e2e/test_triggerer_survives_e2e.py).

The triggerer host of that test lacks the ``s3`` extra, so ``needs_s3_extra`` cannot be built
there; ``healthy`` can. Neither looks before deferring, so both go through the triggerer.
"""

from __future__ import annotations

import datetime as dt

from airflow.sdk import DAG

from airflow_deferrable_kit.sensors.s3 import S3KeySensor
from airflow_deferrable_kit.sensors.temporal import DateTimeSensor

ALWAYS_DEFER = {"deferrable": True, "check_before_defer": False, "poke_interval": 60, "timeout": 600}

with DAG(dag_id="adk_e2e_survival", schedule=None, start_date=dt.datetime(2024, 1, 1), catchup=False):
    DateTimeSensor(task_id="healthy", target_time="{{ dag_run.conf['target'] }}", **ALWAYS_DEFER)
    S3KeySensor(task_id="needs_s3_extra", bucket_key="s3://adk-e2e-none/k.csv", aws_conn_id="adk_none", **ALWAYS_DEFER)
