"""The audit's advice against what the kit ships: event triggers where a DAG only waits to start,
each official time sensor's namesake, ``end_from_trigger`` only without listener plugins, and the
saving in words. Metadata DBs filled row by row (SQLite and PostgreSQL), DAGs serialized by Airflow.
"""

from __future__ import annotations

import datetime as dt

import pytest
from airflow.providers.standard.operators.empty import EmptyOperator
from airflow.sdk import DAG

from airflow_deferrable_kit.audit import (
    LISTENER_REFUSAL,
    START_CONDITION,
    Recommendation,
    Report,
    render_html,
    run_audit,
    shape_from_serialized,
)
from airflow_deferrable_kit.sensors.s3 import S3KeySensor, S3KeysUnchangedSensor
from airflow_deferrable_kit.sensors.temporal import DateTimeSensor
from tests.integration.audit.conftest import MetadataDB
from tests.integration.audit.scenario import EXPECTED, NOW, at, populate

EVENTS = "airflow_deferrable_kit.triggers."
START = dt.datetime(2025, 1, 1, tzinfo=dt.timezone.utc)


def audit(db: MetadataDB, **kwargs: object) -> Report:
    return run_audit(db.url, now=NOW, **kwargs)  # type: ignore[arg-type]


def advice_for(report: Report) -> dict[str, Recommendation]:
    return {advice.key["task_id"]: advice for advice in report.recommendations}


def poke(db: MetadataDB, dag_id: str, task_id: str, operator: str, seconds: float) -> None:
    db.attempt(
        dag_id,
        task_id,
        operator=operator,
        start=at(0),
        end=at(seconds),
        events=[("running", at(0.1)), ("success", at(seconds))],
    )


def s3_sensor(task_id: str) -> S3KeySensor:
    return S3KeySensor(task_id=task_id, bucket_key="s3://landing-zone/orders/*.csv", wildcard_match=True)


def test_a_sensor_that_only_starts_its_dag_is_told_to_become_an_event_trigger(metadata_db: MetadataDB) -> None:
    # landing: the wait, then the work. Its sensor's whole worker time goes with an AssetWatcher.
    with DAG("landing", schedule="@daily", start_date=START) as landing:
        s3_sensor("wait_orders") >> EmptyOperator(task_id="load")
    metadata_db.serialized(landing)
    poke(metadata_db, "landing", "wait_orders", "S3KeySensor", 600)
    # Stored compressed, and already deferred, ending in the triggerer: the watcher saves what is left.
    with DAG("landing_deferred", schedule=None, start_date=START) as deferred:
        s3_sensor("wait_deferred") >> EmptyOperator(task_id="load")
    metadata_db.serialized(deferred, compressed=True)
    events = [("running", at(0.1)), ("deferred", at(1.5))]
    metadata_db.attempt(
        "landing_deferred", "wait_deferred", operator="S3KeySensor", start=at(0), end=at(300), events=events
    )
    # mixed: other work starts without waiting, so the DAG cannot simply start on the event.
    with DAG("mixed", schedule="@daily", start_date=START) as mixed:
        s3_sensor("wait_file") >> EmptyOperator(task_id="load")
        EmptyOperator(task_id="report")
    metadata_db.serialized(mixed)
    poke(metadata_db, "mixed", "wait_file", "S3KeySensor", 600)
    # clock: a moment is a schedule, not an event.
    with DAG("clock", schedule="@daily", start_date=START) as clock:
        DateTimeSensor(task_id="wait_nine", target_time="{{ ds }}T09:00:00") >> EmptyOperator(task_id="load")
    metadata_db.serialized(clock)
    poke(metadata_db, "clock", "wait_nine", "DateTimeSensor", 600)
    # unknown: no serialized DAG to read, so the event trigger is advised on its condition.
    poke(metadata_db, "unknown", "wait_batch", "HttpSensor", 600)

    advice = advice_for(audit(metadata_db))
    orders = advice["wait_orders"]
    assert (orders.change, orders.saves, orders.condition) == ("asset_watcher", pytest.approx(600), None)
    assert f"AssetWatcher on {EVENTS}s3_events.S3KeyEventTrigger(...)" in orders.advice
    assert "it is the first task of its DAG, which only waits on it to start work" in orders.advice
    assert (advice["wait_deferred"].change, advice["wait_deferred"].saves) == ("asset_watcher", pytest.approx(1.5))
    assert advice["wait_deferred"].condition is None  # the compressed DAG was read: it only waits on the sensor

    assert advice["wait_file"].change == "deferrable"
    assert "EventTrigger" not in advice["wait_file"].advice
    assert advice["wait_nine"].change == "deferrable"
    assert "EventTrigger" not in advice["wait_nine"].advice

    batch = advice["wait_batch"]
    assert batch.change == "deferrable" and batch.saves == pytest.approx(600 - 2 * 5)
    assert batch.advice.endswith(
        "; if it is the first task of a DAG that only waits on it to start work: schedule the DAG on an Asset "
        f"with an AssetWatcher on {EVENTS}http_events.HttpBatchReadyEventTrigger(...) (this wait's arguments) and "
        "drop the sensor task (docs/events.md)"
    )


def test_the_newest_dag_version_decides_its_shape(metadata_db: MetadataDB) -> None:
    with DAG("landing", schedule="@daily", start_date=START) as old:
        s3_sensor("wait_orders") >> EmptyOperator(task_id="load")
    metadata_db.serialized(old, at=at(-600))
    with DAG("landing", schedule="@daily", start_date=START) as new:
        s3_sensor("wait_orders") >> EmptyOperator(task_id="load")
        EmptyOperator(task_id="cleanup")
    metadata_db.serialized(new, at=at(-60))
    poke(metadata_db, "landing", "wait_orders", "S3KeySensor", 600)
    assert advice_for(audit(metadata_db))["wait_orders"].change == "deferrable"


def test_a_dag_shape_is_read_from_any_serialized_form_or_not_at_all() -> None:
    task = {"__var": {"task_id": "wait", "downstream_task_ids": ["load"]}, "__type": "operator"}
    shape = shape_from_serialized({"dag": {"tasks": [task, {"__var": {"task_id": "load"}}]}})
    assert shape is not None and shape.starts_with("wait") and not shape.starts_with("load")
    mapped = {"__var": {"task_id": "wait", "downstream_task_ids": ["load"], "_needs_expansion": True}}
    shape = shape_from_serialized({"dag": {"tasks": [mapped, {"__var": {"task_id": "load"}}]}})
    assert shape is not None and not shape.starts_with("wait")  # several waits: not one asset schedule
    alone = shape_from_serialized({"dag": {"tasks": [{"__var": {"task_id": "wait"}}]}})
    assert alone is not None and not alone.starts_with("wait")  # nothing to start
    assert shape_from_serialized({"dag": {}}) is None and shape_from_serialized("garbage") is None


@pytest.mark.parametrize(
    ("setup", "option", "registered", "source"),
    [
        ("nothing", None, None, "unknown"),
        ("nothing", True, True, "--listeners"),
        ("nothing", False, False, "--no-listeners"),
        ("refused", None, True, "Airflow refused end_from_trigger with listeners in /dags/landing.py"),
        ("examples", None, True, "example DAGs are loaded (load_examples=True)"),
        ("stale_examples", None, None, "unknown"),
        ("refused", False, False, "--no-listeners"),  # the option wins over what the DB shows
    ],
)
def test_end_from_trigger_is_advised_only_without_listener_plugins(
    metadata_db: MetadataDB, setup: str, option: bool | None, registered: bool | None, source: str
) -> None:
    if setup == "refused":
        metadata_db.import_error(
            "/dags/landing.py",
            "Traceback (most recent call last):\nairflow.exceptions.AirflowClusterPolicyError: "
            f"('{LISTENER_REFUSAL} for deferrable operators. ...', 'wait', 'landing')",
        )
    elif setup in ("examples", "stale_examples"):
        metadata_db.dag("example_bash_operator", bundle="example_dags", stale=setup == "stale_examples")
    events = [("running", at(0.1)), ("deferred", at(1.5)), ("running", at(300.1)), ("success", at(300.5))]
    for task_id, map_index in (("wait_kafka", -1), ("wait_kafka_mapped", 0)):
        metadata_db.attempt(
            "etl", task_id, operator="AwaitMessageSensor", start=at(0), end=at(300.5), queued=at(300), events=events,
            map_index=map_index,
        )  # fmt: skip
    report = audit(metadata_db, listeners=option)
    assert report.listeners.registered is registered
    assert source in report.listeners.source
    found = advice_for(report).get("wait_kafka")
    # A mapped task cannot start in the triggerer (Airflow 3.3.2): only end_from_trigger is left for it.
    mapped = advice_for(report).get("wait_kafka_mapped")
    text = report.to_table()
    conditional = ", if no listener plugin is registered"
    # Started on a worker: starting in the triggerer saves the run before deferring (1.5 s), whatever the listeners.
    assert found is not None and found.change == "start_from_trigger"
    if registered:
        assert mapped is None or mapped.change != "end_from_trigger"
        assert "end_from_trigger is not advised: listener plugins are registered" in text
        assert found.saves == pytest.approx(1.5) and "end_from_trigger" not in found.advice
        assert found.condition == START_CONDITION
        return
    # ... and ending there too the resume (0.4 s): no worker at all.
    assert found.saves == pytest.approx(1.9) and found.advice.startswith("no worker at all: start_from_trigger=True")
    assert (conditional in found.advice) is (registered is None)
    assert found.condition == START_CONDITION + ("; no listener plugins" if registered is None else "")
    assert mapped is not None and mapped.change == "end_from_trigger" and mapped.saves == pytest.approx(0.4)
    assert (conditional in mapped.advice) is (registered is None)
    assert mapped.condition == ("no listener plugins" if registered is None else None)
    assert report.as_dict()["listeners"] == {"registered": registered, "source": report.listeners.source}


def test_the_saving_is_stated_in_words_per_sensor_class_and_mode_and_in_total(metadata_db: MetadataDB) -> None:
    populate(metadata_db)
    report = audit(metadata_db)
    sentences = report.saving_sentences()
    assert "S3KeySensor in poke mode (2 runs): a poke-mode sensor would have held 1.00 worker-hours; " in sentences[0]
    assert (
        "DateTimeSensor in deferred mode (1 run): a poke-mode sensor would have held 0.5 worker-hours; "
        "these held 0.00097 worker-hours." in sentences
    )
    assert (
        "HttpSensor in reschedule mode (2 runs): a poke-mode sensor would have held 0.67 worker-hours; "
        "these held 0.0037 worker-hours." in sentences
    )
    # The total is every sensor try of the scenario (all but the plain task): walls against held.
    sensors = [value for key, value in EXPECTED.items() if key[1] != "transform"]
    wall, held = sum(v[2] for v in sensors), sum(v[3] for v in sensors)
    total = report.held_total
    assert (total.runs, total.poke_would_hold, total.held) == (11, pytest.approx(wall), pytest.approx(held))
    assert sentences[-1] == (
        f"All sensors (11 runs): a poke-mode sensor would have held {wall / 3600:.2f} worker-hours; "
        f"these held {held / 3600:.2f} worker-hours."
    )
    text = report.to_table()
    assert all(sentence in text for sentence in sentences)
    data = report.as_dict()
    assert data["sensors_total"]["sentence"] == sentences[-1]
    assert data["sensors_total"]["saved_hours"] == pytest.approx((wall - held) / 3600)
    by_class = {(h["operator"], h["mode"]): h for h in data["held_by_sensor"]}
    assert by_class[("DateTimeSensor", "deferred")]["poke_would_hold_hours"] == pytest.approx(1800.5 / 3600)
    assert by_class[("DateTimeSensor", "poke")]["worker_held_hours"] == pytest.approx(120 / 3600)
    assert ("PythonOperator", "worker") not in by_class


AMAZON_S3 = "airflow.providers.amazon.aws.sensors.s3"


def test_the_kits_and_the_official_sensors_side_by_side(metadata_db: MetadataDB) -> None:
    """As a new user runs them: each class told apart by its module, each advised what fits it."""
    with DAG("side_by_side", schedule=None, start_date=START) as dag:
        s3_sensor("kit_first_look")
        s3_sensor("kit_poke")
        s3_sensor("amazon_poke")
        S3KeysUnchangedSensor(task_id="amazon_unchanged", bucket_name="landing-zone", prefix="orders/")
    metadata_db.serialized(dag, modules={"amazon_poke": AMAZON_S3, "amazon_unchanged": AMAZON_S3})
    # The kit's deferrable sensor: one run deferred; in the next its first look found the key at once.
    deferred = [("running", at(0.1)), ("deferred", at(1.5)), ("running", at(300.1)), ("success", at(300.5))]
    metadata_db.attempt(
        "side_by_side", "kit_first_look", operator="S3KeySensor", run_id="run_0", start=at(0), end=at(300.5),
        queued=at(300), events=deferred,
    )  # fmt: skip
    poke(metadata_db, "side_by_side", "kit_first_look", "S3KeySensor", 8)
    poke(metadata_db, "side_by_side", "kit_poke", "S3KeySensor", 600)
    poke(metadata_db, "side_by_side", "amazon_poke", "S3KeySensor", 600)
    poke(metadata_db, "side_by_side", "amazon_unchanged", "S3KeysUnchangedSensor", 600)

    report = audit(metadata_db)
    advice = advice_for(report)

    first_look = next(row for row in report.rows if row.key["task_id"] == "kit_first_look")
    assert first_look.modes == {"deferred": 1, "first_look": 1}
    assert first_look.savings.deferring == 0 and first_look.by_mode["first_look"].idle == 0
    assert advice["kit_first_look"].change != "deferrable"  # it has it: told what it lacks instead
    assert all(row.key["task_id"] != "kit_first_look" for row in report.candidates)
    assert advice["kit_poke"].advice.startswith("deferrable=True, if not set (it is this kit's S3KeySensor,")
    assert advice["amazon_poke"].advice == "airflow_deferrable_kit.sensors.s3.S3KeySensor(deferrable=True)"
    unchanged = advice["amazon_unchanged"].advice
    assert unchanged == "airflow_deferrable_kit.sensors.s3.S3KeysUnchangedSensor(deferrable=True)"
    # Not merged by class name: one chart row per module.
    held = {(h.operator, h.mode): h.runs for h in report.held}
    assert held == {
        ("S3KeySensor (kit)", "poke"): 1,
        ("S3KeySensor (kit)", "deferred"): 1,
        ("S3KeySensor (kit)", "first_look"): 1,
        ("S3KeySensor (amazon)", "poke"): 1,
        ("S3KeysUnchangedSensor (amazon)", "poke"): 1,
    }


def test_the_listener_caveat_is_said_once_not_in_every_row(metadata_db: MetadataDB) -> None:
    events = [("running", at(0.1)), ("deferred", at(1.5)), ("running", at(300.1)), ("success", at(300.5))]
    for index in range(4):
        metadata_db.attempt(
            "etl", f"wait_{index}", operator="AwaitMessageSensor", start=at(0), end=at(300.5), queued=at(300),
            events=events, map_index=0,
        )  # fmt: skip

    report = audit(metadata_db)
    page = render_html(report)

    assert len(report.recommendations) == 4
    # The short condition stays with the end_from_trigger part of each row's advice (an
    # AssetWatcher alternative may follow it); why it matters is said once, under the advice.
    ending = "end_from_trigger=True (KafkaMessageSensor of this kit resumes only to return its payload"
    for recommendation in report.recommendations:
        assert recommendation.advice.startswith(ending)
        assert recommendation.advice.count(", if no listener plugin is registered") == 1
    assert page.count("Airflow refuses it while listener plugins") == 1
    assert page.count("end_from_trigger is advised on condition") == 1
    assert page.count("OpenLineage, or Airflow&#x27;s example listener") == 1
