"""End-to-end DAG: every wait kind, every outcome, every way a wait can run, in one DAG run.

Kinds: S3, HTTP, Postgres, Kafka, DateTime. Outcomes: the condition is met (``success``), never
met (``timeout``, and ``soft_fail`` with ``soft_fail=True``), or the wait ends with an error
(``error``: the bucket deleted for S3, the upstream saying "failed" for HTTP, Postgres and Kafka,
a rendered moment that is not one for DateTime). Modes: deferred from a worker and resumed on one
(``deferrable``), ended from the triggerer (``end_from_trigger``), started and ended in the
triggerer (``in_triggerer``). Every task is ``{kind}_{outcome}_{mode}`` and has ``retries=1``:
tests/e2e/test_outcome_matrix_e2e.py reads each one's state, tries, worker starts and XCom and
compares them with what Airflow's own sensors do in the same situation.

The run's conf names what the test makes true once the waits deferred (``batch``: a key, a
batch, a row and a message per outcome, a bucket to delete; ``soon``: the moment).
``check_before_defer=False``: each outcome is reached by the trigger, not by a first look on the
worker.
"""

from __future__ import annotations

import datetime as dt
from typing import Any

from airflow.sdk import DAG

from airflow_deferrable_kit.sensors.http import HttpBatchReadySensor
from airflow_deferrable_kit.sensors.kafka import KafkaMessageSensor
from airflow_deferrable_kit.sensors.postgres import PostgresBatchMarkerSensor
from airflow_deferrable_kit.sensors.s3 import S3KeySensor
from airflow_deferrable_kit.sensors.temporal import DateTimeSensor

DAG_ID = "adk_e2e_matrix"
BUCKET = "adk-demo"  # the showcase's bucket, table and topic (scripts/demo.py)
TOPIC = "batch-events"
BATCH = "{{ dag_run.conf['batch'] }}"
NEVER = "2999-01-01T00:00:00+00:00"
#: The budget of the waits that never succeed. Long enough that the timeout comes well after the
#: deferral (a resume within a second or so of deferring races Airflow 3.3.2's bookkeeping).
TIMEOUT_SECONDS = 10
MODES: dict[str, dict[str, Any]] = {
    "deferrable": {"deferrable": True},
    "end_from_trigger": {"deferrable": True, "end_from_trigger": True},
    "in_triggerer": {"deferrable": True, "start_from_trigger": True, "end_from_trigger": True},
}
OUTCOMES = ("success", "timeout", "soft_fail", "error")
KINDS = ("s3", "http", "postgres", "kafka", "datetime")
#: Which batch (key, row, message) each outcome waits on; "never" is never made.
WAITS_ON = {"success": "ready", "timeout": "never", "soft_fail": "never", "error": "failed"}


def sensor(kind: str, outcome: str, task_id: str, common: dict[str, Any]) -> None:
    target = f"{BATCH}-{WAITS_ON[outcome]}"
    if kind == "s3":
        if outcome == "error":  # listing a bucket the test deletes once the wait deferred: fatal
            S3KeySensor(task_id=task_id, bucket_key=f"s3://adk-{BATCH}/*.csv", wildcard_match=True,
                        aws_conn_id="s3_demo", **common)  # fmt: skip
        else:
            S3KeySensor(task_id=task_id, bucket_key=f"s3://{BUCKET}/matrix/{target}.csv", aws_conn_id="s3_demo",
                        **common)  # fmt: skip
    elif kind == "http":
        HttpBatchReadySensor(
            task_id=task_id,
            http_conn_id="batch_api",
            endpoint=f"v1/batches/{target}/status",
            success=[{"path": "state", "equals": "ready"}],
            failure=[{"path": "state", "in": ["failed"]}],
            **common,
        )
    elif kind == "postgres":
        PostgresBatchMarkerSensor(
            task_id=task_id,
            postgres_conn_id="warehouse",
            table="etl.batch_markers",
            match={"batch_id": target},
            status_column="status",
            ready_values=["done"],
            failed_values=["failed"],
            **common,
        )
    elif kind == "kafka":
        KafkaMessageSensor(
            task_id=task_id,
            kafka_conn_id="kafka_default",
            topics=TOPIC,
            start_from="earliest",
            # From the start of the log: the messages were produced before the run. Only the
            # error tasks know the "failed" message; the others would otherwise end on it too.
            success=[{"key": f"matrix-{BATCH}-{'ready' if outcome == 'success' else 'never'}"}],
            failure=[{"key": f"matrix-{BATCH}-failed"}] if outcome == "error" else None,
            **common,
        )
    else:
        moment = {"success": "{{ dag_run.conf['soon'] }}", "error": "{{ ds }}"}.get(outcome, NEVER)
        DateTimeSensor(task_id=task_id, target_time=moment, **common)


with DAG(dag_id=DAG_ID, schedule=None, start_date=dt.datetime(2024, 1, 1), catchup=False, max_active_tasks=64):
    for kind in KINDS:
        for outcome in OUTCOMES:
            for mode, flags in MODES.items():
                common: dict[str, Any] = {
                    "poke_interval": 2,
                    "timeout": 300 if outcome in ("success", "error") else TIMEOUT_SECONDS,
                    "soft_fail": outcome == "soft_fail",
                    "retries": 1,
                    "retry_delay": dt.timedelta(seconds=1),
                    "check_before_defer": False,
                    **flags,
                }
                sensor(kind, outcome, f"{kind}_{outcome}_{mode}", common)
