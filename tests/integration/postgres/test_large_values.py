"""A met condition on a large row is a success, whatever the size of the value that decided it."""

from __future__ import annotations

import json

import asyncpg

from airflow_deferrable_kit.payload import MAX_PAYLOAD_BYTES, json_size
from airflow_deferrable_kit.testing import run_trigger_payload
from airflow_deferrable_kit.triggers.postgres import PostgresBatchMarkerTrigger


async def test_a_success_condition_on_a_100_kb_jsonb_value_succeeds_and_fits(
    conn_id: str, admin: asyncpg.Connection, markers: str
) -> None:
    doc = {"state": "ready", "files": [f"s3://lake/orders/part-{i:05}.parquet" for i in range(2_800)]}
    assert len(json.dumps(doc)) > 100_000
    await admin.execute(
        f"INSERT INTO {markers} (batch_id, status, meta) VALUES ('big', 'x', $1::jsonb)", json.dumps(doc)
    )
    trigger = PostgresBatchMarkerTrigger(
        postgres_conn_id=conn_id,
        sql=f"SELECT batch_id, meta FROM {markers} WHERE batch_id = $1",
        parameters=["big"],
        success=[{"path": "meta", "exists": True}],  # the deciding value is the whole ~100 KB document
        poll_interval=0.05,
    )
    payload = await run_trigger_payload(trigger)
    assert payload["status"] == "success"  # was: error payload_error ... 104436 bytes
    assert json_size(payload) <= MAX_PAYLOAD_BYTES
    assert payload["row"]["batch_id"] == "big"
    assert payload["matched"]["argument"] == "meta" and "more characters" in payload["matched"]["actual"]
    assert "meta" in payload["truncated_columns"]
