"""The audit's shared requests made by several triggerers, read from real deferrals' trigger rows.

Each deferred task comes from a sensor's own ``execute()`` and is stored as Airflow stores it
(tests/integration/plugins/conftest.py), on SQLite and PostgreSQL metadata DBs.
"""

from __future__ import annotations

import datetime as dt
import json
from typing import Any

from airflow.providers.standard.sensors.date_time import DateTimeSensorAsync
from airflow.sdk import DAG

from airflow_deferrable_kit.audit import render_html, run_audit, upstream_of
from airflow_deferrable_kit.sensors.http import HttpBatchReadySensor
from airflow_deferrable_kit.sensors.postgres import PostgresBatchMarkerSensor
from airflow_deferrable_kit.sensors.s3 import S3KeySensor
from airflow_deferrable_kit.sensors.temporal import DateTimeSensor
from airflow_deferrable_kit.triggers.s3_events import S3KeyEventTrigger
from tests.integration.audit.conftest import MetadataDB
from tests.integration.plugins.conftest import Deployment

UTC = dt.timezone.utc
LATER = (dt.datetime.now(UTC) + dt.timedelta(days=2)).isoformat()
DEFER = {"deferrable": True, "check_before_defer": False, "timeout": 3600}


def s3_wait(task_id: str, key: str, **kwargs: Any) -> S3KeySensor:
    return S3KeySensor(task_id=task_id, bucket_key=key, **DEFER, **kwargs)


def test_one_folders_waits_on_two_triggerers_are_named_with_the_recipe_and_one_triggerers_are_not(
    metadata_db: MetadataDB,
) -> None:
    deployment = Deployment(metadata_db)
    a, b = deployment.triggerer("triggerer-a"), deployment.triggerer("triggerer-b")
    with DAG("exports", schedule=None):
        spread = [s3_wait(f"part_{n}", f"s3://raw/exports/2025-06-15/part-{n}.csv") for n in range(3)]
        together = [
            HttpBatchReadySensor(task_id=f"batch_{n}", http_conn_id="api", endpoint="v1/status", **DEFER)
            for n in range(2)
        ]
        moments = [DateTimeSensor(task_id=f"moment_{n}", target_time=LATER, deferrable=True) for n in range(2)]
        official = [DateTimeSensorAsync(task_id=f"official_{n}", target_time=LATER) for n in range(2)]
    for number, task in enumerate(spread):
        deployment.defer(task, triggerer_id=(a, b)[number % 2])
    for task in together:
        deployment.defer(task, triggerer_id=a)
    for number, task in enumerate([*moments, *official]):  # nothing shared: never reported
        deployment.defer(task, triggerer_id=(a, b)[number % 2])

    report = run_audit(metadata_db.url, now=dt.datetime.now(UTC))
    [found] = report.spread
    assert (found.upstream.kind, found.upstream.name, found.upstream.shared) == (
        "s3",
        "aws_default: s3://raw/exports/2025-06-15/",
        "listing",
    )
    assert (found.waits, found.watchers, found.triggerers) == (3, 0, 2)
    assert "its listing is made 2 times per poll" in found.advice()
    assert "give the 3 deferred task(s) one trigger_queue" in found.advice()
    assert "docs/operations.md#one-upstream-one-pool-of-triggerers" in found.advice()
    table = report.to_table()
    assert "Shared requests made by several triggerers" in table
    assert "aws_default: s3://raw/exports/2025-06-15/" in table
    assert json.loads(report.to_json())["shared_requests_multiplied"] == [found.as_dict()]
    assert 'id="shared-requests"' in render_html(report)


def test_waits_already_routed_and_watchers_get_the_advice_that_applies_to_them(metadata_db: MetadataDB) -> None:
    deployment = Deployment(metadata_db)
    a, b = deployment.triggerer("pool-a"), deployment.triggerer("pool-b")
    with DAG("routed", schedule=None):
        routed = [
            PostgresBatchMarkerSensor(
                task_id=f"marker_{n}", postgres_conn_id="warehouse", table="batches", trigger_queue="trg-pg", **DEFER
            )
            for n in range(2)
        ]
    for number, task in enumerate(routed):
        trigger = deployment.defer(task, triggerer_id=(a, b)[number])
        assert trigger is not None
    rows = deployment.tables["trigger"]
    with metadata_db.engine.begin() as connection:  # the queue Airflow stored with each deferral
        connection.execute(rows.update().values(queue="trg-pg"))
    classpath, kwargs = S3KeyEventTrigger(bucket_key="s3://landing/in/*.csv", wildcard_match=True).serialize()
    for number in range(2):
        deployment.watcher(
            asset=f"landing_{number}", name=f"w{number}", classpath=classpath, kwargs=kwargs, dag_id="consumer",
            triggerer_id=(a, b)[number],
        )  # fmt: skip

    report = run_audit(metadata_db.url, now=dt.datetime.now(UTC))
    by_kind = {spread.upstream.kind: spread for spread in report.spread}
    assert set(by_kind) == {"postgres", "s3"}, report.spread
    assert by_kind["postgres"].upstream.name == "warehouse: table batches"
    assert "already routed (trg-pg): that pool has 2 triggerers" in by_kind["postgres"].advice()
    assert (by_kind["s3"].waits, by_kind["s3"].watchers) == (2, 2)
    assert "these are watchers, which Airflow 3.3.2 routes by no queue" in by_kind["s3"].advice()
    # narrowed to DAGs (as the Waits page narrows it to what a user may read): watchers belong to none
    narrowed = run_audit(metadata_db.url, now=dt.datetime.now(UTC), dag_ids=["routed"])
    assert [spread.upstream.kind for spread in narrowed.spread] == ["postgres"]
    assert run_audit(metadata_db.url, now=dt.datetime.now(UTC), dag_ids=["other"]).spread == []


def test_an_upstream_is_named_without_secrets_and_a_query_by_its_digest() -> None:
    http = upstream_of("http", {"http_conn_id": "api", "method": "get", "endpoint": "v1/s?api_key=hunter2"})
    assert http is not None and http.name == "api: GET v1/s?…" and "hunter2" not in http.name
    query = upstream_of("postgres", {"postgres_conn_id": "db", "sql": "SELECT 1 WHERE token = 'hunter2'"})
    assert query is not None and query.name.startswith("db: query ") and "hunter2" not in query.name
    wildcard = upstream_of("s3", {"bucket_name": "raw", "bucket_key": "in/2025/*/part-*.csv"})
    assert wildcard is not None and wildcard.name == "s3://raw/in/2025/"
    kafka = upstream_of("kafka", {"kafka_conn_id": "events", "topics": ["a", "b"]})
    assert kafka is not None and (kafka.name, kafka.shared) == ("events: Kafka connection", "reader")
    assert upstream_of("datetime", {"target_time": LATER}) is None
