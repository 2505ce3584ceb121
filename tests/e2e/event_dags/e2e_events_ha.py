"""DAGs on assets watched by the kit's event triggers, whose consumers deduplicate what they get.

Served by tests/e2e/test_events_ha_e2e.py (two triggerers on one metadata DB), which names the
bucket, table and batch in the environment and defines the connections. Each consumer runs the
deduplication recipe of docs/events.md: an item whose ``event_id`` an earlier asset event of
the same asset already carried is a repeat (a triggerer that died between storing an event and
saving its watermark fires it again), and is skipped.
"""

from __future__ import annotations

import datetime as dt
import os
from typing import Any

from airflow.sdk import DAG, Asset, AssetWatcher, task

from airflow_deferrable_kit.triggers.http_events import HttpBatchReadyEventTrigger
from airflow_deferrable_kit.triggers.postgres_events import PostgresRowEventTrigger
from airflow_deferrable_kit.triggers.s3_events import S3KeyEventTrigger

BUCKET = os.environ.get("ADK_E2E_HA_BUCKET", "adk-e2e-ha")
TABLE = os.environ.get("ADK_E2E_HA_TABLE", "adk_e2e_ha_loads")
BATCH = os.environ.get("ADK_E2E_HA_BATCH", "adk-e2e-ha")
#: How far back a repeat's first delivery is looked for: longer than a triggerer takeover.
LOOKBACK = dt.timedelta(hours=1)


def items_of(event: Any) -> list[Any]:
    """What one asset event carries: the items of an S3 / Postgres / Kafka event, else its payload."""
    payload = (event.extra or {}).get("payload") or {}
    return list(payload["items"]) if isinstance(payload.get("items"), list) else [payload]


def first_deliveries(asset: Asset, triggering_asset_events: Any, inlet_events: Any) -> tuple[list[Any], list[Any]]:
    """This run's items of ``asset`` delivered for the first time, and the ``event_id``s repeated.

    A repeat carries the ``event_id`` of an item of an asset event of the same asset stored
    before it (the first delivery, consumed by this run or an earlier one), so one look at the
    asset's events from ``LOOKBACK`` before this run's first event to its last tells them apart.
    """
    events = sorted(triggering_asset_events[asset], key=lambda event: event.timestamp)
    if not events:
        return [], []
    stored = inlet_events[asset].after((events[0].timestamp - LOOKBACK).isoformat())
    first_stored: dict[Any, dt.datetime] = {}
    for event in stored.before(events[-1].timestamp.isoformat()):
        for item in items_of(event):
            event_id = item.get("event_id")
            if event_id is not None and (event_id not in first_stored or event.timestamp < first_stored[event_id]):
                first_stored[event_id] = event.timestamp
    fresh, repeats = [], []
    for event in events:
        for item in items_of(event):
            event_id = item.get("event_id")
            if event_id is not None and first_stored.get(event_id, event.timestamp) < event.timestamp:
                repeats.append(event_id)
            else:
                fresh.append(item)
    return fresh, repeats


WATCHED = {
    "adk_e2e_ha_s3": S3KeyEventTrigger(
        bucket_key=f"s3://{BUCKET}/drop/*.csv", wildcard_match=True, aws_conn_id="adk_e2e_s3", poll_interval=1
    ),
    "adk_e2e_ha_pg": PostgresRowEventTrigger(
        postgres_conn_id="adk_e2e_pg", table=TABLE, order_column="id", poll_interval=1
    ),
    "adk_e2e_ha_http": HttpBatchReadyEventTrigger(
        http_conn_id="adk_e2e_api",
        endpoint=f"v1/batches/{BATCH}/status",
        success=[{"path": "state", "equals": "ready"}],
        poll_interval=1,
    ),
}


def consumer(asset: Asset) -> Any:
    @task(task_id="consume", inlets=[asset])
    def consume(triggering_asset_events: Any = None, inlet_events: Any = None) -> Any:
        fresh, repeats = first_deliveries(asset, triggering_asset_events, inlet_events)
        return {"fresh": [payload["event_id"] for payload in fresh], "repeats": repeats}

    return consume()


for name, trigger in WATCHED.items():
    asset = Asset(name=name, watchers=[AssetWatcher(name=f"{name}_watcher", trigger=trigger)])
    with DAG(dag_id=f"{name}_consumer", schedule=[asset], start_date=dt.datetime(2024, 1, 1), catchup=False):
        consumer(asset)
