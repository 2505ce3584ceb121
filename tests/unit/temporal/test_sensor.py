"""TimeDeltaSensor / TimeSensor / WaitSensor: the official rules for their moment, on DateTimeTrigger."""

from __future__ import annotations

import datetime as dt
import types
from typing import Any

import pendulum
import pytest
from airflow.sdk import DAG, timezone
from airflow.sdk.exceptions import AirflowSensorTimeout, AirflowSkipException, TaskDeferred

from airflow_deferrable_kit.sensors.temporal import TimeDeltaSensor, TimeSensor, WaitSensor
from airflow_deferrable_kit.testing import FakeClock, assert_defers, make_context, run_trigger, run_trigger_payload
from airflow_deferrable_kit.triggers.base import deadline_after
from airflow_deferrable_kit.triggers.temporal import DateTimeTrigger
from tests import REPO

UTC = dt.timezone.utc
FUTURE_END = dt.datetime(2999, 1, 1, tzinfo=UTC)


def utc(*parts: int) -> dt.datetime:
    return dt.datetime(*parts, tzinfo=UTC)


def iso(moment: dt.datetime) -> str:
    return moment.astimezone(UTC).isoformat()


def deferred_target(sensor: Any, **context: Any) -> str:
    trigger = assert_defers(sensor, DateTimeTrigger, context=make_context(sensor, **context))
    return trigger.target_time


# ------------------------------------------------------------------------ TimeDeltaSensor
@pytest.mark.parametrize(
    ("delta", "expected"),
    [
        (dt.timedelta(hours=1), utc(2999, 1, 1, 1)),
        (90, utc(2999, 1, 1, 1, 30)),  # an int is minutes, as officially
        ("45", utc(2999, 1, 1, 0, 45)),  # a rendered template is a string of minutes
        ("{{ 60 * 2 }}", utc(2999, 1, 1, 2)),
        (dt.timedelta(hours=-1), utc(2998, 12, 31, 23)),
    ],
)
def test_time_delta_waits_delta_after_data_interval_end(delta: Any, expected: dt.datetime) -> None:
    sensor = TimeDeltaSensor(task_id="w", delta=delta, deferrable=True, timeout=60)
    # The official rule: data_interval_end + delta.
    assert deferred_target(sensor, data_interval_end=FUTURE_END) == iso(expected)


def test_time_delta_falls_back_to_run_after_without_a_data_interval() -> None:
    sensor = TimeDeltaSensor(task_id="w", delta=dt.timedelta(minutes=5), deferrable=True, timeout=60)
    run = types.SimpleNamespace(run_after=pendulum.datetime(2999, 3, 29, 1, 0, tz="Europe/Amsterdam"))
    assert deferred_target(sensor, data_interval_end=None, dag_run=run) == "2999-03-29T00:05:00+00:00"


def test_time_delta_across_a_dst_change_is_an_elapsed_duration() -> None:
    # Amsterdam springs forward at 02:00 on 2026-03-29: 01:30 + 1 h is 03:30 local, 01:30 UTC.
    end = pendulum.datetime(2026, 3, 29, 1, 30, tz="Europe/Amsterdam")
    sensor = TimeDeltaSensor(task_id="w", delta=dt.timedelta(hours=1), deferrable=True)
    payload = sensor.execute(make_context(sensor, data_interval_end=end))
    assert payload == {"status": "success", "target_time": "2026-03-29T01:30:00+00:00"}
    assert payload["target_time"] == iso(end + dt.timedelta(hours=1))  # the official sum


def test_time_delta_past_moment_succeeds_at_once_with_the_datetime_payload() -> None:
    sensor = TimeDeltaSensor(task_id="w", delta=10, deferrable=True)
    payload = sensor.execute(make_context(sensor, data_interval_end=utc(2020, 1, 1)))
    assert payload == {"status": "success", "target_time": "2020-01-01T00:10:00+00:00"}


def test_time_delta_without_run_dates_fails_naming_them() -> None:
    sensor = TimeDeltaSensor(task_id="w", delta=10, deferrable=True)
    with pytest.raises(ValueError, match=r"data_interval_end or dag_run.run_after"):
        sensor.execute(make_context(sensor))


@pytest.mark.parametrize("bad", [1.5, True, "soon", "1.5", dt.timedelta(days=365 * 101), None])
def test_a_bad_delta_is_refused_at_parse_naming_it(bad: Any) -> None:
    with pytest.raises(ValueError, match=r"^delta must be"):
        TimeDeltaSensor(task_id="w", delta=bad)


def test_a_bad_rendered_delta_fails_the_task_naming_it() -> None:
    sensor = TimeDeltaSensor(task_id="w", delta="{{ 'soon' }}", deferrable=True)
    context = make_context(sensor, data_interval_end=FUTURE_END)
    sensor.render_template_fields(context)
    with pytest.raises(ValueError, match=r"^delta must be a timedelta or a whole number of minutes, got 'soon'"):
        sensor.execute(context)


def test_a_delta_past_year_9999_fails_naming_it() -> None:
    sensor = TimeDeltaSensor(task_id="w", delta=dt.timedelta(days=2), deferrable=True)
    with pytest.raises(ValueError, match=r"^delta: 9999-12-31"):
        sensor.execute(make_context(sensor, data_interval_end=utc(9999, 12, 31)))


def test_time_delta_poke_mode_times_out_softly() -> None:
    sensor = TimeDeltaSensor(task_id="w", delta=60, deferrable=False, poke_interval=0.01, timeout=0.05, soft_fail=True)
    with pytest.raises(AirflowSkipException):
        sensor.execute(make_context(sensor, data_interval_end=FUTURE_END))


def test_time_delta_poke_mode_times_out_hard_without_soft_fail() -> None:
    sensor = TimeDeltaSensor(task_id="w", delta=60, deferrable=False, poke_interval=0.01, timeout=0.05)
    with pytest.raises(AirflowSensorTimeout):
        sensor.execute(make_context(sensor, data_interval_end=FUTURE_END))


def test_time_delta_poke_mode_succeeds_once_passed() -> None:
    sensor = TimeDeltaSensor(task_id="w", delta=1, deferrable=False, poke_interval=0.01, timeout=5)
    context = make_context(sensor, data_interval_end=dt.datetime.now(UTC) - dt.timedelta(minutes=2))
    result = sensor.poke(context)
    assert not isinstance(result, bool) and result.is_done
    assert result.xcom_value["status"] == "success"


# ------------------------------------------------------------------------------ TimeSensor
def official_time_sensor_moment(run_date: dt.date, time_of_day: dt.time, zone: Any) -> str:
    """The official TimeSensor's computation, with the run's date in place of ``now()``'s."""
    aware = timezone.coerce_datetime(dt.datetime.combine(run_date, time_of_day, zone))
    return timezone.convert_to_utc(aware).isoformat()


@pytest.mark.parametrize(
    ("zone_name", "interval_end", "time_of_day", "expected"),
    [
        ("UTC", utc(2026, 6, 1), dt.time(9, 30), "2026-06-01T09:30:00+00:00"),
        # A daily run for 2026-01-15 in Amsterdam ends at 00:00 CET = 23:00 UTC the day before:
        # its date is the DAG's local date, not the UTC one.
        ("Europe/Amsterdam", utc(2026, 1, 14, 23), dt.time(9, 30), "2026-01-15T08:30:00+00:00"),
        ("Europe/Amsterdam", utc(2026, 6, 14, 22), dt.time(9, 30), "2026-06-15T07:30:00+00:00"),
        ("America/New_York", utc(2026, 7, 4, 4), dt.time(18, 0), "2026-07-04T22:00:00+00:00"),
        # Spring forward in Amsterdam (02:00 -> 03:00 on 2026-03-29): 02:30 does not exist and,
        # as officially, takes the offset after the change, +02:00: 00:30 UTC.
        ("Europe/Amsterdam", utc(2026, 3, 28, 23), dt.time(2, 30), "2026-03-29T00:30:00+00:00"),
        # Fall back (03:00 -> 02:00 on 2026-10-25): 02:30 happens twice; the first, +02:00.
        ("Europe/Amsterdam", utc(2026, 10, 24, 22), dt.time(2, 30), "2026-10-25T00:30:00+00:00"),
        ("America/New_York", utc(2026, 3, 8, 5), dt.time(2, 30), "2026-03-08T06:30:00+00:00"),
    ],
    ids=["utc", "amsterdam-winter", "amsterdam-summer", "new-york-summer", "spring-gap", "fall-repeat", "ny-gap"],
)
def test_time_sensor_waits_for_the_time_of_day_on_the_runs_date_in_the_dags_timezone(
    zone_name: str, interval_end: dt.datetime, time_of_day: dt.time, expected: str
) -> None:
    zone = pendulum.timezone(zone_name)
    with DAG(
        dag_id=f"tz_{zone_name.replace('/', '_')}", schedule=None, start_date=pendulum.datetime(2026, 1, 1, tz=zone)
    ):
        sensor = TimeSensor(task_id="w", target_time=time_of_day, deferrable=False)
    sensor.fix_target(make_context(sensor, data_interval_end=interval_end))
    assert sensor._target_time == expected
    assert expected == official_time_sensor_moment(interval_end.astimezone(zone).date(), time_of_day, zone)


def test_time_sensor_defers_with_the_datetime_trigger_and_iso_strings_work() -> None:
    with DAG(dag_id="tz_ny", schedule=None, start_date=pendulum.datetime(2026, 1, 1, tz="America/New_York")):
        sensor = TimeSensor(task_id="w", target_time="{{ '18:15' }}", deferrable=True, timeout=60)
    assert deferred_target(sensor, data_interval_end=utc(2999, 1, 1, 12)) == "2999-01-01T23:15:00+00:00"


def test_time_sensor_without_a_dag_uses_the_default_timezone() -> None:
    try:
        timezone.initialize("Europe/Amsterdam")
        sensor = TimeSensor(task_id="w", target_time=dt.time(12), deferrable=True)
        payload = sensor.execute(make_context(sensor, data_interval_end=utc(2026, 6, 1)))
    finally:
        timezone.initialize("UTC")
    assert payload == {"status": "success", "target_time": "2026-06-01T10:00:00+00:00"}


@pytest.mark.parametrize(
    ("bad", "error", "message"),
    [
        ("25:00", ValueError, "target_time could not be parsed"),
        (dt.time(9, tzinfo=UTC), ValueError, "target_time is a time of day in the DAG's timezone"),
        ("09:00+02:00", ValueError, "target_time is a time of day"),
        (dt.datetime(2026, 1, 1, 9), TypeError, "target_time must be a datetime.time"),
        (930, TypeError, "target_time must be a datetime.time"),
    ],
)
def test_a_bad_time_of_day_is_refused_at_parse_naming_it(bad: Any, error: type[Exception], message: str) -> None:
    with pytest.raises(error, match=message):
        TimeSensor(task_id="w", target_time=bad)


def test_time_sensor_drops_trigger_kwargs_as_the_official_sensor_does() -> None:
    """Officially ``trigger_kwargs`` is overwritten from ``target_time``; the start in the triggerer is
    tested in tests/unit/sensors/test_start_from_trigger.py (Airflow 3.3+)."""
    sensor = TimeSensor(task_id="w", target_time=dt.time(9), start_from_trigger=False, trigger_kwargs={"moment": "x"})
    assert not sensor.start_from_trigger and not hasattr(sensor, "trigger_kwargs")
    TimeSensor(task_id="w", target_time=dt.time(9), start_from_trigger=False, trigger_kwargs=None)


# ------------------------------------------------------------------------------ WaitSensor
def test_wait_sensor_waits_from_when_the_task_starts() -> None:
    sensor = WaitSensor(task_id="w", time_to_wait=dt.timedelta(minutes=10), deferrable=True, timeout=3600)
    before = dt.datetime.now(UTC)
    target = dt.datetime.fromisoformat(deferred_target(sensor))
    after = dt.datetime.now(UTC)
    assert before + dt.timedelta(minutes=10) <= target <= after + dt.timedelta(minutes=10)


def test_wait_sensor_in_reschedule_mode_counts_from_the_first_start() -> None:
    sensor = WaitSensor(task_id="w", time_to_wait=5, deferrable=False, mode="reschedule", timeout=3600)
    context = make_context(sensor)
    context["ti"].first_reschedule_date = utc(2026, 1, 1, 12)
    sensor.fix_target(context)
    assert sensor._target_time == "2026-01-01T12:05:00+00:00"


def test_wait_sensor_in_poke_mode_waits_its_time() -> None:
    sensor = WaitSensor(task_id="w", time_to_wait="0", deferrable=False, poke_interval=0.01, timeout=5)
    assert sensor.execute(make_context(sensor))["status"] == "success"


def test_a_wait_longer_than_timeout_is_refused_at_parse() -> None:
    with pytest.raises(ValueError, match=r"time_to_wait \(2:00:00\) is longer than timeout \(3600 s\)"):
        WaitSensor(task_id="w", time_to_wait=120, timeout=3600)


@pytest.mark.parametrize("bad", [-5, dt.timedelta(seconds=-1), "x", 0.5, False])
def test_a_bad_time_to_wait_is_refused_at_parse_naming_it(bad: Any) -> None:
    with pytest.raises(ValueError, match=r"^time_to_wait must be"):
        WaitSensor(task_id="w", time_to_wait=bad)


def test_the_common_arguments_are_still_checked_at_parse() -> None:
    with pytest.raises(ValueError, match="poke_interval"):
        WaitSensor(task_id="w", time_to_wait=1, poke_interval=0)


# ------------------------------------------------------------ the trigger, end to end
async def test_the_deferred_wait_fires_at_its_moment_on_a_fake_clock() -> None:
    sensor = TimeDeltaSensor(
        task_id="w", delta=30, deferrable=True, poke_interval=600, timeout=86400, check_before_defer=False
    )
    trigger = assert_defers(sensor, DateTimeTrigger, context=make_context(sensor, data_interval_end=FUTURE_END))
    target = dt.datetime.fromisoformat(trigger.target_time).timestamp()
    # The deadline the sensor fixed is on the real clock, 2026-ish; move it along with the fake one.
    clock = FakeClock(start=target - 1500)
    trigger = DateTimeTrigger(**{**trigger.serialize()[1], "deadline": deadline_after(86400, clock=clock)})
    trigger.clock = clock  # type: ignore[misc]
    payload = await run_trigger_payload(trigger)
    assert payload == {"status": "success", "target_time": "2999-01-01T00:30:00+00:00"}
    assert clock.sleeps == [600, 600, 300]


async def test_a_near_wait_runs_on_the_real_clock_and_ends_from_the_trigger() -> None:
    sensor = WaitSensor(
        task_id="w",
        time_to_wait=dt.timedelta(seconds=0.3),
        deferrable=True,
        end_from_trigger=True,
        check_before_defer=False,
    )
    trigger = assert_defers(sensor, DateTimeTrigger)
    assert trigger.end_from_trigger is True
    event = await run_trigger(trigger)
    # With end_from_trigger the triggerer finishes the task with the payload as XCom.
    assert type(event).__name__ == "TaskSuccessEvent"
    assert event.xcoms["return_value"]["status"] == "success"
    assert event.xcoms["return_value"]["target_time"] == trigger.target_time


async def test_a_moment_beyond_the_timeout_times_out_softly_from_the_trigger() -> None:
    sensor = TimeSensor(
        task_id="w",
        target_time=dt.time(12),
        deferrable=True,
        timeout=90,
        soft_fail=True,
        end_from_trigger=True,
        check_before_defer=False,
    )
    trigger = assert_defers(sensor, DateTimeTrigger, context=make_context(sensor, data_interval_end=FUTURE_END))
    clock = FakeClock()
    trigger.clock = clock  # type: ignore[misc]
    trigger.deadline = deadline_after(90, clock=clock)
    trigger.validate()
    event = await run_trigger(trigger)
    assert type(event).__name__ == "TaskSkippedEvent"


def test_the_deferral_carries_one_total_budget() -> None:
    sensor = TimeDeltaSensor(task_id="w", delta=30, deferrable=True, timeout=600)
    with pytest.raises(TaskDeferred) as info:
        sensor.execute(make_context(sensor, data_interval_end=FUTURE_END))
    assert info.value.trigger.deadline is not None
    assert info.value.kwargs == {"deadline": info.value.trigger.deadline}


# ----------------------------------------------------------------------------- example DAG
def test_the_example_dag_parses_with_the_time_waits() -> None:
    import importlib.util

    path = REPO / "dags" / "example_datetime.py"
    spec = importlib.util.spec_from_file_location("example_datetime_dag", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    tasks = {task.task_id: task for task in module.dag.tasks}
    assert isinstance(tasks["at_half_past_six"], TimeSensor)
    sensor = tasks["at_half_past_six"]
    sensor.fix_target(make_context(sensor, data_interval_end=utc(2026, 7, 1, 22)))  # 00:00 CEST on 2 July
    assert sensor._target_time == "2026-07-02T16:30:00+00:00"
