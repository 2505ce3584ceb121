"""A small metadata DB with every case the audit must get right, and the numbers it must report.

Times are seconds after ``T0`` (one day before ``NOW``); the ``log`` rows are what Airflow
3.3.2's Execution API writes (``running`` when a worker starts the try, then the state it hands
back), ``start_date`` is the worker's clock when it asked to run.
"""

from __future__ import annotations

import datetime as dt

from tests.integration.audit.conftest import MetadataDB

UTC = dt.timezone.utc
NOW = dt.datetime(2025, 6, 15, 12, 0, tzinfo=UTC)
T0 = NOW - dt.timedelta(days=1)
KIT = "airflow_deferrable_kit.sensors."


def at(seconds: float, base: dt.datetime = T0) -> dt.datetime:
    return base + dt.timedelta(seconds=seconds)


def populate(db: MetadataDB, base: dt.datetime = T0) -> None:
    """Fill ``db``; ``base`` moves every time (the CLI tests use the real clock)."""

    def s(seconds: float) -> dt.datetime:
        return at(seconds, base)

    # Poke mode: one worker interval for the whole hour; start_date opens it.
    db.attempt(
        "etl",
        "wait_poke",
        operator="S3KeySensor",
        start=s(0),
        end=s(3600),
        events=[("running", s(0.5)), ("success", s(3600))],
    )
    # Reschedule mode: three pokes; start_date was reset by the last one.
    db.attempt(
        "etl",
        "wait_resched",
        operator="HttpSensor",
        start=s(1199.5),
        end=s(1203),
        queued=s(1199),
        events=[
            ("running", s(0)),
            ("up_for_reschedule", s(2)),
            ("running", s(600)),
            ("up_for_reschedule", s(602)),
            ("running", s(1200)),
            ("success", s(1203)),
        ],
        reschedules=[s(2), s(602)],
    )
    # Deferred: runs before deferring and after resuming; start_date keeps the first start.
    db.attempt(
        "etl",
        "wait_deferred",
        operator="DateTimeSensor",
        start=s(0.5),
        end=s(1801),
        queued=s(1799),
        events=[("running", s(1)), ("deferred", s(3)), ("running", s(1800)), ("success", s(1801))],
    )
    # A plain task retried once: the first try lives in task_instance_history (which needs
    # the current try's row first).
    db.attempt(
        "etl",
        "transform",
        operator="PythonOperator",
        try_number=2,
        start=s(100),
        end=s(160),
        events=[("running", s(100.5)), ("success", s(160))],
    )
    db.attempt(
        "etl",
        "transform",
        operator="PythonOperator",
        start=s(10),
        end=s(70),
        state="failed",
        archived=True,
        events=[("running", s(10)), ("up_for_retry", s(70))],
    )
    # Outside a 7-day window (inside a 30-day one).
    old = base - dt.timedelta(days=9)
    db.attempt(
        "etl",
        "wait_old",
        operator="SqlSensor",
        run_id="run_old",
        start=old - dt.timedelta(seconds=100),
        end=old,
        events=[("running", old - dt.timedelta(seconds=100)), ("success", old)],
    )
    # Not over yet: running, and between two reschedule pokes (end_date set, state not final).
    db.attempt("etl", "wait_running", operator="S3KeySensor", state="running", start=s(0), end=None)
    db.attempt(
        "etl",
        "wait_between_pokes",
        operator="HttpSensor",
        state="up_for_reschedule",
        start=s(0),
        end=s(1),
        events=[("running", s(0)), ("up_for_reschedule", s(1))],
    )
    # Log rows pruned: estimated from task_instance alone.
    db.attempt("etl", "wait_external", operator="ExternalTaskSensor", start=s(0), queued=s(-1), end=s(100))
    db.attempt("etl", "wait_kafka", operator="AwaitMessageSensor", start=s(0), queued=s(500), end=s(520))
    db.attempt(
        "reports",
        "wait_resched_pruned",
        operator="HttpSensor",
        start=s(1190),
        end=s(1192),
        reschedules=[s(2), s(602)],
    )
    # Never ran on a worker.
    db.attempt("etl", "branch_skipped", operator="EmptyOperator", state="skipped", start=s(5), end=s(5))
    db.attempt("etl", "upstream_broke", operator="S3KeySensor", state="upstream_failed", start=s(5), end=s(9))
    # Mapped sensor: two tries of one task.
    for index in (0, 1):
        db.attempt(
            "etl",
            "wait_map",
            operator="DateTimeSensor",
            map_index=index,
            start=s(0),
            end=s(60),
            events=[("running", s(0.1)), ("success", s(60))],
        )
    # Condition already true: one short check, nothing idle.
    db.attempt(
        "etl",
        "wait_ready",
        operator="S3KeySensor",
        start=s(0),
        end=s(1.5),
        events=[("running", s(0.1)), ("success", s(1.5))],
    )
    db.attempt(
        "reports",
        "wait_marker",
        operator="DecoratedSensorOperator",
        custom_operator_name="@task.sensor",
        start=s(0),
        end=s(600),
        events=[("running", s(0.2)), ("success", s(600))],
    )
    db.attempt(
        "reports",
        "wait_pg",
        operator="MyPostgresSensor",
        start=s(0),
        end=s(1000),
        events=[("running", s(0.3)), ("success", s(1000))],
    )
    db.noise(s(0))


#: (dag_id, task_id, operator) -> runs, worker_runs, wall s, worker-held s, idle s, modes,
#: estimated runs, kit equivalent — for a 7-day window and the default 5 s check allowance.
EXPECTED: dict[tuple[str, str, str], tuple[int, int, float, float, float, list[str], int, str | None]] = {
    ("etl", "wait_poke", "S3KeySensor"): (1, 1, 3600, 3600, 3595, ["poke"], 0, KIT + "s3.S3KeySensor"),
    ("etl", "wait_resched", "HttpSensor"): (1, 3, 1203, 7.5, 5.5, ["reschedule"], 0, KIT + "http.HttpBatchReadySensor"),
    ("etl", "wait_deferred", "DateTimeSensor"): (
        1,
        2,
        1800.5,
        3.5,
        2.5,
        ["deferred"],
        0,
        KIT + "temporal.DateTimeSensor",
    ),
    ("etl", "transform", "PythonOperator"): (2, 2, 120, 120, 0, ["worker"], 0, None),
    ("etl", "wait_external", "ExternalTaskSensor"): (1, 1, 100, 100, 95, ["poke"], 1, None),
    ("etl", "wait_kafka", "AwaitMessageSensor"): (1, 2, 520, 40, 35, ["deferred"], 1, KIT + "kafka.KafkaMessageSensor"),
    ("etl", "wait_map", "DateTimeSensor"): (2, 2, 120, 120, 110, ["poke"], 0, KIT + "temporal.DateTimeSensor"),
    ("etl", "wait_ready", "S3KeySensor"): (1, 1, 1.5, 1.5, 0, ["poke"], 0, KIT + "s3.S3KeySensor"),
    ("reports", "wait_marker", "@task.sensor"): (1, 1, 600, 600, 595, ["poke"], 0, None),
    ("reports", "wait_pg", "MyPostgresSensor"): (
        1,
        1,
        1000,
        1000,
        995,
        ["poke"],
        0,
        KIT + "postgres.PostgresBatchMarkerSensor",
    ),
    ("reports", "wait_resched_pruned", "HttpSensor"): (
        1,
        3,
        1192,
        6,
        4,
        ["reschedule"],
        1,
        KIT + "http.HttpBatchReadySensor",
    ),
}
#: Sensors still waiting on a worker, most idle time first.
RANKED = ["wait_poke", "wait_pg", "wait_marker", "wait_map", "wait_external", "wait_resched", "wait_resched_pruned"]
#: Each sensor task's next change and the worker seconds it would no longer hold, most first:
#: deferrable=True keeps a check before deferring and a resume (one allowance each), and
#: start_from_trigger=True with end_from_trigger=True saves every run of a deferred sensor.
RECOMMENDED = [
    ("wait_poke", "deferrable", 3600 - 2 * 5),
    ("wait_pg", "deferrable", 1000 - 2 * 5),
    ("wait_marker", "deferrable", 600 - 2 * 5),
    ("wait_map", "deferrable", 2 * (60 - 2 * 5)),
    ("wait_external", "deferrable", 100 - 2 * 5),
    ("wait_kafka", "start_from_trigger", 40),
    ("wait_deferred", "start_from_trigger", 3.5),
    ("wait_resched", "deferrable", 7.5 - 2 * 2),
    ("wait_resched_pruned", "deferrable", 6 - 2 * 2),
]
