"""Wait for Kafka "batch done" events without holding a worker slot.

Needs an Airflow connection ``kafka_default`` of type ``kafka`` whose extra holds at least
``{"bootstrap.servers": "broker:9092"}`` (plus ``security.protocol`` / ``sasl.mechanism`` and the
login/password for SASL). Parsing this file makes no network call.
"""

from __future__ import annotations

import datetime as dt
from typing import Any

from airflow.sdk import DAG, task

from airflow_deferrable_kit.sensors.kafka import KafkaMessageSensor

with DAG(
    dag_id="example_kafka",
    schedule="@daily",
    start_date=dt.datetime(2024, 1, 1, tzinfo=dt.timezone.utc),
    catchup=False,
    tags=["example", "deferrable-kit", "kafka"],
) as dag:
    # 1. The loader publishes one message per finished batch on "batch-events", keyed
    #    "batch-<date>" (or "batch-<date>-failed" when it gives up), with a JSON value such as
    #    {"rows": 1234, "state": "done"}. Every message produced after this task first deferred is
    #    examined (nothing produced in between is missed); no consumer group is joined and nothing
    #    is committed. A failure key fails the task at once, naming the message.
    batch_done = KafkaMessageSensor(
        task_id="wait_batch_done",
        kafka_conn_id="kafka_default",
        topics="batch-events",
        success=[{"key": "batch-{{ ds }}"}],
        failure=[{"key": "batch-{{ ds }}-failed"}],
        deferrable=True,
        timeout=6 * 3600,
        poke_interval=60,
    )

    # 2. Match on the record key and a header, starting from the data interval's end (templated),
    #    so a message published before the task even started still counts.
    export_ready = KafkaMessageSensor(
        task_id="wait_export_ready",
        kafka_conn_id="kafka_default",
        topics=["exports", "exports-retry"],
        start_after="{{ data_interval_end }}",
        success=[{"key": "export-{{ ds_nodash }}"}, {"header": "x-export-id", "equals": "{{ ds_nodash }}"}],
        value_format="text",
        deferrable=True,
        timeout=3 * 3600,
    )

    # 3. Work-queue style: resume from a consumer group's committed offsets and commit the matched
    #    message once the task has resumed with it (at-least-once: a crash before the commit
    #    finds the same message again). The predicate is imported in the triggerer by name.
    next_large_batch = KafkaMessageSensor(
        task_id="wait_next_large_batch",
        kafka_conn_id="kafka_default",
        topics="batch-events",
        start_from="committed",
        group_id="airflow-large-batches",
        commit_on_match=True,
        success=[{"path": "state", "equals": "done"}],
        predicate="my_company.kafka_checks:is_large_batch",
        deferrable=True,
        timeout=24 * 3600,
    )

    @task
    def report(event: dict[str, Any]) -> str:
        """The sensor's XCom is the matched message: topic, partition, offset, key, headers, value."""
        return f"{event['topic']}[{event['partition']}]@{event['offset']}: {event['value']}"

    report(batch_done.output)
    report.override(task_id="report_export")(export_ready.output)
    report.override(task_id="report_large_batch")(next_large_batch.output)
