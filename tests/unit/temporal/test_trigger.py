"""DateTimeTrigger / DateTimeSensor: exact firing, clock steps, timezones, timeout, no chatter."""

from __future__ import annotations

import datetime as dt
import logging
import re
import time

import pytest
from airflow.sdk import timezone
from airflow.sdk.exceptions import AirflowSkipException, TaskDeferred

from airflow_deferrable_kit.sensors.temporal import DateTimeSensor, to_utc_iso
from airflow_deferrable_kit.testing import FakeClock, make_context, run_trigger_payload, watch_blocking
from airflow_deferrable_kit.triggers.base import deadline_after
from airflow_deferrable_kit.triggers.temporal import DateTimeTrigger


def iso(ts: float) -> str:
    return dt.datetime.fromtimestamp(ts, tz=dt.timezone.utc).isoformat()


async def test_sleeps_straight_to_the_target_in_chunks_no_longer_than_the_poll_interval() -> None:
    clock = FakeClock(start=1_000_000.0)
    trigger = DateTimeTrigger(target_time=iso(clock.now + 150), poll_interval=60)
    trigger.clock = clock  # type: ignore[misc]
    payload = await run_trigger_payload(trigger)
    assert payload == {"status": "success", "target_time": iso(1_000_150.0)}
    assert clock.sleeps == [60, 60, 30]
    assert clock.now == 1_000_150.0  # fired at the target, not a poll interval late


async def test_a_forward_clock_step_is_noticed_at_the_next_recheck() -> None:
    class SteppingClock(FakeClock):
        async def sleep(self, seconds: float) -> None:
            await super().sleep(seconds)
            if len(self.sleeps) == 1:
                self.advance(3 * 3600)  # NTP jumps three hours ahead during the first sleep

    clock = SteppingClock(start=2_000_000.0)
    trigger = DateTimeTrigger(target_time=iso(clock.now + 2 * 3600), poll_interval=60)
    trigger.clock = clock  # type: ignore[misc]
    assert (await run_trigger_payload(trigger))["status"] == "success"
    assert clock.sleeps == [60]  # fired on the first re-check, not after two hours of sleeping


async def test_a_backward_clock_step_does_not_fire_early() -> None:
    class RewindingClock(FakeClock):
        async def sleep(self, seconds: float) -> None:
            await super().sleep(seconds)
            if len(self.sleeps) == 1:
                self.advance(-600)

    clock = RewindingClock(start=3_000_000.0)
    target = clock.now + 120
    trigger = DateTimeTrigger(target_time=iso(target), poll_interval=60)
    trigger.clock = clock  # type: ignore[misc]
    assert (await run_trigger_payload(trigger))["status"] == "success"
    assert clock.now >= target
    assert sum(clock.sleeps) == pytest.approx(720)


async def test_fires_on_the_real_clock_never_before_the_target_and_without_blocking() -> None:
    target = time.time() + 0.3
    with watch_blocking(0.05) as blocked:
        payload = await run_trigger_payload(DateTimeTrigger(target_time=iso(target), poll_interval=60))
    fired = time.time()
    assert payload["status"] == "success"
    assert fired >= target
    assert blocked == []
    print(f"DateTimeTrigger lateness on the real clock: {1000 * (fired - target):.1f} ms")


async def test_a_target_after_the_deadline_times_out_at_the_deadline() -> None:
    clock = FakeClock(start=4_000_000.0)
    trigger = DateTimeTrigger(
        target_time=iso(clock.now + 3600), poll_interval=60, deadline=deadline_after(90, clock=clock)
    )
    trigger.clock = clock  # type: ignore[misc]
    payload = await run_trigger_payload(trigger)
    assert payload["status"] == "timeout"
    assert clock.now == pytest.approx(4_000_090.0)


async def test_waiting_writes_no_log_line_per_sleep(caplog: pytest.LogCaptureFixture) -> None:
    clock = FakeClock(start=5_000_000.0)
    trigger = DateTimeTrigger(target_time=iso(clock.now + 3600), poll_interval=10)
    trigger.clock = clock  # type: ignore[misc]
    caplog.set_level(logging.DEBUG)
    with caplog.at_level(logging.INFO):
        await run_trigger_payload(trigger)
    assert len(clock.sleeps) == 360
    ours = [r for r in caplog.records if "DateTimeTrigger" in r.name and r.levelno >= logging.INFO]
    assert len(ours) <= 2  # "waiting" and "satisfied", not one per sleep


# ----------------------------------------------------------------------------- the sensor
def test_aware_values_keep_their_instant() -> None:
    assert to_utc_iso("2026-06-01T12:00:00+02:00") == "2026-06-01T10:00:00+00:00"
    moment = dt.datetime(2026, 6, 1, 12, tzinfo=dt.timezone(dt.timedelta(hours=-5)))
    assert to_utc_iso(moment) == "2026-06-01T17:00:00+00:00"


def test_naive_values_follow_airflows_default_timezone() -> None:
    try:
        timezone.initialize("Europe/Amsterdam")
        assert to_utc_iso("2026-06-01T12:00:00") == "2026-06-01T10:00:00+00:00"  # CEST, UTC+2
        assert to_utc_iso(dt.datetime(2026, 1, 15, 12)) == "2026-01-15T11:00:00+00:00"  # CET, UTC+1
    finally:
        timezone.initialize("UTC")
    assert to_utc_iso("2026-06-01T12:00:00") == "2026-06-01T12:00:00+00:00"


@pytest.mark.parametrize("free_form", ["Jan 1 2024 11pm", "2024-01-01 23:00", "1 January 2024 23:00:00"])
def test_free_form_dates_parse_as_the_official_sensor_parses_them(free_form: str) -> None:
    from airflow.sdk import timezone

    official = timezone.parse(free_form)  # what airflow.providers.standard's DateTimeSensor calls
    assert to_utc_iso(free_form) == official.astimezone(dt.timezone.utc).isoformat()
    assert to_utc_iso(free_form) == "2024-01-01T23:00:00+00:00"
    assert DateTimeSensor(task_id="w", target_time=free_form).build_trigger(deadline=None).target_time == (
        "2024-01-01T23:00:00+00:00"
    )


@pytest.mark.parametrize("bad", ["not a date", "2026-13-45T00:00:00", ""])
def test_unparsable_target_fails_at_dag_parse_naming_the_argument(bad: str) -> None:
    with pytest.raises(ValueError, match="target_time could not be parsed"):
        DateTimeSensor(task_id="w", target_time=bad)


def test_wrong_type_is_refused() -> None:
    with pytest.raises(TypeError, match="target_time must be a datetime or an ISO 8601 string"):
        DateTimeSensor(task_id="w", target_time=12345)  # type: ignore[arg-type]


def test_templated_target_is_accepted_and_rendered_later() -> None:
    sensor = DateTimeSensor(task_id="w", target_time="{{ data_interval_end }}", deferrable=True)
    assert sensor.target_time == "{{ data_interval_end }}"
    assert "target_time" in sensor.template_fields


def test_a_passed_moment_succeeds_at_once_and_a_future_one_defers() -> None:
    past = DateTimeSensor(task_id="past", target_time="2020-01-01T00:00:00+00:00", deferrable=True)
    assert past.execute(make_context(past))["status"] == "success"
    future = DateTimeSensor(task_id="future", target_time="2999-01-01T00:00:00+00:00", deferrable=True, timeout=60)
    with pytest.raises(TaskDeferred) as info:
        future.execute(make_context(future))
    trigger = info.value.trigger
    assert isinstance(trigger, DateTimeTrigger)
    assert trigger.target_time == "2999-01-01T00:00:00+00:00"
    assert trigger.deadline is not None  # the sensor timeout is honoured, unlike DateTimeSensorAsync


def test_poke_mode_times_out_softly_when_the_target_is_beyond_the_timeout() -> None:
    sensor = DateTimeSensor(
        task_id="p",
        target_time="2999-01-01T00:00:00+00:00",
        deferrable=False,
        poke_interval=0.01,
        timeout=0.05,
        soft_fail=True,
    )
    with pytest.raises(AirflowSkipException):
        sensor.execute(make_context(sensor))


# ----------------------------------------------------------- moments UTC cannot hold
MINUS_FIVE = dt.timezone(dt.timedelta(hours=-5))


@pytest.mark.parametrize(
    "moment",
    [
        "9999-12-31T23:00:00-05:00",  # 04:00 on 10000-01-01 in UTC: past the last datetime
        "0001-01-01T01:00:00+05:00",  # 20:00 on 0000-12-31 in UTC: before the first one
        dt.datetime(9999, 12, 31, 23, tzinfo=MINUS_FIVE),
    ],
    ids=["end-of-9999-minus-5h", "start-of-0001-plus-5h", "aware-datetime"],
)
def test_a_target_time_utc_cannot_hold_is_refused_at_dag_parse_naming_it(moment: str | dt.datetime) -> None:
    with pytest.raises(ValueError, match="target_time must be a moment between 0001-01-01 and 9999-12-31 in UTC"):
        DateTimeSensor(task_id="w", target_time=moment)


@pytest.mark.parametrize("offset", ["+25:00", "-24:30", "+24:00"])
def test_a_target_time_whose_offset_is_a_day_or_more_is_refused_at_dag_parse_naming_it(offset: str) -> None:
    """pendulum parses ``+25:00``; Python's timezones refuse it with a message naming nothing."""
    moment = f"2030-01-01T00:00:00{offset}"
    with pytest.raises(ValueError, match=rf"^target_time must have a UTC offset .*, got {re.escape(repr(moment))}$"):
        DateTimeSensor(task_id="w", target_time=moment)
    with pytest.raises(ValueError, match=rf"^target_time must have a UTC offset .*, got {re.escape(repr(moment))}$"):
        DateTimeTrigger(target_time=moment)  # the trigger reads it as the sensor does


def test_a_naive_target_utc_cannot_hold_in_the_default_timezone_is_refused() -> None:
    try:
        timezone.initialize("America/New_York")
        with pytest.raises(ValueError, match=r"target_time must be a moment .*'9999-12-31T23:00:00'"):
            DateTimeSensor(task_id="w", target_time="9999-12-31T23:00:00")
    finally:
        timezone.initialize("UTC")


@pytest.mark.parametrize("moment", ["9999-12-31T23:00:00-05:00", "0001-01-01T01:00:00+05:00"])
def test_the_trigger_refuses_a_target_time_or_deadline_utc_cannot_hold(moment: str) -> None:
    with pytest.raises(ValueError, match="target_time must be a moment between"):
        DateTimeTrigger(target_time=moment)
    with pytest.raises(ValueError, match="deadline must be a moment between"):
        DateTimeTrigger(target_time="2030-01-01T00:00:00+00:00", deadline=moment)


def test_the_last_moment_utc_can_hold_is_accepted() -> None:
    sensor = DateTimeSensor(task_id="w", target_time="9999-12-31T18:59:59-05:00")
    assert sensor.build_trigger(deadline=None).target_time == "9999-12-31T23:59:59+00:00"
