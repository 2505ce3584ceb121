"""No connection secret reaches Airflow's ``trigger`` table on a real end-to-end run.

Airflow 3 stores trigger kwargs in plain text. This runs the showcase DAG once more (its own
batch) on the session's Airflow and, the moment all five sensors are deferred — the only time
their ``trigger`` rows exist — reads every row of the table from the metadata DB (read-only) and
checks that no secret of the showcase's connections is in it: the batch API token, the S3
secret key, passwords, auth headers.
"""

from __future__ import annotations

import dataclasses
import json
import sqlite3
import uuid
from typing import Any

import pytest

from scripts.demo import API_TOKEN, Showcase, run_showcase

pytestmark = pytest.mark.e2e

TRIGGERS = {
    "airflow_deferrable_kit.triggers.s3.S3KeyTrigger",
    "airflow_deferrable_kit.triggers.http.HttpBatchReadyTrigger",
    "airflow_deferrable_kit.triggers.postgres.PostgresBatchMarkerTrigger",
    "airflow_deferrable_kit.triggers.kafka.KafkaMessageTrigger",
    "airflow_deferrable_kit.triggers.temporal.DateTimeTrigger",
}


def trigger_rows(show: Showcase) -> list[dict[str, Any]]:
    db = show.airflow.home / "airflow.db"
    conn = sqlite3.connect(f"file:{db}?mode=ro", uri=True, timeout=30)
    try:
        conn.row_factory = sqlite3.Row
        return [dict(row) for row in conn.execute("SELECT * FROM trigger")]
    finally:
        conn.close()


def test_no_connection_secret_in_any_trigger_row(showcase: Showcase) -> None:
    show = dataclasses.replace(showcase, batch=f"secrets-{uuid.uuid4().hex[:8]}", made_true={})
    snapshots: list[list[dict[str, Any]]] = []

    watched = run_showcase(
        show,
        delay=1.0,
        log=lambda line: print(line, flush=True),
        on_all_deferred=lambda: snapshots.append(trigger_rows(show)),
    )

    assert watched.run_state == "success", watched.states
    assert len(snapshots) == 1
    rows = snapshots[0]
    classpaths = {row["classpath"] for row in rows}
    assert classpaths >= TRIGGERS, classpaths  # one row per deferred wait, all five kinds
    assert any(show.batch in str(row["kwargs"]) for row in rows)  # the rows are this run's
    text = json.dumps(rows, default=str)
    # The kwargs are readable plain text (so this scan is not vacuous) and name only conn ids.
    for conn_id in ("s3_demo", "batch_api", "warehouse", "kafka_default"):
        assert conn_id in text
    for secret in (API_TOKEN, f"Bearer {API_TOKEN}", '"password"', "aws_secret_access_key", "Authorization"):
        assert secret not in text, secret
