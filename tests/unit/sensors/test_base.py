"""The deferrable sensor: default_deferrable, check-before-defer, resume semantics, poke paths."""

from __future__ import annotations

import datetime as dt
from pathlib import Path

import pytest
from airflow.sdk.exceptions import (
    AirflowRescheduleException,
    AirflowSensorTimeout,
    AirflowSkipException,
    TaskDeferralError,
    TaskDeferred,
)

from airflow_deferrable_kit._arguments import MAX_SECONDS
from airflow_deferrable_kit.extras import MissingExtraError
from airflow_deferrable_kit.sensors.base import BACKSTOP_GRACE, LOG_PREVIEW_BYTES, WaitFailedError, log_preview
from airflow_deferrable_kit.testing import assert_defers, make_context
from airflow_deferrable_kit.triggers.base import parse_deadline
from tests.unit.sample import CHECKS, NeedsMissingExtraSensor, ScriptedSensor, ScriptedTrigger, script

SUCCESS = {"status": "success", "script": "x", "checks": 1}
TIMEOUT = {"status": "timeout", "message": "deadline passed"}
ERROR = {"status": "error", "error_type": "authorization", "message": "403 Forbidden"}


def sensor(name: str, *steps: str, **kwargs: object) -> ScriptedSensor:
    return ScriptedSensor(task_id=f"wait_{name}", script=script(name, *steps), **kwargs)


# ------------------------------------------------------------------------------ construction
def test_deferrable_follows_default_deferrable_read_at_construction(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AIRFLOW__OPERATORS__DEFAULT_DEFERRABLE", "False")
    assert sensor("d0", "none").deferrable is False
    monkeypatch.setenv("AIRFLOW__OPERATORS__DEFAULT_DEFERRABLE", "True")
    assert sensor("d1", "none").deferrable is True
    assert sensor("d2", "none", deferrable=False).deferrable is False


def test_missing_required_argument_is_named() -> None:
    with pytest.raises(TypeError, match=r"ScriptedSensor \(task_id='w'\) missing required argument\(s\): script"):
        ScriptedSensor(task_id="w")


def test_bad_argument_fails_at_dag_parse_naming_it() -> None:
    with pytest.raises(ValueError, match="script must be a non-empty name"):
        ScriptedSensor(task_id="w", script="")
    with pytest.raises(ValueError, match="poke_interval must be a positive number"):
        ScriptedSensor(task_id="w", script="s", poke_interval=0)


@pytest.mark.parametrize("flag", ["deferrable", "check_before_defer", "end_from_trigger", "start_from_trigger"])
@pytest.mark.parametrize("value", ["yes", 1, 0, "False"], ids=["yes", "one", "zero", "string-False"])
def test_a_flag_that_is_not_a_bool_is_refused_at_dag_parse_naming_it(flag: str, value: object) -> None:
    """``start_from_trigger="yes"`` used to be taken for True, and made ``deferrable`` the string itself."""
    with pytest.raises(ValueError, match=rf"^{flag} expects True or False.*, got {value!r}$"):
        sensor("flag", "none", **{flag: value})


def test_deferrable_none_still_means_the_configured_default(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AIRFLOW__OPERATORS__DEFAULT_DEFERRABLE", "True")
    assert sensor("none_flag", "none", deferrable=None).deferrable is True


@pytest.mark.parametrize("argument", ["timeout", "poke_interval", "max_backoff"])
@pytest.mark.parametrize(
    "value",
    [1e12, float("inf"), float("nan"), -1, True, "60", dt.timedelta(days=365 * 200)],
    ids=["1e12", "inf", "nan", "negative", "bool", "string", "two-centuries"],
)
def test_durations_are_checked_at_dag_parse_against_what_a_deadline_can_hold(argument: str, value: object) -> None:
    """1e12 seconds is accepted by Airflow's BaseSensorOperator, but its deadline (year 33,700)
    cannot be written as a date, so it used to fail only when the task ran; inf crashed Airflow's
    own check with a bare OverflowError, and True was read as one second."""
    with pytest.raises(ValueError) as caught:
        sensor("durations", "none", **{argument: value})
    message = str(caught.value)
    assert message.startswith(f"{argument} must be a "), message
    assert message.endswith(f"got {value!r}"), message


def test_durations_up_to_a_century_defer_with_a_deadline_airflow_can_store() -> None:
    s = sensor("longest", "none", deferrable=True, timeout=MAX_SECONDS, poke_interval=MAX_SECONDS)
    trigger = assert_defers(s, ScriptedTrigger)
    assert trigger.deadline is not None
    assert parse_deadline(trigger.deadline) > dt.datetime.now(dt.timezone.utc).timestamp() + MAX_SECONDS - 60
    assert sensor("max-backoff", "none", max_backoff=MAX_SECONDS).max_backoff == MAX_SECONDS


def test_durations_may_be_timedeltas_and_a_timeout_may_be_zero_as_in_airflow() -> None:
    s = sensor("timedeltas", "none", timeout=dt.timedelta(hours=2), poke_interval=dt.timedelta(seconds=5))
    assert (s.timeout, s.poke_interval) == (7200, 5)
    assert sensor("zero-timeout", "none", timeout=0).timeout == 0
    with pytest.raises(ValueError, match="poke_interval must be a positive number of seconds"):
        sensor("zero-interval", "none", poke_interval=dt.timedelta(0))


def test_a_default_timeout_from_the_config_is_checked_too(monkeypatch: pytest.MonkeyPatch) -> None:
    import inspect

    from airflow.sdk import BaseSensorOperator

    monkeypatch.setenv("AIRFLOW__SENSORS__DEFAULT_TIMEOUT", "1e12")  # read when the sensor is built (3.3)
    defaults = inspect.unwrap(BaseSensorOperator.__init__).__kwdefaults__ or {}
    if defaults.get("timeout") is not None:  # Airflow 3.2 read it once, at import, as a default value
        monkeypatch.setitem(defaults, "timeout", 1e12)
    with pytest.raises(ValueError, match=r"^timeout \(from \[sensors\] default_timeout\) must be a number"):
        sensor("conf-timeout", "none")


def test_templated_arguments_are_validated_after_rendering() -> None:
    templated = ScriptedSensor(task_id="w", script="s", note="{{ ds }}", deferrable=True)
    assert templated.note == "{{ ds }}"


def test_missing_extra_names_the_pip_command_at_construction() -> None:
    with pytest.raises(MissingExtraError, match=r'pip install "airflow-deferrable-kit\[imaginary\]"'):
        NeedsMissingExtraSensor(task_id="w")


def test_sensor_accepts_the_trigger_parameters_as_its_own() -> None:
    s = sensor("params", "none", note="abc", tags=["a"], poke_interval=3, max_backoff=9, end_from_trigger=True)
    trigger = s.build_trigger(deadline=None)
    assert (trigger.note, trigger.tags, trigger.poll_interval, trigger.max_backoff) == ("abc", ["a"], 3, 9)
    assert trigger.end_from_trigger is True


# --------------------------------------------------------------------------------- deferring
def test_defers_with_an_absolute_deadline_of_the_sensor_timeout() -> None:
    s = sensor("defer", "none", deferrable=True, timeout=3600, soft_fail=True)
    before = dt.datetime.now(dt.timezone.utc).timestamp()
    with pytest.raises(TaskDeferred) as info:
        s.execute(make_context(s))
    trigger = info.value.trigger
    assert isinstance(trigger, ScriptedTrigger)
    assert trigger.deadline is not None
    assert before + 3600 <= parse_deadline(trigger.deadline) <= before + 3600 + 60
    assert trigger.soft_fail is True
    assert info.value.method_name == "execute_complete"
    assert info.value.kwargs == {"deadline": trigger.deadline}
    assert info.value.timeout is not None
    assert 3600 < info.value.timeout.total_seconds() <= 3600 + BACKSTOP_GRACE.total_seconds()
    assert CHECKS["defer"] == 1  # looked once in the worker before deferring


def test_an_already_true_condition_finishes_without_deferring() -> None:
    s = sensor("ready", "found", deferrable=True)
    assert s.execute(make_context(s)) == {"status": "success", "script": "ready", "checks": 1}


def test_check_before_defer_can_be_turned_off() -> None:
    s = sensor("nocheck", "found", deferrable=True, check_before_defer=False)
    assert_defers(s, ScriptedTrigger)
    assert CHECKS["nocheck"] == 0


def test_a_fatal_error_before_deferring_fails_even_with_soft_fail() -> None:
    s = sensor("fatal-first", "fatal", deferrable=True, soft_fail=True)
    with pytest.raises(WaitFailedError, match="authorization: access denied"):
        s.execute(make_context(s))


def test_re_deferral_keeps_the_same_deadline() -> None:
    s = sensor("again", "none", deferrable=True)
    first = assert_defers(s, ScriptedTrigger)
    assert first.deadline is not None
    with pytest.raises(TaskDeferred) as info:
        s.defer_until(first.deadline)
    assert info.value.trigger.deadline == first.deadline


# ----------------------------------------------------------------------------------- resuming
def resume(s: ScriptedSensor, event: dict) -> object:
    return s.resume_execution("execute_complete", {"event": event, "deadline": None}, make_context(s))


def test_success_event_payload_becomes_the_return_value() -> None:
    assert resume(sensor("r1", "none"), SUCCESS) == SUCCESS


def test_a_large_payload_is_returned_whole_and_logged_as_a_marked_cut(monkeypatch: pytest.MonkeyPatch) -> None:
    s = sensor("r1big", "none")
    lines: list[str] = []
    monkeypatch.setattr(type(s), "log", property(lambda self: Recorder(lines)))
    big = {**SUCCESS, "body": "x" * 40_000}
    assert resume(s, big) == big  # the XCom keeps it all
    [line] = [line for line in lines if line.startswith("Condition met")]
    assert len(line) < LOG_PREVIEW_BYTES + 200 and "more characters]" in line
    assert log_preview(SUCCESS) == SUCCESS  # a small one is logged as it is


class Recorder:
    """A stand-in task logger keeping each formatted line."""

    def __init__(self, lines: list[str]) -> None:
        self.lines = lines

    def info(self, message: str, *args: object) -> None:
        self.lines.append(message % args)

    warning = debug = error = info


@pytest.mark.parametrize("soft_fail", [False, True])
def test_timeout_event_raises_sensor_timeout_or_skips_with_soft_fail(soft_fail: bool) -> None:
    s = sensor("r2", "none", soft_fail=soft_fail)
    expected = AirflowSkipException if soft_fail else AirflowSensorTimeout
    with pytest.raises(expected, match="deadline passed"):
        resume(s, TIMEOUT)


@pytest.mark.parametrize("soft_fail", [False, True])
def test_error_event_fails_the_task_even_with_soft_fail(soft_fail: bool) -> None:
    s = sensor("r3", "none", soft_fail=soft_fail)
    with pytest.raises(WaitFailedError, match="authorization: 403 Forbidden"):
        resume(s, ERROR)


def test_never_fail_skips_errors_because_the_user_asked_for_it() -> None:
    with pytest.raises(AirflowSkipException, match="never_fail"):
        resume(sensor("r4", "none", never_fail=True), ERROR)


def test_unexpected_event_payload_fails_clearly() -> None:
    with pytest.raises(WaitFailedError, match="unexpected trigger event payload"):
        resume(sensor("r5", "none", soft_fail=True), {"surprise": True})  # type: ignore[arg-type]


@pytest.mark.parametrize(("soft_fail", "expected"), [(False, AirflowSensorTimeout), (True, AirflowSkipException)])
def test_airflow_backstop_timeout_is_a_sensor_timeout(soft_fail: bool, expected: type) -> None:
    s = sensor("r6", "none", soft_fail=soft_fail)
    with pytest.raises(expected):
        s.resume_execution("__fail__", {"error": "Trigger timeout"}, make_context(s))


def test_a_crashed_trigger_fails_the_task_even_with_soft_fail() -> None:
    s = sensor("r7", "none", soft_fail=True)
    with pytest.raises(TaskDeferralError):
        s.resume_execution("__fail__", {"error": "Trigger failure"}, make_context(s))


def test_a_crashed_trigger_skips_with_never_fail_as_airflows_sensor_does() -> None:
    """BaseSensorOperator.resume_execution skips a TaskDeferralError with never_fail; so does this."""
    s = sensor("r8", "none", never_fail=True)
    with pytest.raises(AirflowSkipException, match=r"never_fail.*Trigger failure") as info:
        s.resume_execution("__fail__", {"error": "Trigger failure"}, make_context(s))
    assert isinstance(info.value.__cause__, TaskDeferralError)
    with pytest.raises(AirflowSkipException, match="never_fail"):  # the error event, for comparison
        resume(sensor("r9", "none", never_fail=True), ERROR)


# -------------------------------------------------------------------------- deferrable=False
def test_poke_mode_uses_the_same_check_and_returns_the_payload() -> None:
    s = sensor("poke", "none", "transient", "none", "found", deferrable=False, poke_interval=0.01)
    assert s.execute(make_context(s)) == {"status": "success", "script": "poke", "checks": 4}


def test_poke_mode_times_out_or_skips() -> None:
    s = sensor("poke-timeout", "none", deferrable=False, poke_interval=0.01, timeout=0.05)
    with pytest.raises(AirflowSensorTimeout):
        s.execute(make_context(s))
    s = sensor("poke-skip", "none", deferrable=False, poke_interval=0.01, timeout=0.05, soft_fail=True)
    with pytest.raises(AirflowSkipException):
        s.execute(make_context(s))


def test_poke_mode_error_fails_even_with_soft_fail() -> None:
    s = sensor("poke-fatal", "none", "fatal", deferrable=False, poke_interval=0.01, soft_fail=True)
    with pytest.raises(WaitFailedError, match="access denied"):
        s.execute(make_context(s))


def test_reschedule_mode_frees_the_slot_between_pokes() -> None:
    s = sensor("resched", "none", deferrable=False, mode="reschedule", poke_interval=30)
    before = dt.datetime.now(dt.timezone.utc)
    with pytest.raises(AirflowRescheduleException) as info:
        s.execute(make_context(s))
    assert info.value.reschedule_date >= before + dt.timedelta(seconds=29)
    s2 = sensor("resched-ok", "found", deferrable=False, mode="reschedule")
    assert s2.execute(make_context(s2))["status"] == "success"


def test_a_trigger_parameter_that_clashes_with_an_operator_attribute_is_refused_at_class_definition() -> None:
    from airflow_deferrable_kit.payload import Found
    from airflow_deferrable_kit.sensors.base import DeferrableSensor
    from airflow_deferrable_kit.triggers.base import PollingTrigger

    class LabelTrigger(PollingTrigger):
        label: str = ""

        async def check(self) -> Found | None:
            return None

    with pytest.raises(TypeError, match="parameter\\(s\\) label of LabelTrigger clash"):

        class LabelSensor(DeferrableSensor):
            trigger_class = LabelTrigger


# --------------------------------------------------------------------------------- templates
class _FileTemplatedSensor(ScriptedSensor):
    template_fields = ("note", "tags")
    template_ext = (".sql",)
    file_template_fields = ("note",)


def test_template_ext_reads_files_only_for_file_template_fields(tmp_path: Path) -> None:
    from airflow.sdk import DAG

    (tmp_path / "daily.sql").write_text("select {{ ds }}")
    with DAG("file_templates", schedule=None, template_searchpath=[str(tmp_path)]):
        sensor = _FileTemplatedSensor(task_id="t", script="s", note="daily.sql", tags=["daily.sql", "{{ ds }}"])
    sensor.resolve_template_files()
    assert sensor.note == "select {{ ds }}"  # the file was read
    assert sensor.tags == ["daily.sql", "{{ ds }}"]  # a value that only ends in .sql stays a value
    context = make_context(sensor, ds="2026-12-01")
    sensor.render_template_fields(context)
    assert sensor.note == "select 2026-12-01"
    assert sensor.tags == ["daily.sql", "2026-12-01"]


def test_assert_defers_renders_templated_fields_as_the_worker_does() -> None:
    sensor = ScriptedSensor(task_id="templated", script="templated-defer", note="{{ ds }}", deferrable=True)
    script("templated-defer", "none")
    trigger = assert_defers(sensor, ScriptedTrigger, context=make_context(sensor, ds="2026-12-01"))
    assert trigger.note == "2026-12-01"


def test_exponential_backoff_is_refused_when_deferring_and_kept_when_poking() -> None:
    """Airflow's own sensors space out worker pokes with it; a deferred wait polls from the
    triggerer and backs off on errors by itself, so asking for it there is refused, not ignored."""
    from airflow_deferrable_kit.sensors.temporal import DateTimeSensor

    with pytest.raises(ValueError, match=r"exponential_backoff=True \(and max_wait\) only space out pokes"):
        DateTimeSensor(task_id="w", target_time="2030-01-01T00:00:00+00:00", deferrable=True, exponential_backoff=True)
    poking = DateTimeSensor(
        task_id="w", target_time="2030-01-01T00:00:00+00:00", deferrable=False, exponential_backoff=True, max_wait=60
    )
    assert poking.exponential_backoff is True and poking.max_wait == dt.timedelta(seconds=60)  # Airflow's poke loop
