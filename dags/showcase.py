"""Showcase: five waits at once, none of them holding a worker slot while it waits.

Each sensor defers to the triggerer and hands back *what* it found as its XCom. ``make demo``
runs this DAG against local services and makes each condition true after a delay. The Kafka and
moment waits end in the triggerer (``end_from_trigger``); the moment wait also starts there
(``start_from_trigger``, Airflow 3.3+), so there it never takes a worker slot at all.

Connections (the demo sets them as ``AIRFLOW_CONN_*`` variables): ``s3_demo`` (aws, with an
``endpoint_url`` extra for a local S3 API), ``batch_api`` (http), ``warehouse`` (postgres) and
``kafka_default`` (kafka). The run's ``conf`` may set ``batch`` (default ``"demo"``) and
``moment_delay_seconds`` (default 30). Parsing this file opens no connection.
"""

from __future__ import annotations

import datetime as dt

import airflow
from airflow.sdk import DAG, Param
from packaging.version import Version

from airflow_deferrable_kit.sensors.http import HttpBatchReadySensor
from airflow_deferrable_kit.sensors.kafka import KafkaMessageSensor
from airflow_deferrable_kit.sensors.postgres import PostgresBatchMarkerSensor
from airflow_deferrable_kit.sensors.s3 import S3KeySensor
from airflow_deferrable_kit.sensors.temporal import DateTimeSensor

BATCH = "{{ params.batch }}"
WAIT = {"deferrable": True, "poke_interval": 5, "timeout": 1800}
#: Airflow 3.3+ starts a wait in the triggerer; on 3.2 the moment wait defers from a worker instead.
STARTS_IN_TRIGGERER = Version(airflow.__version__).release >= (3, 3)

with DAG(
    dag_id="deferrable_kit_showcase",
    schedule=None,
    start_date=dt.datetime(2024, 1, 1, tzinfo=dt.timezone.utc),
    catchup=False,
    params={"batch": Param("demo", type="string"), "moment_delay_seconds": Param(30, type="integer")},
    tags=["example", "deferrable-kit"],
) as dag:
    S3KeySensor(
        task_id="wait_s3_object",
        bucket_key=f"s3://adk-demo/exports/{BATCH}/_SUCCESS",
        aws_conn_id="s3_demo",
        **WAIT,
    )
    HttpBatchReadySensor(
        task_id="wait_http_batch_ready",
        http_conn_id="batch_api",
        endpoint=f"v1/batches/{BATCH}/status",
        success=[{"path": "state", "equals": "ready"}],
        failure=[{"path": "state", "in": ["failed"]}],
        **WAIT,
    )
    PostgresBatchMarkerSensor(
        task_id="wait_postgres_marker",
        postgres_conn_id="warehouse",
        table="etl.batch_markers",
        match={"batch_id": BATCH},
        status_column="status",
        ready_values=["done"],
        failed_values=["failed"],
        **WAIT,
    )
    KafkaMessageSensor(
        task_id="wait_kafka_message",
        kafka_conn_id="kafka_default",
        topics="batch-events",
        success=[{"key": f"batch-{BATCH}"}],
        end_from_trigger=True,  # finished by the triggerer: no worker slot on resume
        **WAIT,
    )
    DateTimeSensor(
        task_id="wait_moment",
        # A moment `moment_delay_seconds` after the task starts, in UTC.
        target_time="{{ macros.datetime.fromtimestamp(macros.time.time() + params.moment_delay_seconds,"
        " macros.dateutil.tz.UTC).isoformat() }}",
        start_from_trigger=STARTS_IN_TRIGGERER,  # the scheduler hands it to the triggerer: no worker at all
        end_from_trigger=True,
        **WAIT,
    )
