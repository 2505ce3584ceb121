"""End-to-end DAG: sensors that start in the triggerer (``start_from_trigger``) and end there.

The scheduler defers each task itself, with no worker; the triggerer renders the templated
arguments from the run (``dag_run.conf``) and ends the task. tests/e2e/test_start_from_trigger_e2e.py
reads where each task ran and how it ended.
"""

from __future__ import annotations

import datetime as dt
from typing import Any

from airflow.sdk import DAG

from airflow_deferrable_kit.sensors.http import HttpBatchReadySensor
from airflow_deferrable_kit.sensors.kafka import KafkaMessageSensor
from airflow_deferrable_kit.sensors.postgres import PostgresBatchMarkerSensor
from airflow_deferrable_kit.sensors.s3 import S3KeySensor
from airflow_deferrable_kit.sensors.temporal import DateTimeSensor, TimeDeltaSensor, TimeSensor, WaitSensor

BUCKET = "adk-e2e-start"
BATCH = "{{ dag_run.conf['batch'] }}"
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
    # The run has no logical date, so ds is undefined: empty in the triggerer, not a moment (a worker
    # renders it strictly and would raise UndefinedError). One clear error, the trigger's, and never
    # a crashed triggerer.
    DateTimeSensor(task_id="bad_rendered_value", target_time="{{ ds }}", timeout=120, **IN_TRIGGERER)
    # Every other wait, templated from the run's conf where it takes a template.
    HttpBatchReadySensor(
        task_id="http_ready",
        http_conn_id="batch_api",
        endpoint=f"v1/batches/{BATCH}/status",
        success=[{"path": "state", "equals": "ready"}],
        poke_interval=1,
        timeout=120,
        **IN_TRIGGERER,
    )
    PostgresBatchMarkerSensor(
        task_id="postgres_marker",
        postgres_conn_id="warehouse",
        table="etl.batch_markers",
        match={"batch_id": BATCH},
        status_column="status",
        ready_values=["done"],
        poke_interval=1,
        timeout=120,
        **IN_TRIGGERER,
    )
    KafkaMessageSensor(
        task_id="kafka_message",
        kafka_conn_id="kafka_default",
        topics="batch-events",
        success=[{"key": f"batch-{BATCH}"}],
        poke_interval=1,
        timeout=120,
        **IN_TRIGGERER,
    )
    # The other outcomes on other kinds: a message that never comes skips (soft_fail), a table
    # that does not exist fails the task with the server's reason, both from the triggerer.
    KafkaMessageSensor(
        task_id="kafka_timeout_soft_fail_skips",
        kafka_conn_id="kafka_default",
        topics="batch-events",
        success=[{"key": "batch-never-{{ run_id }}"}],
        poke_interval=1,
        timeout=TIMEOUT_SECONDS,
        soft_fail=True,
        **IN_TRIGGERER,
    )
    PostgresBatchMarkerSensor(
        task_id="postgres_error_fails",
        postgres_conn_id="warehouse",
        table="etl.no_such_table",
        match={"batch_id": BATCH},
        status_column="status",
        ready_values=["done"],
        poke_interval=1,
        timeout=120,
        **IN_TRIGGERER,
    )
    # Mapped: Airflow 3.3.2 starts a mapped task on a worker whatever the flag (GH-52141); it still waits.
    S3KeySensor.partial(
        task_id="mapped_keys", aws_conn_id="s3_demo", poke_interval=1, timeout=120, **IN_TRIGGERER
    ).expand(bucket_key=[f"s3://{BUCKET}/{{{{ dag_run.conf['key'] }}}}"] * 2)
    # Moments a worker used to work out when the try started, worked out in the triggerer.
    TimeDeltaSensor(task_id="delta_after_run", delta=dt.timedelta(seconds=20), timeout=120, **IN_TRIGGERER)
    WaitSensor(task_id="wait_from_start", time_to_wait=dt.timedelta(seconds=12), timeout=120, **IN_TRIGGERER)
    TimeSensor(task_id="time_of_run_date", target_time="00:00", timeout=120, **IN_TRIGGERER)
