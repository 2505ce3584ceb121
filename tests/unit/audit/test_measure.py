"""Worker-held time of single tries, from their log events: every mode and the edge cases."""

from __future__ import annotations

import datetime as dt

import pytest

from airflow_deferrable_kit.audit import (
    Event,
    Try,
    Usage,
    duration,
    is_sensor,
    kit_equivalent,
    measure,
    worker_intervals,
)
from airflow_deferrable_kit.audit._report import money

T0 = dt.datetime(2025, 1, 1, tzinfo=dt.timezone.utc)
KIT = "airflow_deferrable_kit.sensors."


def s(seconds: float) -> dt.datetime:
    return T0 + dt.timedelta(seconds=seconds)


def attempt(
    start: float | None,
    end: float | None,
    *,
    operator: str = "S3KeySensor",
    queued: float | None = None,
    reschedules: int = 0,
    first_reschedule_end: float | None = None,
) -> Try:
    return Try(
        dag_id="d",
        task_id="t",
        run_id="r",
        map_index=-1,
        try_number=1,
        state="success",
        operator=operator,
        custom_operator_name=None,
        start=None if start is None else s(start),
        end=None if end is None else s(end),
        queued=None if queued is None else s(queued),
        reschedules=reschedules,
        first_reschedule_end=None if first_reschedule_end is None else s(first_reschedule_end),
    )


def events(*pairs: tuple[str, float]) -> list[Event]:
    return [Event(name, s(at)) for name, at in pairs]


def test_poke_mode_holds_the_worker_for_the_whole_wait() -> None:
    usage = measure(attempt(0, 300), events(("running", 0.2), ("success", 300)))
    assert usage == Usage("poke", wall=300, worker=300, segments=1, shortest=300)
    assert usage.idle(sensor=True, check_seconds=5) == 295
    assert usage.idle(sensor=False, check_seconds=5) == 0


def test_a_slow_api_server_still_counts_from_the_workers_own_start() -> None:
    # The worker asked to run at 0 and held its slot while the server took 11 s to answer.
    usage = measure(attempt(0, 14), events(("running", 11), ("success", 14)))
    assert usage is not None and usage.worker == 14


def test_reschedule_mode_holds_the_worker_only_during_each_poke() -> None:
    # start_date is reset by each poke: it belongs to the last one.
    usage = measure(
        attempt(119.5, 121, operator="HttpSensor", reschedules=2),
        events(
            ("running", 0),
            ("up_for_reschedule", 2),
            ("running", 60),
            ("up_for_reschedule", 61),
            ("running", 120),
            ("success", 121),
        ),
    )
    assert usage == Usage("reschedule", wall=121, worker=2 + 1 + 1.5, segments=3, shortest=1)
    assert usage.idle(sensor=True, check_seconds=5) == 3.5


def test_deferred_holds_the_worker_before_deferring_and_after_resuming() -> None:
    # start_date is kept across the deferral: it belongs to the first run.
    usage = measure(
        attempt(0.5, 1801, queued=1799),
        events(("running", 1), ("deferred", 3), ("running", 1800), ("success", 1801)),
    )
    assert usage == Usage("deferred", wall=1800.5, worker=2.5 + 1, segments=2, shortest=1, resumed=1)


def test_resumed_counts_every_worker_run_after_the_first_deferral() -> None:
    # Deferred twice: both later runs resumed it on a worker; end_from_trigger needs neither.
    usage = measure(
        attempt(0, 900, queued=899),
        events(
            ("running", 0.1),
            ("deferred", 8),
            ("running", 400),
            ("deferred", 401),
            ("running", 899),
            ("success", 900.5),
        ),
    )
    assert usage is not None and usage.worker == 8 + 1 + 1.5
    assert usage.resumed == 1 + 1.5


def test_end_from_trigger_holds_the_worker_only_before_deferring() -> None:
    # The triggerer ends the task: no second worker run, no success row from a worker.
    usage = measure(attempt(0, 600), events(("running", 0.1), ("deferred", 2)))
    assert usage == Usage("deferred", wall=600, worker=2, segments=1, shortest=2, resumed=0)


def test_worker_clock_ahead_of_the_server_does_not_stretch_the_resumed_run() -> None:
    # start_date 0.5 s after the first running row: it cannot belong to the resume at 1800.
    usage = measure(attempt(1.5, 1801), events(("running", 1), ("deferred", 3), ("running", 1800), ("success", 1801)))
    assert usage is not None and usage.worker == 2 + 1


def test_a_lost_stop_event_closes_at_the_next_start_or_at_the_end() -> None:
    found = worker_intervals(events(("running", 0), ("running", 10), ("failed", 12)), end=s(12))
    assert found == [(s(0), s(10)), (s(10), s(12))]
    assert worker_intervals(events(("running", 0)), end=s(7)) == [(s(0), s(7))]
    # A stop with no start before it (the scheduler failing a queued try) holds no worker.
    assert worker_intervals(events(("failed", 3)), end=s(3)) == []


def test_without_log_rows_poke_is_taken_from_start_and_end() -> None:
    usage = measure(attempt(0, 100, queued=-1), [])
    assert usage == Usage("poke", wall=100, worker=100, segments=1, shortest=100, estimated=True)
    worker = measure(attempt(0, 100, operator="BashOperator", queued=-1), [])
    assert worker == Usage("worker", 100, 100, 1, 100, estimated=True)


def test_start_from_trigger_holds_the_worker_only_for_the_resumed_run() -> None:
    # The scheduler deferred the try itself at 0 (start_date, no log row) and queued it to
    # resume at 300: start_date is not a worker's start and must not stretch the resumed run.
    usage = measure(attempt(0, 305, queued=300), events(("running", 301), ("success", 305)))
    assert usage == Usage("deferred", wall=305, worker=4, segments=1, shortest=4, resumed=4)


def test_start_and_end_from_trigger_hold_no_worker_at_all() -> None:
    # Never queued to an executor, no log rows: the triggerer started and ended the try.
    assert measure(attempt(0, 300), []) == Usage("deferred", wall=300, worker=0, segments=0, shortest=0)


def test_without_log_rows_reschedule_assumes_every_poke_took_as_long_as_the_last() -> None:
    usage = measure(attempt(1190, 1192, reschedules=2, first_reschedule_end=2), [])
    assert usage == Usage("reschedule", wall=1192, worker=6, segments=3, shortest=2, estimated=True)


def test_without_log_rows_a_resumed_deferral_is_spotted_by_its_late_queued_time() -> None:
    usage = measure(attempt(0, 520, queued=500), [])
    assert usage == Usage("deferred", wall=520, worker=40, segments=2, shortest=20, estimated=True, resumed=20)


def test_tries_that_never_ran_on_a_worker_are_not_measured() -> None:
    assert measure(attempt(5, 5), []) is None
    assert measure(attempt(None, None), []) is None
    assert measure(attempt(0, None), []) is None


def test_idle_allows_one_check_at_most_the_shortest_run() -> None:
    quick = Usage("poke", wall=1.5, worker=1.5, segments=1, shortest=1.5)
    assert quick.idle(sensor=True, check_seconds=5) == 0
    assert quick.idle(sensor=True, check_seconds=0) == 1.5


@pytest.mark.parametrize(
    ("names", "expected"),
    [
        (("DateTimeSensor",), KIT + "temporal.DateTimeSensor"),
        (("DateTimeSensorAsync",), KIT + "temporal.DateTimeSensor"),
        (("TimeSensor",), KIT + "temporal.TimeSensor"),
        (("TimeSensorAsync",), KIT + "temporal.TimeSensor"),
        (("TimeDeltaSensor",), KIT + "temporal.TimeDeltaSensor"),
        (("TimeDeltaSensorAsync",), KIT + "temporal.TimeDeltaSensor"),
        (("WaitSensor",), KIT + "temporal.WaitSensor"),
        (("S3KeySensor",), KIT + "s3.S3KeySensor"),
        (("HttpSensor",), KIT + "http.HttpBatchReadySensor"),
        (("SqlSensor",), KIT + "postgres.PostgresBatchMarkerSensor"),
        (("PostgresPartitionSensor",), KIT + "postgres.PostgresBatchMarkerSensor"),
        (("AwaitMessageSensor",), KIT + "kafka.KafkaMessageSensor"),
        (("KafkaMessageSensor",), KIT + "kafka.KafkaMessageSensor"),
        (("HttpJobOperator",), "airflow_deferrable_kit.operators.http.HttpJobOperator"),
        (("DecoratedSensorOperator", "@task.sensor"), None),
        (("ExternalTaskSensor",), None),
        (("PythonOperator",), None),
        ((None, None), None),
    ],
)
def test_kit_equivalents_by_class_name(names: tuple[str | None, ...], expected: str | None) -> None:
    equivalent = kit_equivalent(*names)
    assert (equivalent.sensor if equivalent else None) == expected


def test_sensors_are_told_apart_by_name() -> None:
    assert is_sensor("S3KeySensor") and is_sensor(None, "@task.sensor") and is_sensor("DateTimeSensorAsync")
    assert not is_sensor("PythonOperator", None) and not is_sensor(None, None)
    # The kit's job operator submits once and then only waits: its held time is a wait's.
    assert is_sensor("HttpJobOperator") and not is_sensor("HttpOperator")


@pytest.mark.parametrize(
    ("seconds", "shown"),
    [
        (0, "0 s"),
        (0.002, "<0.1 s"),
        (0.55, "0.6 s"),
        (8.8, "8.8 s"),
        (59.9, "59.9 s"),
        (59.96, "1.0 min"),
        (450, "7.5 min"),
        (3595, "59.9 min"),
        (3598, "1.0 h"),
        (5437, "1.5 h"),
        (3600 * 12_345.6, "12,345.6 h"),
    ],
)
def test_durations_are_shown_in_the_unit_their_size_calls_for(seconds: float, shown: str) -> None:
    assert duration(seconds) == shown


def test_a_cost_too_small_for_a_cent_is_not_shown_as_zero() -> None:
    assert [money(0), money(0.0024), money(0.005), money(1234.5)] == ["0.00", "<0.01", "0.01", "1,234.50"]


def test_the_job_operator_is_told_to_end_in_the_triggerer_never_to_start_there() -> None:
    """Its submit must run once on a worker, so only the resumed run can be saved."""
    from airflow_deferrable_kit.audit._advice import Listeners, Savings, recommend

    savings = Savings(ending_in_trigger=120.0, starting_in_trigger=30.0)
    key = {"dag_id": "d", "task_id": "run_job", "operator": "HttpJobOperator"}
    advice = recommend(key, {"deferred": 3}, kit_equivalent("HttpJobOperator"), savings, listeners=Listeners(False))
    assert advice is not None and advice.change == "end_from_trigger" and "HttpJobOperator" in advice.advice
