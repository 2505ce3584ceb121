"""The audit over a metadata DB filled row by row (SQLite and PostgreSQL): exact numbers."""

from __future__ import annotations

import csv
import datetime as dt
import io
import json
import re

import pytest

from airflow_deferrable_kit.audit import START_CONDITION, STARTS_DAG_CONDITION, Progress, Report, run_audit
from tests.integration.audit.conftest import MetadataDB
from tests.integration.audit.scenario import EXPECTED, KIT, NOW, RANKED, RECOMMENDED, at, populate

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
        "recommendations",
        "held_by_sensor",
        "sensors_total",
        "listeners",
        "totals",
        "shared_requests_multiplied",
    }
    assert data["shared_requests_multiplied"] == []  # nothing deferred now in this DB
    assert data["window"] == {"days": 7, "since": "2025-06-08T12:00:00+00:00", "until": "2025-06-15T12:00:00+00:00"}
    assert data["price_per_slot_hour"] == 3
    assert len(data["candidates"]) == 3
    assert {"rank", "advice", "idle_cost", "kit_equivalent"} <= set(data["candidates"][0])
    assert len(data["recommendations"]) == 3
    assert data["recommendations"][0] == {
        "dag_id": "etl",
        "task_id": "wait_poke",
        "operator": "S3KeySensor",
        "modes": ["poke"],
        "change": "deferrable",
        "advice": KIT + "s3.S3KeySensor(deferrable=True); if it is the first task of a DAG that only waits on it "
        "to start work: schedule the DAG on an Asset with an AssetWatcher on "
        "airflow_deferrable_kit.triggers.s3_events.S3KeyEventTrigger(...) (this wait's arguments) and drop the "
        "sensor task (docs/events.md)",
        "saves_seconds": pytest.approx(3590),
        "saves_cost": pytest.approx(3590 / HOUR * 3),
        "condition": None,
    }
    assert data["listeners"]["registered"] is None
    assert data["listeners"]["source"].startswith("unknown")
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


#: A figure rendered as a zero that is not one ("0.000"); "0.00097" is a figure, "0.00" a cost of nothing.
FAKE_ZERO = re.compile(r"(?<![\d.])0\.000+(?![\d])")


def cells(text: str, task_id: str, heading: str | None = None) -> list[str]:
    """The cells of ``task_id``'s line in the table (or in the section under ``heading``)."""
    section = text.split(heading, 1)[1] if heading else text
    line = next(line for line in section.splitlines() if f" {task_id} " in f" {line} ")
    return [cell.strip() for cell in line.split("  ") if cell.strip()]


def test_table_shows_each_duration_in_the_unit_its_size_calls_for(filled: MetadataDB) -> None:
    text = audit(filled).to_table()
    # WALL, WORKER, IDLE, COST, IDLE COST after DAG, TASK, OPERATOR, MODE, RUNS.
    assert cells(text, "wait_poke")[5:10] == ["1.0 h", "1.0 h", "59.9 min", "1.00", "1.00"]
    assert cells(text, "wait_map")[5:8] == ["2.0 min", "2.0 min", "1.8 min"]
    assert cells(text, "wait_deferred")[5:10] == ["30.0 min", "3.5 s", "2.5 s", "<0.01", "<0.01"]
    assert cells(text, "transform")[7] == "0 s"
    assert not FAKE_ZERO.search(text)
    assert cells(text, "wait_resched", "Sensors worth migrating")[5:8] == ["5.5 s", "<0.01", "3.5 s"]


def test_the_table_states_what_sensors_held_and_what_each_change_saves(filled: MetadataDB) -> None:
    text = audit(filled).to_table()
    assert "Sensors held worker slots for 1.5 h beyond one check per try" in text
    assert "No sensor held" not in text
    other = "Other changes that would hold less"
    kafka = cells(text, "wait_kafka", other)
    assert kafka[3:5] == ["deferred", "40.0 s"]  # every worker run: before deferring, and the resume
    assert kafka[5].startswith(
        "no worker at all: start_from_trigger=True (KafkaMessageSensor of this kit starts in the triggerer"
    )
    assert (
        "; and end_from_trigger=True (KafkaMessageSensor of this kit resumes only to return its payload; "
        "not with commit_on_match=True), if no listener plugin is registered"
    ) in kafka[5]
    assert cells(text, "wait_deferred", other)[4] == "3.5 s"
    assert "end_from_trigger is advised on condition: Airflow refuses it while listener plugins" in text
    assert "start_from_trigger is advised on condition: it needs Airflow 3.3 or later" in text


def test_each_sensor_gets_its_next_change_and_the_worker_time_it_saves(filled: MetadataDB) -> None:
    report = audit(filled)
    found = [(r.key["task_id"], r.change, pytest.approx(r.saves)) for r in report.recommendations]
    assert found == RECOMMENDED
    # Airflow's version and the listeners unknown: each start_from_trigger says so; nothing else depends on them.
    assert {r.key["task_id"]: r.condition for r in report.recommendations if r.condition} == {
        "wait_kafka": "Airflow 3.3 or later; no listener plugins",
        "wait_deferred": "Airflow 3.3 or later; no listener plugins",
    }
    # Found at once (nothing to save) and not sensors: no recommendation.
    assert not {"wait_ready", "transform"} & {r.key["task_id"] for r in report.recommendations}


def test_a_tiny_deferred_resume_is_stated_not_denied(metadata_db: MetadataDB) -> None:
    """Only deferred sensors, resumed for well under a second: no poke sensor to migrate, yet the
    resumes are worker time, so the report says how much instead of "no sensor held"."""
    for number in range(3):
        metadata_db.attempt(
            "etl",
            f"wait_{number}",
            operator="S3KeySensor",
            start=at(0),
            end=at(40.3),
            queued=at(40),
            events=[("running", at(0.1)), ("deferred", at(2)), ("running", at(40.1)), ("success", at(40.3))],
        )
    report = audit(metadata_db)
    text = report.to_table()
    assert report.candidates == []
    assert "No sensor held" not in text
    assert "Sensors held worker slots for 6.0 s beyond one check per try (IDLE), none of it waiting in poke" in text
    assert not FAKE_ZERO.search(text) and cells(text, "TOTAL")[1:5] == ["3", "2.0 min", "6.6 s", "6.0 s"]
    # Started on a worker for 2 s, resumed for 0.2 s: starting and ending in the triggerer saves both.
    assert [(r.change, pytest.approx(r.saves)) for r in report.recommendations] == [("start_from_trigger", 2.2)] * 3
    assert cells(text, "wait_0", "Other changes that would hold less")[4] == "2.2 s"


def test_a_sensor_that_ends_in_the_triggerer_is_told_of_its_event_trigger_on_condition(
    metadata_db: MetadataDB,
) -> None:
    """No serialized DAG to tell the shape: the event trigger is advised with its condition, after
    starting in the triggerer where that applies (a mapped task cannot, in Airflow 3.3.2)."""
    ended_in_triggerer = [("running", at(0.1)), ("deferred", at(1.5))]
    resumed_on_worker = [*ended_in_triggerer, ("running", at(300.1)), ("success", at(300.3))]
    for task_id, operator, events, map_index in [
        ("wait_s3_end_from_trigger", "S3KeySensor", ended_in_triggerer, -1),
        ("wait_moment_end_from_trigger", "DateTimeSensor", ended_in_triggerer, -1),
        ("wait_s3_resumed", "S3KeySensor", resumed_on_worker, -1),
        ("wait_s3_mapped_end_from_trigger", "S3KeySensor", ended_in_triggerer, 0),
        ("wait_s3_mapped_resumed", "S3KeySensor", resumed_on_worker, 0),
    ]:
        resumed = events is resumed_on_worker
        metadata_db.attempt(
            "etl", task_id, operator=operator, start=at(0), end=at(300.3 if resumed else 300),
            queued=at(300) if resumed else None, events=events, map_index=map_index,
        )  # fmt: skip
    report = audit(metadata_db, listeners=False)
    found = {r.key["task_id"]: r for r in report.recommendations}
    watcher_advice = found["wait_s3_mapped_end_from_trigger"].advice
    assert STARTS_DAG_CONDITION == "if it is the first task of a DAG that only waits on it to start work"
    assert watcher_advice.startswith(STARTS_DAG_CONDITION + ": schedule the DAG on an Asset with an AssetWatcher on ")
    assert "S3KeyEventTrigger" in watcher_advice and "not in this kit" not in watcher_advice
    saves = {task_id: (r.change, pytest.approx(r.saves), r.condition) for task_id, r in found.items()}
    assert saves == {
        "wait_s3_end_from_trigger": ("start_from_trigger", pytest.approx(1.5), START_CONDITION),
        "wait_moment_end_from_trigger": ("start_from_trigger", pytest.approx(1.5), START_CONDITION),
        "wait_s3_resumed": ("start_from_trigger", pytest.approx(1.7), START_CONDITION),
        "wait_s3_mapped_end_from_trigger": ("asset_watcher", pytest.approx(1.5), STARTS_DAG_CONDITION),
        "wait_s3_mapped_resumed": ("end_from_trigger", pytest.approx(0.2), None),
    }
    # The event trigger follows on its condition; a wall-clock moment has none to watch for.
    for task_id in ("wait_s3_end_from_trigger", "wait_s3_resumed", "wait_s3_mapped_resumed"):
        assert found[task_id].advice.endswith("; " + watcher_advice), task_id
    assert "AssetWatcher" not in found["wait_moment_end_from_trigger"].advice
    row = cells(report.to_table(), "wait_s3_mapped_end_from_trigger", "would hold less")
    assert row[4:] == ["1.5 s", watcher_advice]


def test_run_ids_narrow_the_audit_to_those_dag_runs(filled: MetadataDB) -> None:
    assert {key[1] for key in by_task(audit(filled, days=30, run_ids=["run_old"]))} == {"wait_old"}
    assert ("etl", "wait_old", "SqlSensor") not in by_task(audit(filled, days=30, run_ids=["run_1"]))
    assert audit(filled, run_ids=["no_such_run"]).rows == []


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
