"""End-to-end DAGs for bursts: one asset per event trigger kind, each consumed by a DAG of its own.

Served by tests/e2e/test_bursts_e2e.py, which names the bucket, table, topic, batch and flag file
in the environment and defines the connections. The consumers do nothing: the test reads which
runs consumed which asset events from the metadata database.
"""

from __future__ import annotations

import datetime as dt
import os

from adk_burst_waits import FlagFileTrigger  # type: ignore[import-not-found]
from airflow.providers.standard.operators.empty import EmptyOperator
from airflow.sdk import DAG, Asset, AssetWatcher

from airflow_deferrable_kit.triggers.http_events import HttpBatchReadyEventTrigger
from airflow_deferrable_kit.triggers.kafka_events import KafkaMessageEventTrigger
from airflow_deferrable_kit.triggers.postgres_events import PostgresRowEventTrigger
from airflow_deferrable_kit.triggers.s3_events import S3KeyEventTrigger

BUCKET = os.environ.get("ADK_E2E_BURST_BUCKET", "adk-e2e-bursts")
TABLE = os.environ.get("ADK_E2E_BURST_TABLE", "adk_e2e_bursts")
TOPIC = os.environ.get("ADK_E2E_BURST_TOPIC", "adk-e2e-bursts")
BATCH = os.environ.get("ADK_E2E_BURST_BATCH", "adk-e2e-bursts")
FLAG = os.environ.get("ADK_E2E_BURST_FLAG", "/tmp/adk-e2e-burst-flag")

WATCHED = {
    "adk_burst_s3": S3KeyEventTrigger(
        bucket_key=f"s3://{BUCKET}/burst/*.csv", wildcard_match=True, aws_conn_id="adk_e2e_s3", poll_interval=1
    ),
    "adk_burst_pg": PostgresRowEventTrigger(
        postgres_conn_id="adk_e2e_pg", table=TABLE, order_column="id", poll_interval=1
    ),
    "adk_burst_kafka": KafkaMessageEventTrigger(topics=[TOPIC], kafka_conn_id="adk_e2e_kafka", poll_interval=1),
    "adk_burst_http": HttpBatchReadyEventTrigger(
        http_conn_id="adk_e2e_api",
        endpoint=f"v1/batches/{BATCH}/status",
        success=[{"path": "state", "equals": "ready"}],
        poll_interval=1,
    ),
    "adk_burst_condition": FlagFileTrigger(path=FLAG, poll_interval=1).as_event_trigger(),
}

for name, trigger in WATCHED.items():
    asset = Asset(name=name, watchers=[AssetWatcher(name=f"{name}_watcher", trigger=trigger)])
    with DAG(dag_id=f"{name}_consumer", schedule=[asset], start_date=dt.datetime(2024, 1, 1), catchup=False):
        EmptyOperator(task_id="consume")
