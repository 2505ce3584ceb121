"""End-to-end DAGs scheduled on assets whose watchers are the kit's event triggers: no sensor.

The test that serves this file (tests/e2e/test_events_e2e.py) names the bucket, table and batch
in the environment and defines the connections.
"""

from __future__ import annotations

import datetime as dt
import os

from airflow.providers.standard.operators.empty import EmptyOperator
from airflow.sdk import DAG, Asset, AssetWatcher

from airflow_deferrable_kit.triggers.http_events import HttpBatchReadyEventTrigger
from airflow_deferrable_kit.triggers.postgres_events import PostgresRowEventTrigger
from airflow_deferrable_kit.triggers.s3_events import S3KeyEventTrigger

BUCKET = os.environ.get("ADK_E2E_EVENTS_BUCKET", "adk-e2e-events")
TABLE = os.environ.get("ADK_E2E_EVENTS_TABLE", "adk_e2e_loads")
BATCH = os.environ.get("ADK_E2E_EVENTS_BATCH", "adk-e2e")

WATCHED = {
    "adk_e2e_s3_files": S3KeyEventTrigger(
        bucket_key=f"s3://{BUCKET}/drop/*.csv", wildcard_match=True, aws_conn_id="adk_e2e_s3", poll_interval=1
    ),
    "adk_e2e_pg_rows": PostgresRowEventTrigger(
        postgres_conn_id="adk_e2e_pg",
        table=TABLE,
        order_column="id",
        success=[{"column": "status", "equals": "done"}],
        poll_interval=1,
    ),
    "adk_e2e_http_ready": HttpBatchReadyEventTrigger(
        http_conn_id="adk_e2e_api",
        endpoint=f"v1/batches/{BATCH}/status",
        success=[{"path": "state", "equals": "ready"}],
        poll_interval=1,
    ),
}

for name, trigger in WATCHED.items():
    asset = Asset(name=name, watchers=[AssetWatcher(name=f"{name}_watcher", trigger=trigger)])
    with DAG(dag_id=f"{name}_consumer", schedule=[asset], start_date=dt.datetime(2024, 1, 1), catchup=False):
        EmptyOperator(task_id="consume")
