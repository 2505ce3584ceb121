"""Wait for upstream batches marked in Postgres, then load them.

Two waits, both deferrable (no worker slot while waiting):

* the declarative form: a marker row in ``etl.batch_markers`` for today's ``orders`` batch,
  ready when ``status`` is ``done``, failed when it is ``failed`` or ``aborted``. A database
  trigger NOTIFYs ``batch_markers`` so the wait wakes at once instead of at the next poll.
* the custom-SQL form: the newest ``etl.load_runs`` row for ``clicks`` decides, with acceptors
  on its columns.

Needs an Airflow connection ``warehouse`` of type postgres. Parsing this file opens no connection.
"""

from __future__ import annotations

import datetime as dt
from typing import Any

from airflow.sdk import DAG, task

from airflow_deferrable_kit.sensors.postgres import PostgresBatchMarkerSensor

with DAG(
    dag_id="example_postgres_batch_marker",
    schedule="@daily",
    start_date=dt.datetime(2024, 1, 1, tzinfo=dt.timezone.utc),
    catchup=False,
    tags=["example", "deferrable-kit", "postgres"],
) as dag:
    orders_marker = PostgresBatchMarkerSensor(
        task_id="wait_for_orders_marker",
        postgres_conn_id="warehouse",
        table="etl.batch_markers",
        match={"batch_id": "orders", "batch_date": "{{ ds }}"},
        status_column="status",
        ready_values=["done"],
        failed_values=["failed", "aborted"],
        order_by=["created_at desc"],  # the newest attempt decides
        notify_channel="batch_markers",
        deferrable=True,
        poke_interval=300,  # NOTIFY wakes it sooner; polling is the fallback
        timeout=6 * 3600,
    )

    clicks_loaded = PostgresBatchMarkerSensor(
        task_id="wait_for_clicks_load",
        postgres_conn_id="warehouse",
        sql="""
            SELECT state, row_count, finished_at
            FROM etl.load_runs
            WHERE dataset = $1 AND run_date = $2
            ORDER BY finished_at DESC NULLS FIRST
        """,
        parameters=["clicks", "{{ ds }}"],
        success=[{"column": "state", "equals": "succeeded"}],
        failure=[{"column": "state", "in": ["failed", "cancelled"]}],
        deferrable=True,
        poke_interval=120,
        timeout=4 * 3600,
    )

    @task
    def load(marker: dict[str, Any], clicks: dict[str, Any]) -> str:
        row = marker["row"]
        return f"loading {row['batch_id']} for {row['batch_date']} ({clicks['row']['row_count']} clicks rows)"

    load(orders_marker.output, clicks_loaded.output)
