"""Wait for files in S3 without holding a worker slot, then use what was found.

* ``wait_for_orders``: any ``.csv`` of at least 1 byte under today's prefix (a wildcard over a
  paginated listing, nested folders included); the XCom lists the matched keys.
* ``wait_for_export``: a manifest *and* a ``_SUCCESS`` marker (a list: all must exist).
* ``wait_in_worker``: the same check in classic poke mode, for comparison (``deferrable=False``).

Only connection ids appear here: credentials stay in the ``aws`` connection ``s3_demo`` (defined by
docker-compose.yaml, bucket ``adk-demo``). This file makes no network call when parsed. To finish
the waits of the run for 2024-06-01, put ``orders/2024-06-01/part-0.csv``,
``exports/2024-06-01/manifest.json``, ``exports/2024-06-01/_SUCCESS`` and
``flags/2024-06-01.ready`` into the bucket.
"""

from __future__ import annotations

import datetime as dt
from typing import Any

from airflow.sdk import DAG, task

from airflow_deferrable_kit.sensors.s3 import S3KeySensor

with DAG(
    dag_id="example_s3_key_wait",
    schedule="@daily",
    start_date=dt.datetime(2024, 1, 1, tzinfo=dt.timezone.utc),
    catchup=False,
    tags=["deferrable-kit", "s3", "example"],
    doc_md=__doc__,
) as dag:
    wait_for_orders = S3KeySensor(
        task_id="wait_for_orders",
        bucket_key="s3://adk-demo/orders/{{ ds }}/*.csv",
        wildcard_match=True,
        min_size=1,
        aws_conn_id="s3_demo",
        deferrable=True,
        poke_interval=60,  # seconds between polls; transient errors back off up to max_backoff
        timeout=6 * 3600,  # one budget for the whole wait, however often it is re-deferred
        soft_fail=True,  # skip (not fail) if nothing arrives in time; errors still fail
    )

    wait_for_export = S3KeySensor(
        task_id="wait_for_export",
        bucket_name="adk-demo",
        bucket_key=["exports/{{ ds }}/manifest.json", "exports/{{ ds }}/_SUCCESS"],
        aws_conn_id="s3_demo",
        deferrable=True,
        end_from_trigger=True,  # the triggerer finishes the task: no worker slot on resume
        poke_interval=120,
        timeout=12 * 3600,
    )

    wait_in_worker = S3KeySensor(
        task_id="wait_in_worker",
        bucket_key="s3://adk-demo/flags/{{ ds }}.ready",
        aws_conn_id="s3_demo",
        deferrable=False,
        mode="reschedule",
        poke_interval=300,
        timeout=3600,
    )

    @task
    def load_orders(found: dict[str, Any]) -> list[str]:
        """The sensor's XCom: every matched object with its size, ETag and last-modified time."""
        keys = [f"s3://{obj['bucket']}/{obj['key']}" for obj in found["keys"]]
        if found["keys_not_listed"]:
            print(f"{found['keys_not_listed']} more objects matched; list the prefix to get them all")
        return keys

    load_orders(wait_for_orders.output)
