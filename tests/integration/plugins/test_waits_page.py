"""The Waits page's routes against a real metadata DB (SQLite and PostgreSQL), with real deferrals.

Each deferred task comes from a sensor's own ``execute()``: the kit's (S3, HTTP, DateTime) and
the standard provider's ``DateTimeSensorAsync``, so the page is shown the rows Airflow writes.
"""

from __future__ import annotations

import datetime as dt
import re
import time

from airflow.providers.standard.sensors.date_time import DateTimeSensorAsync
from airflow.sdk import DAG

from airflow_deferrable_kit.sensors.http import HttpBatchReadySensor
from airflow_deferrable_kit.sensors.s3 import S3KeySensor
from airflow_deferrable_kit.sensors.temporal import DateTimeSensor
from tests.integration.plugins.conftest import Deployment

UTC = dt.timezone.utc
PAGE = "/deferrable-kit/waits"
LATER = (dt.datetime.now(UTC) + dt.timedelta(days=2)).isoformat()


def _waits(deployment: Deployment, host: int | None = None) -> None:
    """Four deferred tasks in two DAGs: three kit waits and one official one."""
    with DAG("visible_orders", schedule=None):
        s3 = S3KeySensor(
            task_id="wait_orders",
            bucket_key="s3://dropbox/orders/2025-06-15/*.csv",
            wildcard_match=True,
            deferrable=True,
            check_before_defer=False,
            timeout=3600,
        )
        http = HttpBatchReadySensor(
            task_id="batch_ready",
            http_conn_id="batch_api",
            endpoint="v1/batches/7/status?api_key=hunter2&part=1",
            success=[{"path": "state", "equals": "ready"}],
            deferrable=True,
            check_before_defer=False,
        )
    with DAG("hidden_finance", schedule=None):
        moment = DateTimeSensor(task_id="month_end", target_time=LATER, deferrable=True)
        official = DateTimeSensorAsync(task_id="official_moment", target_time=LATER)
    deployment.defer(s3, triggerer_id=host, deferred_ago=600)
    deployment.defer(http, triggerer_id=host, deferred_ago=30)
    deployment.defer(moment, triggerer_id=host, deferred_ago=7200)
    deployment.defer(official, deferred_ago=120)


def _rows(html: str, table: str) -> list[str]:
    body = re.search(rf'<table id="{table}">.*?<tbody>(.*?)</tbody>', html, re.S)
    assert body, f"no {table} table in the page"
    return re.findall(r"<tr>(.*?)</tr>", body.group(1), re.S)


def test_every_deferred_task_with_its_wait_target_and_triggerer(deployment: Deployment) -> None:
    host = deployment.triggerer("triggerer-a.internal")
    _waits(deployment, host)

    response = deployment.client("admin", role="admin").get(PAGE)

    assert response.status_code == 200, response.text
    html = response.text
    rows = _rows(html, "deferred")
    assert len(rows) == 4
    s3 = next(row for row in rows if "wait_orders" in row)
    assert "airflow_deferrable_kit.triggers.s3.S3KeyTrigger" in s3
    assert "aws_default: s3://dropbox/orders/2025-06-15/*.csv" in s3
    assert "triggerer-a.internal" in s3
    # Links go to Airflow's own pages, out of the iframe.
    assert 'href="/dags/visible_orders/runs/run_1/tasks/wait_orders" target="_top"' in s3
    http = next(row for row in rows if "batch_ready" in row)
    assert "batch_api: GET v1/batches/7/status?api_key=…&amp;part=…" in http
    assert "hunter2" not in html  # never a secret, never raw kwargs
    assert "acceptors" not in html and "success_codes" not in html
    official = next(row for row in rows if "official_moment" in row)
    assert "airflow.providers.standard.triggers.temporal.DateTimeTrigger" in official
    assert "(unassigned)" in official and "<td>—</td>" in official  # no kit kind, no target
    # The kit's own deadline: the S3 wait deferred 10 min ago with a 1 h budget.
    assert re.search(r"<td>(49|50) min</td>", s3), s3
    # Default order: deferred longest first is "since" ascending.
    assert [
        name for row in rows for name in ("month_end", "wait_orders", "official_moment", "batch_ready") if name in row
    ] == [
        "month_end",
        "wait_orders",
        "official_moment",
        "batch_ready",
    ]


def test_filters_sorting_and_paging(deployment: Deployment) -> None:
    host = deployment.triggerer("triggerer-a.internal")
    _waits(deployment, host)
    client = deployment.client("admin", role="admin")

    kit_s3 = _rows(client.get(PAGE, params={"kind": "s3"}).text, "deferred")
    others = _rows(client.get(PAGE, params={"kind": "other"}).text, "deferred")
    one_dag = _rows(client.get(PAGE, params={"dag": "visible_orders"}).text, "deferred")
    unassigned = _rows(client.get(PAGE, params={"triggerer": "(unassigned)"}).text, "deferred")
    old = _rows(client.get(PAGE, params={"min_age": 60}).text, "deferred")
    by_task = _rows(client.get(PAGE, params={"sort": "task", "order": "desc"}).text, "deferred")
    first = client.get(PAGE, params={"per_page": 3}).text
    second = client.get(PAGE, params={"per_page": 3, "page": 2}).text

    assert [("wait_orders" in row) for row in kit_s3] == [True]
    assert len(others) == 1 and "official_moment" in others[0]
    assert len(one_dag) == 2
    assert len(unassigned) == 1 and "official_moment" in unassigned[0]
    assert len(old) == 1 and "month_end" in old[0]
    assert "wait_orders" in by_task[0] and "batch_ready" in by_task[-1]
    assert len(_rows(first, "deferred")) == 3 and "page 1 of 2" in first and 'rel="next"' in first
    assert len(_rows(second, "deferred")) == 1 and 'rel="prev"' in second
    assert client.get(PAGE, params={"sort": "kwargs"}).status_code == 400


def test_a_user_sees_only_the_dags_they_may_read(deployment: Deployment) -> None:
    _waits(deployment)
    deployment.watcher(
        asset="hidden_asset",
        name="hidden_watch",
        classpath="airflow_deferrable_kit.triggers.s3_events.S3KeyEventTrigger",
        kwargs={"bucket_key": "s3://secret-bucket/x"},
        dag_id="hidden_finance",
    )

    html = deployment.client("narrow").get(PAGE).text

    rows = _rows(html, "deferred")
    assert len(rows) == 2
    assert "hidden_finance" not in html and "month_end" not in html and "secret-bucket" not in html


def test_a_user_without_the_triggers_view_is_refused(deployment: Deployment) -> None:
    _waits(deployment)

    refused = deployment.client("outsider").get(PAGE)
    refused_cost = deployment.client("outsider").get(PAGE + "/cost")
    anonymous = deployment.client(None).get(PAGE)

    assert refused.status_code == 403 and refused.json() == {"detail": "Forbidden"}
    assert refused_cost.status_code == 403
    assert anonymous.status_code == 401


def test_nothing_on_the_page_changes_state(deployment: Deployment) -> None:
    _waits(deployment)
    client = deployment.client("admin", role="admin")

    html = client.get(PAGE).text

    assert "<script" not in html
    assert re.findall(r'<form[^>]*method="(\w+)"', html) == ["get"]
    for method in ("post", "put", "patch", "delete"):
        assert getattr(client, method)(PAGE).status_code == 405


def _states_age(row: str, before: str, age: int, since: float) -> bool:
    """``row`` says ``{before}N s ago`` for an ``age`` set ``since`` (monotonic) seconds before now.

    The page reads the clock when it renders, a moment after the row was written, so N is
    ``age`` plus the seconds the test took so far, rounded either way.
    """
    found = re.search(rf"{re.escape(before)}(\d+) s ago", row)
    return found is not None and age <= int(found.group(1)) <= age + time.monotonic() - since + 1


def test_triggerers_with_heartbeat_load_and_warnings(deployment: Deployment) -> None:
    since = time.monotonic()
    busy = deployment.triggerer("triggerer-busy", heartbeat_age=2)
    deployment.triggerer("triggerer-idle", heartbeat_age=3)
    dead = deployment.triggerer("triggerer-dead", heartbeat_age=900, state="running")
    # Killed long ago, its triggers adopted: its job row still says running, and holds nothing.
    deployment.triggerer("triggerer-gone", heartbeat_age=86_400, state="running")
    now = dt.datetime.now(UTC)
    for _ in range(60):
        deployment.trigger("some.provider.Trigger", {}, triggerer_id=busy, created=now)
    deployment.trigger("some.provider.Trigger", {}, triggerer_id=dead, created=now)
    deployment.trigger("some.provider.Trigger", {}, created=now)

    html = deployment.client("admin", role="admin").get(PAGE).text

    rows = {re.search(r"<td>([\w.-]+)", row).group(1): row for row in _rows(html, "triggerers")}  # type: ignore[union-attr]
    assert set(rows) == {"triggerer-busy", "triggerer-idle", "triggerer-dead"}  # not triggerer-gone
    assert "60 / 1000" in rows["triggerer-busy"] and "far more than its peers" in rows["triggerer-busy"]
    assert "1 / 1000" in rows["triggerer-dead"] and _states_age(rows["triggerer-dead"], "last heartbeat ", 900, since)
    assert "<td>ok</td>" in rows["triggerer-idle"]
    assert "1 trigger(s) not yet picked up" in html


def test_watchers_with_last_event_and_kit_watermark(deployment: Deployment) -> None:
    since = time.monotonic()
    host = deployment.triggerer("triggerer-a.internal")
    deployment.watcher(
        asset="orders_landed",
        name="orders_watch",
        classpath="airflow_deferrable_kit.triggers.s3_events.S3KeyEventTrigger",
        kwargs={"bucket_key": "s3://dropbox/orders/*.csv", "wildcard_match": True},
        dag_id="visible_orders",
        triggerer_id=host,
        event_ago=300,
        watermark_ago=40,
    )
    deployment.watcher(
        asset="files",
        name="file_watch",
        classpath="airflow.providers.standard.triggers.file.FileDeleteTrigger",
        kwargs={"filepath": "/data/secret-path"},
        dag_id="visible_files",
    )

    html = deployment.client("admin", role="admin").get(PAGE).text

    rows = _rows(html, "watchers")
    assert len(rows) == 2
    kit = next(row for row in rows if "orders_watch" in row)
    assert "s3://dropbox/orders/*.csv" in kit and "triggerer-a.internal" in kit
    assert "(5 min ago)" in kit and _states_age(kit, "<td>", 40, since)
    other = next(row for row in rows if "file_watch" in row)
    assert "none yet" in other and "secret-path" not in html


def test_a_resumed_task_leaves_the_page(deployment: Deployment) -> None:
    _waits(deployment)
    client = deployment.client("admin", role="admin")
    assert "wait_orders" in client.get(PAGE).text

    deployment.resume("visible_orders", "wait_orders")

    html = client.get(PAGE).text
    assert "wait_orders" not in html and len(_rows(html, "deferred")) == 3


def test_the_cost_section_is_the_audit_rendering(deployment: Deployment) -> None:
    t0 = dt.datetime.now(UTC) - dt.timedelta(hours=2)
    deployment.db.attempt(
        "visible_orders",
        "wait_poke",
        operator="S3KeySensor",
        start=t0,
        end=t0 + dt.timedelta(hours=1),
        events=[("running", t0), ("success", t0 + dt.timedelta(hours=1))],
    )
    deployment.db.attempt(
        "hidden_finance",
        "wait_poke",
        operator="HttpSensor",
        start=t0,
        end=t0 + dt.timedelta(hours=1),
        events=[("running", t0), ("success", t0 + dt.timedelta(hours=1))],
    )

    html = deployment.client("narrow").get(PAGE + "/cost", params={"days": 1}).text

    assert "Worker time by sensor and mode" in html and "<svg" in html
    assert "Sensors per DAG" in html and "visible_orders" in html
    assert "hidden_finance" not in html and "HttpSensor" not in html
    assert "deferrable=True" in html
