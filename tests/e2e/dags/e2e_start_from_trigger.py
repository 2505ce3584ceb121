"""End-to-end DAG: sensors that start in the triggerer (``start_from_trigger``) and end there.

The scheduler defers each task itself, with no worker; the triggerer renders the templated
arguments from the run (``dag_run.conf``) and ends the task. tests/e2e/test_start_from_trigger_e2e.py
reads where each task ran and how it ended.
"""

from __future__ import annotations

import datetime as dt
from typing import Any

from airflow.sdk import DAG

from airflow_deferrable_kit.sensors.s3 import S3KeySensor
from airflow_deferrable_kit.sensors.temporal import DateTimeSensor

BUCKET = "adk-e2e-start"
#: The timeout tasks' budget, counted from when the scheduler started them in the triggerer.
TIMEOUT_SECONDS = 10
IN_TRIGGERER: dict[str, Any] = {"deferrable": True, "start_from_trigger": True, "end_from_trigger": True}
RETRY_FAST: dict[str, Any] = {"retries": 2, "retry_delay": dt.timedelta(seconds=1)}

with DAG(dag_id="adk_e2e_start_from_trigger", schedule=None, start_date=dt.datetime(2024, 1, 1), catchup=False):
    S3KeySensor(
        task_id="key_arrives",
        bucket_key=f"s3://{BUCKET}/{{{{ dag_run.conf['key'] }}}}",
        aws_conn_id="s3_demo",
        poke_interval=1,
        timeout=120,
        **IN_TRIGGERER,
    )
    DateTimeSensor(task_id="moment_from_conf", target_time="{{ dag_run.conf['soon'] }}", timeout=120, **IN_TRIGGERER)
    S3KeySensor(
        task_id="timeout_fails_once",
        bucket_key=f"s3://{BUCKET}/never/{{{{ run_id }}}}.csv",
        aws_conn_id="s3_demo",
        poke_interval=2,
        timeout=TIMEOUT_SECONDS,
        **RETRY_FAST,
        **IN_TRIGGERER,
    )
    S3KeySensor(
        task_id="timeout_soft_fail_skips",
        bucket_key=f"s3://{BUCKET}/never/{{{{ run_id }}}}.csv",
        aws_conn_id="s3_demo",
        poke_interval=2,
        timeout=TIMEOUT_SECONDS,
        soft_fail=True,
        **RETRY_FAST,
        **IN_TRIGGERER,
    )
    # Renders to a date with no time: not a moment. One clear error, never a crashed triggerer.
    DateTimeSensor(task_id="bad_rendered_value", target_time="{{ ds }}", timeout=120, **IN_TRIGGERER)
