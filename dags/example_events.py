"""Start DAG runs when something happens outside, with no sensor task: asset watchers.

Each asset below has an ``AssetWatcher`` whose trigger runs in the triggerer for ever and fires
asset events; the DAG scheduled on the asset runs for them, and its ``triggering_asset_events``
say what happened (the payload is in ``event.extra["payload"]``). The S3 and Postgres watchers
fire what one look found as one event, ``{"items": [...], "count": n}``, one item per object or
row; the HTTP watcher fires one event per transition. Events of one watcher are at least
``min_event_interval`` (5 s) apart, so each joins a DAG run (docs/events.md says why).

* ``landed_orders``: the new ``.csv`` objects under ``s3://adk-demo/incoming/`` (an item per
  object: key, size, ETag, last-modified). Objects already there when the watcher first runs do
  not fire.
* ``finished_batches``: the new rows of ``etl.batch_markers`` whose status is ``done``, in ``id``
  order (an item per row); the table's NOTIFY on channel ``batch_markers`` wakes the watcher.
* ``demo_batch_ready``: each time the batch API says batch ``demo`` went to ``ready``.

Connections ``s3_demo``, ``warehouse`` and ``batch_api`` are defined by docker-compose.yaml. This
file makes no network call when parsed. See docs/events.md for the delivery semantics.
"""

from __future__ import annotations

import datetime as dt
from typing import Any

from airflow.sdk import DAG, Asset, AssetWatcher, task

from airflow_deferrable_kit.triggers.http_events import HttpBatchReadyEventTrigger
from airflow_deferrable_kit.triggers.postgres_events import PostgresRowEventTrigger
from airflow_deferrable_kit.triggers.s3_events import S3KeyEventTrigger

new_orders = S3KeyEventTrigger(
    bucket_key="s3://adk-demo/incoming/*.csv",
    wildcard_match=True,
    aws_conn_id="s3_demo",
    poll_interval=30,  # one listing of incoming/ every 30 s, however many assets watch it
)
landed_orders = Asset(name="landed_orders", watchers=[AssetWatcher(name="new_csv", trigger=new_orders)])

done_markers = PostgresRowEventTrigger(
    postgres_conn_id="warehouse",
    table="etl.batch_markers",
    success=[{"column": "status", "equals": "done"}],
    order_column="id",
    notify_channel="batch_markers",
    poll_interval=300,  # the NOTIFY wakes it at once; the poll is the safety net
)
finished_batches = Asset(name="finished_batches", watchers=[AssetWatcher(name="done_marker", trigger=done_markers)])

batch_ready = HttpBatchReadyEventTrigger(
    http_conn_id="batch_api",
    endpoint="v1/batches/demo/status",
    success=[{"path": "state", "equals": "ready"}],
    select=["rows"],
    poll_interval=60,
)
demo_batch_ready = Asset(name="demo_batch_ready", watchers=[AssetWatcher(name="ready", trigger=batch_ready)])

START = dt.datetime(2024, 1, 1, tzinfo=dt.timezone.utc)


def payloads(events: Any) -> list[dict[str, Any]]:
    """The payloads of a run's triggering asset events (several may arrive in one run)."""
    return [event.extra.get("payload", {}) for asset_events in events.values() for event in asset_events]


def items(events: Any) -> list[dict[str, Any]]:
    """The items (objects, rows) of a run's triggering asset events, each once by its ``event_id``.

    A triggerer killed between storing an event and saving its watermark fires the same items
    again, with the same ``event_id``s: within one run, this keeps the first copy.
    """
    seen: dict[str, dict[str, Any]] = {}
    for payload in payloads(events):
        for item in payload.get("items", []):
            seen.setdefault(item["event_id"], item)
    return list(seen.values())


with DAG(dag_id="example_load_landed_orders", schedule=[landed_orders], start_date=START, catchup=False,
         tags=["deferrable-kit", "events", "example"], doc_md=__doc__) as load_dag:  # fmt: skip

    @task
    def load(triggering_asset_events: Any = None) -> list[str]:
        """Every object the run's events carry: all that one listing found, in one run."""
        return [f"s3://{o['bucket']}/{o['key']}" for o in items(triggering_asset_events)]

    load()

with DAG(dag_id="example_publish_finished_batches", schedule=[finished_batches], start_date=START, catchup=False,
         tags=["deferrable-kit", "events", "example"], doc_md=__doc__) as publish_dag:  # fmt: skip

    @task
    def publish(triggering_asset_events: Any = None) -> list[str]:
        return [r["row"]["batch_id"] for r in items(triggering_asset_events)]

    publish()

with DAG(dag_id="example_refresh_on_demo_batch", schedule=[demo_batch_ready], start_date=START, catchup=False,
         tags=["deferrable-kit", "events", "example"], doc_md=__doc__) as refresh_dag:  # fmt: skip

    @task
    def refresh(triggering_asset_events: Any = None) -> list[Any]:
        return [p.get("fields", {}).get("rows") for p in payloads(triggering_asset_events)]

    refresh()
