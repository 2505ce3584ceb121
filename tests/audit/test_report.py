"""The audit over a metadata DB filled row by row (SQLite and PostgreSQL): exact numbers."""

from __future__ import annotations

import csv
import datetime as dt
import io
import json

import pytest

from airflow_deferrable_kit.audit import Progress, Report, run_audit
from tests.audit.conftest import MetadataDB
from tests.audit.scenario import EXPECTED, KIT, NOW, RANKED, populate

HOUR = 3600.0


@pytest.fixture
def filled(metadata_db: MetadataDB) -> MetadataDB:
    populate(metadata_db)
    return metadata_db


def audit(db: MetadataDB, **kwargs: object) -> Report:
    return run_audit(db.url, now=NOW, **kwargs)  # type: ignore[arg-type]


def by_task(report: Report) -> dict[tuple[str, str, str], dict[str, object]]:
    rows = report.as_dict()["rows"]
    return {(row["dag_id"], row["task_id"], row["operator"]): row for row in rows}


def test_each_task_gets_exact_worker_held_wall_and_idle_time(filled: MetadataDB) -> None:
    rows = by_task(audit(filled, price=2.0))
    assert set(rows) == set(EXPECTED)
    for key, (runs, worker_runs, wall, worker, idle, modes, estimated, equivalent) in EXPECTED.items():
        row = rows[key]
        assert row["runs"] == runs, key
        assert row["worker_runs"] == worker_runs, key
        assert row["wall_hours"] == pytest.approx(wall / HOUR), key
        assert row["worker_held_hours"] == pytest.approx(worker / HOUR), key
        assert row["idle_held_hours"] == pytest.approx(idle / HOUR), key
        assert row["cost"] == pytest.approx(worker / HOUR * 2.0), key
        assert row["idle_cost"] == pytest.approx(idle / HOUR * 2.0), key
        assert row["modes"] == modes, key
        assert row["estimated_runs"] == estimated, key
        assert row["kit_equivalent"] == equivalent, key


def test_totals_and_row_order(filled: MetadataDB) -> None:
    report = audit(filled, price=0.5)
    totals = report.as_dict()["totals"]
    assert totals["runs"] == 13
    assert totals["worker_held_hours"] == pytest.approx(5598.5 / HOUR)
    assert totals["idle_held_hours"] == pytest.approx(5437 / HOUR)
    assert totals["wall_hours"] == pytest.approx(10257 / HOUR)
    assert totals["cost"] == pytest.approx(5598.5 / HOUR * 0.5)
    assert totals["estimated_runs"] == 3
    held = [row.totals.worker for row in report.rows]
    assert held == sorted(held, reverse=True)


def test_sensors_worth_migrating_are_ranked_by_idle_time_with_their_kit_equivalent(filled: MetadataDB) -> None:
    report = audit(filled)
    data = report.as_dict()
    assert [c["task_id"] for c in data["candidates"]] == RANKED
    assert [c["rank"] for c in data["candidates"]] == list(range(1, len(RANKED) + 1))
    first = data["candidates"][0]
    assert first["advice"] == KIT + "s3.S3KeySensor(deferrable=True)"
    by_name = {c["task_id"]: c for c in data["candidates"]}
    assert by_name["wait_pg"]["advice"].endswith("PostgreSQL databases only")
    assert by_name["wait_marker"]["kit_equivalent"] is None
    assert "PollingTrigger" in by_name["wait_marker"]["advice"]
    # Already deferred, a plain task, or no idle time: nothing to migrate.
    ranks = {row["task_id"]: row["migration_rank"] for row in data["rows"]}
    assert ranks["wait_deferred"] is None and ranks["wait_kafka"] is None
    assert ranks["transform"] is None and ranks["wait_ready"] is None
    assert ranks["wait_poke"] == 1
    assert len(report.as_dict(top=2)["candidates"]) == 2


def test_window_counts_tries_that_ended_in_the_last_n_days(filled: MetadataDB) -> None:
    assert ("etl", "wait_old", "SqlSensor") not in by_task(audit(filled, days=7))
    wider = by_task(audit(filled, days=30))
    assert wider[("etl", "wait_old", "SqlSensor")]["worker_held_hours"] == pytest.approx(100 / HOUR)
    assert wider[("etl", "wait_old", "SqlSensor")]["kit_equivalent"] == KIT + "postgres.PostgresBatchMarkerSensor"
    # Half a day before NOW excludes everything at T0 (a day before).
    assert audit(filled, days=0.5).rows == []
    # A window ending before the runs started sees none of them.
    assert run_audit(filled.url, days=7, now=NOW - dt.timedelta(days=2)).rows == []


def test_group_by_dag_and_by_operator(filled: MetadataDB) -> None:
    dags = {row["dag_id"]: row for row in audit(filled, group_by="dag").as_dict()["rows"]}
    assert set(dags) == {"etl", "reports"}
    assert dags["etl"]["runs"] == 10
    assert dags["etl"]["worker_held_hours"] == pytest.approx(3992.5 / HOUR)
    assert dags["reports"]["worker_held_hours"] == pytest.approx(1606 / HOUR)
    assert dags["etl"]["kit_equivalent"] is None
    assert dags["etl"]["modes"] == ["poke", "reschedule", "deferred", "worker"]

    operators = {row["operator"]: row for row in audit(filled, group_by="operator").as_dict()["rows"]}
    assert operators["S3KeySensor"]["runs"] == 2
    assert operators["S3KeySensor"]["worker_held_hours"] == pytest.approx(3601.5 / HOUR)
    assert operators["HttpSensor"]["idle_held_hours"] == pytest.approx(9.5 / HOUR)
    assert operators["DateTimeSensor"]["modes"] == ["poke", "deferred"]
    assert operators["PythonOperator"]["sensor"] is False
    assert operators["@task.sensor"]["sensor"] is True


def test_dag_filter_and_check_allowance(filled: MetadataDB) -> None:
    rows = by_task(audit(filled, dag_ids=["reports"], check_seconds=0))
    assert {key[0] for key in rows} == {"reports"}
    # With no allowance for the check itself, all of a poke-mode sensor's time is idle.
    assert rows[("reports", "wait_pg", "MyPostgresSensor")]["idle_held_hours"] == pytest.approx(1000 / HOUR)


def test_csv_has_one_line_per_row_and_fixed_columns(filled: MetadataDB) -> None:
    report = audit(filled)
    records = list(csv.DictReader(io.StringIO(report.to_csv())))
    assert len(records) == len(EXPECTED)
    assert list(records[0]) == [
        "dag_id",
        "task_id",
        "operator",
        "modes",
        "runs",
        "worker_runs",
        "wall_hours",
        "worker_held_hours",
        "idle_held_hours",
        "cost",
        "idle_cost",
        "estimated_runs",
        "sensor",
        "kit_equivalent",
        "migration_rank",
    ]
    resched = next(r for r in records if r["task_id"] == "wait_resched")
    assert resched["modes"] == "reschedule"
    assert float(resched["worker_held_hours"]) == pytest.approx(7.5 / HOUR, abs=1e-6)
    assert resched["kit_equivalent"] == KIT + "http.HttpBatchReadySensor"
    assert resched["migration_rank"] == str(RANKED.index("wait_resched") + 1)
    transform = next(r for r in records if r["task_id"] == "transform")
    assert (transform["sensor"], transform["kit_equivalent"], transform["migration_rank"]) == ("no", "", "")
    dag_header = audit(filled, group_by="dag").to_csv().splitlines()[0]
    assert dag_header.split(",")[:2] == ["dag_id", "modes"]


def test_json_shape(filled: MetadataDB) -> None:
    data = json.loads(audit(filled, price=3).to_json(top=3))
    assert set(data) == {
        "database",
        "window",
        "price_per_slot_hour",
        "check_seconds",
        "group_by",
        "rows",
        "candidates",
        "totals",
    }
    assert data["window"] == {"days": 7, "since": "2025-06-08T12:00:00+00:00", "until": "2025-06-15T12:00:00+00:00"}
    assert data["price_per_slot_hour"] == 3
    assert len(data["candidates"]) == 3
    assert {"rank", "advice", "idle_cost", "kit_equivalent"} <= set(data["candidates"][0])
    assert "password" not in data["database"]


def test_table_lists_rows_totals_and_the_ranking(filled: MetadataDB) -> None:
    text = audit(filled).to_table(top=3)
    lines = text.splitlines()
    header = next(line for line in lines if line.startswith("DAG"))
    assert header.split()[:4] == ["DAG", "TASK", "OPERATOR", "MODE"]
    assert any(line.startswith("TOTAL") and " 13 " in line for line in lines)
    assert "Sensors worth migrating" in text
    assert "4 more not shown" in text
    assert KIT + "s3.S3KeySensor(deferrable=True)" in text
    assert "3 of 13 runs had no state-change rows" in text


def test_progress_reports_every_batch_and_the_end(filled: MetadataDB) -> None:
    seen: list[Progress] = []
    audit(filled, progress=seen.append, progress_every=4)
    assert seen[-1] == Progress(dags_done=2, dags_total=2, tries=seen[-1].tries)
    # Every try read is counted, including those that turn out never to have run.
    assert seen[-1].tries == 14
    assert seen[0] == Progress(dags_done=0, dags_total=2, tries=4)
    assert [p.dags_done for p in seen] == sorted(p.dags_done for p in seen)


def test_empty_database_gives_an_empty_report(metadata_db: MetadataDB) -> None:
    report = audit(metadata_db)
    assert report.rows == [] and report.candidates == []
    assert "No sensor held a worker slot" in report.to_table()
    assert report.to_csv().count("\n") == 1
