"""The soak benchmark's DAGs (benchmarks/event_soak.py): one watched asset per kind, a consumer each.

The consumers are ``EmptyOperator``s, which the scheduler finishes without a worker: what is
measured is delivery (asset events stored, their items, their latency), not task throughput.
"""

from __future__ import annotations

import datetime as dt
import os

from airflow.providers.standard.operators.empty import EmptyOperator
from airflow.sdk import DAG, Asset, AssetWatcher

from airflow_deferrable_kit.triggers.http_events import HttpBatchReadyEventTrigger
from airflow_deferrable_kit.triggers.kafka_events import KafkaMessageEventTrigger
from airflow_deferrable_kit.triggers.postgres_events import PostgresRowEventTrigger
from airflow_deferrable_kit.triggers.s3_events import S3KeyEventTrigger

BUCKET = os.environ.get("ADK_E2E_EVENTS_BUCKET", "adk-soak")
TABLE = os.environ.get("ADK_E2E_EVENTS_TABLE", "adk_soak_rows")
BATCH = os.environ.get("ADK_E2E_EVENTS_BATCH", "adk-soak")
TOPIC = os.environ.get("ADK_E2E_EVENTS_TOPIC", "adk-soak")

WATCHED = {
    "adk_soak_s3": S3KeyEventTrigger(
        bucket_key=f"s3://{BUCKET}/drop/*.csv", wildcard_match=True, aws_conn_id="adk_e2e_s3", poll_interval=2
    ),
    "adk_soak_pg": PostgresRowEventTrigger(
        postgres_conn_id="adk_e2e_pg", table=TABLE, order_column="id", poll_interval=2
    ),
    "adk_soak_kafka": KafkaMessageEventTrigger(topics=[TOPIC], kafka_conn_id="adk_e2e_kafka", poll_interval=2),
    "adk_soak_http": HttpBatchReadyEventTrigger(
        http_conn_id="adk_e2e_api",
        endpoint=f"v1/batches/{BATCH}/status",
        success=[{"path": "state", "equals": "ready"}],
        poll_interval=2,
    ),
}

for name, trigger in WATCHED.items():
    asset = Asset(name=name, watchers=[AssetWatcher(name=f"{name}_watcher", trigger=trigger)])
    with DAG(dag_id=f"{name}_consumer", schedule=[asset], start_date=dt.datetime(2024, 1, 1), catchup=False):
        EmptyOperator(task_id="consume")
