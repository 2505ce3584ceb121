"""start_from_trigger: a sensor's task starts in the triggerer, with its templates rendered there.

The scheduler (Airflow 3.3+) builds the trigger from the task's ``start_trigger_args`` with the
arguments as written, sets the trigger timeout of the try (``timeout_after``), renders the
arguments named like the sensor's template fields, and runs it. These tests do each of those
steps as Airflow's own code does them; tests/e2e/test_start_from_trigger_e2e.py runs a real one.
"""

from __future__ import annotations

import datetime as dt
import time
from typing import Any

import pytest
from airflow.sdk import DAG
from airflow.serialization.serialized_objects import DagSerialization

from airflow_deferrable_kit.sensors.base import BACKSTOP_GRACE, WaitFailedError
from airflow_deferrable_kit.sensors.http import HttpBatchReadySensor
from airflow_deferrable_kit.sensors.kafka import KafkaMessageSensor
from airflow_deferrable_kit.sensors.s3 import S3KeySensor
from airflow_deferrable_kit.sensors.temporal import DateTimeSensor, TimeDeltaSensor, TimeSensor, WaitSensor
from airflow_deferrable_kit.testing import run_trigger
from airflow_deferrable_kit.triggers.base import BACKSTOP_SECONDS
from airflow_deferrable_kit.triggers.kafka import KafkaMessageTrigger
from airflow_deferrable_kit.triggers.s3 import S3KeyTrigger
from airflow_deferrable_kit.triggers.temporal import DateTimeTrigger, RunMomentTrigger

# The scheduler renders templates in the triggerer from 3.3 on (earlier, start_from_trigger is refused
# at parse: tested here with the version set).
pytestmark = pytest.mark.airflow_3_3


def started(trigger_cls: type[Any], kwargs: dict[str, Any], *, fields: tuple[str, ...], context: dict[str, Any]) -> Any:
    """The trigger as Airflow's triggerer makes it: built from the raw kwargs, then rendered."""
    trigger = trigger_cls(**kwargs)
    trigger.template_fields = tuple(name for name in fields if name in kwargs)
    trigger.render_template_fields(context)
    return trigger


async def first_event(trigger: Any) -> Any:
    async for event in trigger.run():
        return event
    raise AssertionError("no event")


def test_a_static_sensor_carries_checked_kwargs_with_a_budget_and_no_deadline() -> None:
    sensor = DateTimeSensor(
        task_id="at", target_time="2030-01-01T10:00:00+01:00", timeout=600, start_from_trigger=True, deferrable=True
    )
    args = sensor.start_trigger_args
    assert sensor.start_from_trigger is True and args is not None
    assert args.trigger_cls == "airflow_deferrable_kit.triggers.temporal.DateTimeTrigger"
    assert args.trigger_kwargs is not None
    assert args.trigger_kwargs["target_time"] == "2030-01-01T09:00:00+00:00"  # checked and normalised at parse
    assert args.trigger_kwargs["start_budget"] == 600.0 and args.trigger_kwargs["deadline"] is None
    assert args.next_method == "execute_complete" and args.timeout == dt.timedelta(seconds=600) + BACKSTOP_GRACE
    DateTimeTrigger(**args.trigger_kwargs)  # buildable as the triggerer will


def test_the_start_arguments_reach_the_serialized_dag() -> None:
    with DAG(dag_id="sft", schedule=None, start_date=dt.datetime(2024, 1, 1)) as dag:
        S3KeySensor(
            task_id="wait",
            bucket_key="s3://bucket/{{ ds }}/data.csv",
            aws_conn_id="aws",
            deferrable=True,
            start_from_trigger=True,
            end_from_trigger=True,
            timeout=120,
        )
    task = DagSerialization.from_dict(DagSerialization.to_dict(dag)).get_task("wait")
    assert task.start_from_trigger is True
    kwargs = task.start_trigger_args.trigger_kwargs
    kwargs = kwargs.get("__var", kwargs)
    assert kwargs["bucket_key"] == "s3://bucket/{{ ds }}/data.csv"  # rendered in the triggerer
    assert kwargs["start_budget"] == 120.0 and kwargs["end_from_trigger"] is True


def test_templates_are_rendered_in_the_triggerer_and_then_checked() -> None:
    sensor = S3KeySensor(
        task_id="wait", bucket_key="s3://bucket/{{ ds }}/data.csv", aws_conn_id="aws", deferrable=True,
        start_from_trigger=True, timeout=60,
    )  # fmt: skip
    kwargs = sensor.start_trigger_args.trigger_kwargs
    trigger = started(S3KeyTrigger, kwargs, fields=sensor.template_fields, context={"ds": "2026-12-02"})
    assert trigger._unbuilt is None
    assert trigger.bucket_key == "s3://bucket/2026-12-02/data.csv"


async def test_a_rendered_value_that_is_not_valid_ends_the_wait_with_one_clear_error() -> None:
    sensor = DateTimeSensor(
        task_id="at", target_time="{{ ds }} soon", timeout=60, start_from_trigger=True, deferrable=True
    )  # not a moment, on a worker either
    kwargs = sensor.start_trigger_args.trigger_kwargs
    trigger = started(DateTimeTrigger, kwargs, fields=sensor.template_fields, context={"ds": "2026-12-02"})
    event = await first_event(trigger)
    assert event.payload["status"] == "error" and event.payload["error_type"] == "bad_configuration"
    assert "rendered in the triggerer" in event.payload["message"]
    assert "target_time could not be parsed as a date and time: '2026-12-02 soon'" in event.payload["message"]


# ------------------------------------------------ the sensor's normalisation, after rendering
def as_the_triggerer_builds(dag: DAG, task_id: str, context: dict[str, Any]) -> Any:
    """The trigger as Airflow makes it from the serialized DAG: the scheduler's start_trigger_args
    (encoded in the DAG, decoded by the triggerer as ``create_triggers`` does), then rendered."""
    from airflow._shared.module_loading import import_string
    from airflow.serialization.decoders import smart_decode_trigger_kwargs

    task = DagSerialization.from_dict(DagSerialization.to_dict(dag)).get_task(task_id)
    args = task.start_trigger_args
    encoded = smart_decode_trigger_kwargs(args.trigger_kwargs)
    kwargs = {name: smart_decode_trigger_kwargs(value) for name, value in encoded.items()}
    return started(import_string(args.trigger_cls), kwargs, fields=tuple(task.template_fields), context=context)


def as_a_worker_builds(sensor: Any, context: dict[str, Any]) -> Any:
    """The trigger a worker defers with, from the same run: rendered, then ``build_trigger``."""
    sensor.render_template_fields(context)
    return sensor.build_trigger(deadline=None)


WAIT_KWARGS = ("poll_interval", "end_from_trigger", "soft_fail", "never_fail", "do_xcom_push", "max_backoff")


@pytest.mark.parametrize(
    "make",
    [
        lambda: S3KeySensor(
            task_id="w", bucket_key=("s3://exports/{{ ds }}/a.csv", "s3://exports/b.csv"), aws_conn_id="aws",
            start_from_trigger=True,
        ),
        lambda: DateTimeSensor(task_id="w", target_time="{{ ds }}", start_from_trigger=True),
        lambda: DateTimeSensor(task_id="w", target_time="{{ ds }}T06:00:00+02:00", start_from_trigger=True),
    ],
    ids=["s3-tuple-of-keys", "datetime-date-only", "datetime-with-offset"],
)  # fmt: skip
def test_the_triggerer_normalises_rendered_values_as_the_worker_does(make: Any) -> None:
    """The sensor's normalisation used to be skipped in the triggerer: a tuple of keys was refused
    (bad_configuration) and ``{{ ds }}`` was no moment, where the worker path waited on both."""
    with DAG(dag_id="sft_normalised", schedule=None, start_date=dt.datetime(2024, 1, 1)) as dag:
        sensor = make()
    context = {"ds": "2026-12-02"}
    in_triggerer = as_the_triggerer_builds(dag, "w", context)
    assert in_triggerer._unbuilt is None, in_triggerer._unbuilt
    on_worker = as_a_worker_builds(make(), context)
    wait = [name for name in sensor.wait_parameter_names()]
    assert {name: getattr(in_triggerer, name) for name in [*wait, *WAIT_KWARGS]} == {
        name: getattr(on_worker, name) for name in [*wait, *WAIT_KWARGS]
    }


class _LowercaseBucketSensor(S3KeySensor):
    """A user's own sensor normalising an argument known at parse (``bucket_name``) in trigger_params."""

    def trigger_params(self) -> dict[str, Any]:
        params = super().trigger_params()
        params["bucket_name"] = params["bucket_name"].lower()
        return params


class _StrippedKeySensor(S3KeySensor):
    """A user's own sensor normalising a templated argument in trigger_params: no sensor runs
    after rendering in the triggerer, so this cannot be applied there."""

    def trigger_params(self) -> dict[str, Any]:
        params = super().trigger_params()
        params["bucket_key"] = params["bucket_key"].strip()
        return params


def test_a_subclass_trigger_params_applies_to_what_is_known_at_parse_even_beside_a_template() -> None:
    """trigger_params() was skipped whenever any argument was templated."""
    with DAG(dag_id="sft_subclass", schedule=None, start_date=dt.datetime(2024, 1, 1)) as dag:
        _LowercaseBucketSensor(
            task_id="w", bucket_key="{{ ds }}/a.csv", bucket_name="Exports", aws_conn_id="aws", start_from_trigger=True
        )
    trigger = as_the_triggerer_builds(dag, "w", {"ds": "2026-12-02"})
    assert trigger._unbuilt is None, trigger._unbuilt
    assert (trigger.bucket_name, trigger.bucket_key) == ("exports", "2026-12-02/a.csv")


def test_a_subclass_trigger_params_that_changes_a_templated_value_is_refused_at_parse() -> None:
    with pytest.raises(ValueError, match=r"start_from_trigger=True: _StrippedKeySensor\.trigger_params\(\) changes the "
                       r"templated bucket_key.*S3KeyTrigger\.normalise\(\)"):  # fmt: skip
        _StrippedKeySensor(
            task_id="w", bucket_key=" s3://exports/{{ ds }}/a.csv ", aws_conn_id="aws", start_from_trigger=True
        )
    _StrippedKeySensor(task_id="w", bucket_key=" s3://exports/{{ ds }}/a.csv ", aws_conn_id="aws")  # a worker runs it


@pytest.mark.parametrize(
    ("template", "error"),
    [
        ("s3://bucket/{{ 1 // 0 }}/data.csv", "ZeroDivisionError"),
        ("s3://bucket/{{ ds /data.csv", "TemplateSyntaxError"),
    ],
    ids=["raises", "does-not-parse"],
)
async def test_a_template_that_fails_in_the_triggerer_ends_the_wait_with_one_error_naming_the_argument(
    template: str, error: str
) -> None:
    sensor = S3KeySensor(task_id="wait", bucket_key=template, aws_conn_id="aws", start_from_trigger=True, timeout=60)
    kwargs = sensor.start_trigger_args.trigger_kwargs
    trigger = started(S3KeyTrigger, kwargs, fields=sensor.template_fields, context={"ds": "2026-12-02"})
    event = await first_event(trigger)
    assert (event.payload["status"], event.payload["error_type"]) == ("error", "bad_configuration")
    assert event.payload["message"].startswith(
        f"S3KeyTrigger: bucket_key could not be rendered in the triggerer: {error}"
    )


async def test_a_missing_conf_key_fails_the_task_with_the_triggers_one_error_not_jinjas() -> None:
    """The trigger reports the missing value (bad_configuration naming bucket_key); the worker that
    resumes the task renders again, strictly, and used to end the task with Jinja's UndefinedError."""
    from airflow.sdk.api.datamodels._generated import DagRun, TIRunContext
    from airflow.sdk.execution_time.task_runner import RuntimeTaskInstance
    from airflow.sdk.serde import serialize

    with DAG(dag_id="sft_conf", schedule=None, start_date=dt.datetime(2024, 1, 1)) as dag:
        sensor = S3KeySensor(
            task_id="wait", bucket_key="{{ dag_run.conf['export'] }}", bucket_name="exports", aws_conn_id="aws",
            start_from_trigger=True, timeout=60,
        )  # fmt: skip
    run = DagRun.model_construct(conf={})  # the run was triggered without the "export" key
    trigger = started(S3KeyTrigger, sensor.start_trigger_args.trigger_kwargs, fields=sensor.template_fields,
                      context={"dag_run": run})  # fmt: skip
    payload = (await run_trigger(trigger)).payload
    assert (payload["status"], payload["error_type"]) == ("error", "bad_configuration")
    assert "bucket_key" in payload["message"]

    # The worker resuming the task, as Airflow's task runner does it: the event in next_kwargs,
    # the DAG's strict template environment, then resume_execution.
    from_server = TIRunContext.model_construct(
        next_method="execute_complete", next_kwargs=serialize({"event": payload})
    )
    ti = RuntimeTaskInstance.model_construct(task_id="wait", task=sensor, _ti_context_from_server=from_server)
    context: Any = {"ti": ti, "task": sensor, "dag_run": run}
    sensor.render_template_fields(context, jinja_env=dag.get_template_env())
    with pytest.raises(WaitFailedError) as failed:
        sensor.resume_execution("execute_complete", {"event": payload}, context)
    assert str(failed.value) == f"bad_configuration: {payload['message']}"


def test_a_worker_resuming_with_a_success_still_raises_a_template_that_does_not_render() -> None:
    """Only the trigger's error stands in for a rendering error: anything else surfaces as before."""
    from airflow.sdk.api.datamodels._generated import DagRun, TIRunContext
    from airflow.sdk.execution_time.task_runner import RuntimeTaskInstance
    from airflow.sdk.serde import serialize
    from jinja2 import UndefinedError

    with DAG(dag_id="sft_conf_ok", schedule=None, start_date=dt.datetime(2024, 1, 1)) as dag:
        sensor = S3KeySensor(
            task_id="wait", bucket_key="{{ dag_run.conf['export'] }}", bucket_name="exports", aws_conn_id="aws",
            start_from_trigger=True, timeout=60,
        )  # fmt: skip
    success = {"status": "success", "keys": []}
    from_server = TIRunContext.model_construct(
        next_method="execute_complete", next_kwargs=serialize({"event": success})
    )
    ti = RuntimeTaskInstance.model_construct(task_id="wait", task=sensor, _ti_context_from_server=from_server)
    with pytest.raises(UndefinedError):
        sensor.render_template_fields({"ti": ti, "dag_run": DagRun.model_construct(conf={})}, dag.get_template_env())


async def test_a_wait_started_without_the_dags_data_ends_at_once_naming_the_unrendered_argument() -> None:
    """Airflow builds the workload without the DAG's data (so renders nothing) when the task is not
    in its run's DAG version: the wait used to poll for the literal template until its timeout."""
    sensor = S3KeySensor(
        task_id="wait", bucket_key="s3://bucket/{{ ds }}/data.csv", aws_conn_id="aws", start_from_trigger=True,
        timeout=3600,
    )  # fmt: skip
    trigger = S3KeyTrigger(**sensor.start_trigger_args.trigger_kwargs)  # built, never rendered
    payload = (await run_trigger(trigger, timeout=10)).payload
    assert (payload["status"], payload["error_type"]) == ("error", "bad_configuration")
    assert payload["message"].startswith("S3KeyTrigger: bucket_key still hold(s) a template that was never rendered")


async def test_the_deadline_is_the_budget_counted_from_airflows_trigger_timeout_of_the_try() -> None:
    sensor = DateTimeSensor(
        task_id="at", target_time="2099-01-01T00:00:00+00:00", timeout=2, start_from_trigger=True, deferrable=True,
        poke_interval=0.2,
    )  # fmt: skip
    trigger = DateTimeTrigger(**sensor.start_trigger_args.trigger_kwargs)
    # What the scheduler stored when it deferred the task 1 s ago: start + timeout + the grace.
    trigger.timeout_after = dt.datetime.now(dt.timezone.utc) + dt.timedelta(seconds=2 + BACKSTOP_SECONDS - 1)
    began = time.monotonic()
    event = await first_event(trigger)
    assert event.payload["status"] == "timeout"
    assert 0.5 < time.monotonic() - began < 2.0  # the 1 s left of the 2 s budget, not a fresh 2 s
    # A restarted triggerer rebuilds it from the same kwargs and the same stored timeout: same deadline.
    again = DateTimeTrigger(**sensor.start_trigger_args.trigger_kwargs)
    again.timeout_after = trigger.timeout_after
    assert (await first_event(again)).payload["status"] == "timeout"


@pytest.mark.parametrize(
    ("build", "reason"),
    [
        (lambda: DateTimeSensor(task_id="t", target_time="2030-01-01T00:00:00Z", start_from_trigger=True,
                                deferrable=False), "needs deferrable=True"),
        (lambda: HttpBatchReadySensor(task_id="t", http_conn_id="api", endpoint="x", response_check=lambda r: True,
                            start_from_trigger=True, deferrable=True), "callable checked in the worker"),
        (lambda: DateTimeSensor(task_id="t", target_time="2030-01-01T00:00:00Z", start_from_trigger=True,
                                deferrable=True, timeout=3600, execution_timeout=dt.timedelta(minutes=30)),
         "execution_timeout"),
    ],
)  # fmt: skip
def test_what_cannot_start_in_the_triggerer_is_refused_at_parse_with_the_reason(build: Any, reason: str) -> None:
    with pytest.raises(ValueError, match="start_from_trigger=True") as raised:
        build()
    assert reason in str(raised.value)


def test_an_upstream_xcom_is_refused_with_a_template_to_use_instead() -> None:
    with DAG(dag_id="sft_xcom", schedule=None, start_date=dt.datetime(2024, 1, 1)):
        from airflow.sdk import task

        @task
        def key() -> str:
            return "data.csv"

        with pytest.raises(ValueError, match="xcom_pull"):
            S3KeySensor(task_id="wait", bucket_key=key(), bucket_name="my-bucket", start_from_trigger=True, timeout=60)


def test_without_start_from_trigger_nothing_changes() -> None:
    sensor = S3KeySensor(task_id="wait", bucket_key="s3://my-bucket/k", deferrable=True)
    assert sensor.start_from_trigger is False and sensor.start_trigger_args is None
    _, kwargs = sensor.build_trigger(deadline="2030-01-01T00:00:00+00:00").serialize()
    assert "start_budget" not in kwargs  # a deferral's kwargs are as they were


def test_the_official_date_time_sensor_call_ports_unchanged() -> None:
    """``DateTimeSensor(task_id=..., target_time=..., start_from_trigger=True)``: deferrable is implied."""
    sensor = DateTimeSensor(
        task_id="at", target_time="2030-01-01", start_from_trigger=True, trigger_kwargs={"moment": "ignored"}
    )  # officially, trigger_kwargs is overwritten from target_time
    assert sensor.deferrable and sensor.start_from_trigger
    assert sensor.start_trigger_args.trigger_kwargs["target_time"] == "2030-01-01T00:00:00+00:00"


def test_a_postgres_sql_file_goes_to_the_triggerer_as_its_text(tmp_path: Any) -> None:
    from airflow_deferrable_kit.sensors.postgres import PostgresBatchMarkerSensor
    from airflow_deferrable_kit.triggers.postgres import PostgresBatchMarkerTrigger

    (tmp_path / "ready.sql").write_text("SELECT status FROM etl.batches WHERE day = '{{ ds }}'")
    with DAG(dag_id="sft_pg", schedule=None, start_date=dt.datetime(2024, 1, 1), template_searchpath=[str(tmp_path)]):
        sensor = PostgresBatchMarkerSensor(
            task_id="ready", postgres_conn_id="pg", sql="ready.sql", start_from_trigger=True, timeout=60
        )
    sensor.resolve_template_files()  # what the DAG processor does after building the DAG
    kwargs = sensor.start_trigger_args.trigger_kwargs
    assert kwargs["sql"] == "SELECT status FROM etl.batches WHERE day = '{{ ds }}'"
    trigger = started(PostgresBatchMarkerTrigger, kwargs, fields=sensor.template_fields, context={"ds": "2026-12-02"})
    assert trigger._unbuilt is None and trigger.sql == "SELECT status FROM etl.batches WHERE day = '2026-12-02'"


def test_an_http_wait_renders_its_endpoint_in_the_triggerer() -> None:
    from airflow_deferrable_kit.triggers.http import HttpBatchReadyTrigger

    sensor = HttpBatchReadySensor(
        task_id="ready", http_conn_id="api", endpoint="v1/batches/{{ ds }}/status", start_from_trigger=True, timeout=60
    )
    kwargs = sensor.start_trigger_args.trigger_kwargs
    trigger = started(HttpBatchReadyTrigger, kwargs, fields=tuple(sensor.template_fields), context={"ds": "2026-12-02"})
    assert trigger._unbuilt is None and trigger.endpoint == "v1/batches/2026-12-02/status"


def test_an_airflow_before_3_3_is_refused_at_parse(monkeypatch: pytest.MonkeyPatch) -> None:
    from airflow_deferrable_kit.sensors import base

    monkeypatch.setattr(base, "_airflow_version_text", lambda: "3.2.0")
    with pytest.raises(ValueError, match=r"needs Airflow 3\.3 or later \(this is 3\.2\.0\)"):
        DateTimeSensor(task_id="at", target_time="2030-01-01T00:00:00Z", start_from_trigger=True)


# ------------------------------------------------- waits whose moment a worker worked out at start
class _Run:
    """The run as the triggerer's template context holds it (``dag_run``), and the try (``ti``)."""

    def __init__(self, *, run_after: dt.datetime, start_date: dt.datetime, try_number: int = 1) -> None:
        self.run_after = run_after
        self.start_date = start_date
        self.try_number = try_number


def run_context(dag: DAG, *, data_interval_end: dt.datetime | None, try_number: int = 1) -> dict[str, Any]:
    run = _Run(
        run_after=dt.datetime(2026, 3, 29, 1, 0, tzinfo=dt.timezone.utc),
        start_date=dt.datetime(2026, 3, 29, 1, 5, tzinfo=dt.timezone.utc),
        try_number=try_number,
    )
    return {
        "dag": dag, "dag_run": run, "ti": run, "data_interval_end": data_interval_end, "ds": "2026-03-29",
        "params": {"minutes": 45},
    }  # fmt: skip


@pytest.mark.parametrize(
    ("make", "interval_end"),
    [
        (lambda: TimeDeltaSensor(task_id="t", delta=dt.timedelta(minutes=-90), start_from_trigger=True), True),
        (lambda: TimeDeltaSensor(task_id="t", delta="{{ params.minutes }}", params={"minutes": 45},
                                 start_from_trigger=True), False),
        (lambda: TimeSensor(task_id="t", target_time="02:30", start_from_trigger=True), True),  # skipped by DST there
        (lambda: TimeSensor(task_id="t", target_time="{{ '18:15' }}", start_from_trigger=True), False),
    ],
)  # fmt: skip
def test_a_moment_from_the_run_is_worked_out_in_the_triggerer_as_the_worker_does(make: Any, interval_end: bool) -> None:
    import pendulum

    amsterdam = pendulum.datetime(2024, 1, 1, tz="Europe/Amsterdam")
    with DAG(dag_id="sft_moments", schedule=None, start_date=amsterdam) as dag:
        sensor = make()
    end = dt.datetime(2026, 3, 29, 0, 30, tzinfo=dt.timezone.utc) if interval_end else None
    context = run_context(dag, data_interval_end=end)
    args = sensor.start_trigger_args
    assert args.trigger_cls == "airflow_deferrable_kit.triggers.temporal.RunMomentTrigger"
    trigger = started(RunMomentTrigger, args.trigger_kwargs, fields=sensor.template_fields, context=context)
    assert trigger._unbuilt is None

    sensor.render_template_fields(context)  # the worker path, from the same run
    assert trigger._target_iso == sensor.fix_target(context)


async def test_a_wait_from_its_start_counts_from_the_stored_start_across_a_restart() -> None:
    sensor = WaitSensor(task_id="t", time_to_wait=dt.timedelta(seconds=1.5), timeout=60, start_from_trigger=True)
    kwargs = sensor.start_trigger_args.trigger_kwargs
    assert kwargs["span_seconds"] == 1.5
    # The scheduler started the task 1 s ago: its stored trigger timeout is that start + budget + grace.
    timeout_after = dt.datetime.now(dt.timezone.utc) + dt.timedelta(seconds=60 + BACKSTOP_SECONDS - 1)
    moments = []
    for _ in range(2):  # the first triggerer, then the one that adopts it: the same moment
        trigger = RunMomentTrigger(**kwargs)
        trigger.timeout_after = timeout_after
        began = time.monotonic()
        event = await first_event(trigger)
        assert event.payload["status"] == "success"
        moments.append(event.payload["target_time"])
    assert moments[0] == moments[1]
    assert time.monotonic() - began < 1.0  # 0.5 s left of the 1.5 s, not a fresh 1.5 s


async def test_a_moment_from_the_run_without_the_runs_context_is_one_clear_error() -> None:
    trigger = RunMomentTrigger(rule="delta_after_run", span_seconds=60.0, start_budget=60.0)
    event = await first_event(trigger)
    assert event.payload["status"] == "error" and event.payload["error_type"] == "bad_configuration"
    assert "TimeDeltaSensor" in event.payload["message"] and "run's dates" in event.payload["message"]


def test_a_rendered_span_that_is_not_valid_ends_the_wait_with_one_clear_error() -> None:
    sensor = WaitSensor(task_id="t", time_to_wait="{{ params.wait }}", params={"wait": "soon"}, start_from_trigger=True)
    with DAG(dag_id="sft_bad_span", schedule=None, start_date=dt.datetime(2024, 1, 1)) as dag:
        pass
    context = {**run_context(dag, data_interval_end=None), "params": {"wait": "soon"}}
    trigger = started(RunMomentTrigger, sensor.start_trigger_args.trigger_kwargs, fields=sensor.template_fields,
                      context=context)  # fmt: skip
    assert trigger._unbuilt is not None and "time_to_wait" in trigger._unbuilt.message


def test_the_official_time_sensor_call_ports_unchanged() -> None:
    """The official ``TimeSensor(..., start_from_trigger=True, trigger_kwargs=...)``: accepted, and the
    ``trigger_kwargs`` dropped, as the official sensor builds its trigger from ``target_time`` alone."""
    with DAG(dag_id="sft_official_time", schedule=None, start_date=dt.datetime(2024, 1, 1)):
        sensor = TimeSensor(
            task_id="t", target_time=dt.time(18, 30), start_from_trigger=True,
            trigger_kwargs={"moment": "", "end_from_trigger": False},
        )  # fmt: skip
    assert sensor.deferrable and sensor.start_from_trigger
    assert sensor.start_trigger_args.trigger_kwargs["target_time"] == "18:30:00"


@pytest.mark.parametrize(("try_number", "expected_from"), [(1, "its start"), (2, "the run's start")])
def test_kafka_started_in_the_triggerer_reads_from_the_first_trys_start(try_number: int, expected_from: str) -> None:
    sensor = KafkaMessageSensor(task_id="t", topics="orders", kafka_conn_id="k", start_from_trigger=True, timeout=600)
    kwargs = sensor.start_trigger_args.trigger_kwargs
    assert kwargs["start_after_ms"] is None and kwargs.get("start_offsets") is None
    started_at = dt.datetime(2026, 12, 2, 12, 0, tzinfo=dt.timezone.utc)
    with DAG(dag_id="sft_kafka", schedule=None, start_date=dt.datetime(2024, 1, 1)) as dag:
        pass
    trigger = KafkaMessageTrigger(**kwargs)
    trigger.timeout_after = started_at + dt.timedelta(seconds=600 + BACKSTOP_SECONDS)
    trigger.template_fields = ()
    trigger.render_template_fields(run_context(dag, data_interval_end=None, try_number=try_number))
    assert trigger._unbuilt is None
    expected = started_at if expected_from == "its start" else dt.datetime(2026, 3, 29, 1, 5, tzinfo=dt.timezone.utc)
    assert trigger.start_after_ms == int(expected.timestamp() * 1000)


def test_kafka_renders_a_templated_start_in_the_triggerer() -> None:
    sensor = KafkaMessageSensor(
        task_id="t", topics="orders", kafka_conn_id="k", start_after="{{ ds }}T00:00:00+00:00",
        start_from_trigger=True, timeout=600,
    )  # fmt: skip
    with DAG(dag_id="sft_kafka_t", schedule=None, start_date=dt.datetime(2024, 1, 1)) as dag:
        pass
    trigger = started(KafkaMessageTrigger, sensor.start_trigger_args.trigger_kwargs, fields=sensor.template_fields,
                      context=run_context(dag, data_interval_end=None))  # fmt: skip
    assert trigger._unbuilt is None
    assert trigger.start_after_ms == int(dt.datetime(2026, 3, 29, tzinfo=dt.timezone.utc).timestamp() * 1000)


START_AND_END_DAG = """
import datetime as dt
from airflow.sdk import DAG
from airflow_deferrable_kit.sensors.temporal import TimeDeltaSensor

with DAG(dag_id="adk_start_listeners", schedule=None, start_date=dt.datetime(2024, 1, 1)):
    TimeDeltaSensor(task_id="wait", delta=dt.timedelta(minutes=5), start_from_trigger=True, end_from_trigger=True)
"""


def test_with_a_listener_loaded_the_wait_still_starts_in_the_triggerer_and_resumes_on_a_worker(
    tmp_path: Any,
) -> None:
    """Airflow refuses end_from_trigger with listeners (OpenLineage here): the DAG still parses, the
    task still starts with no worker, and only its end goes to a worker."""
    from tests.unit.sensors.test_listeners import parse

    dags = tmp_path / "dags"
    dags.mkdir()
    (dags / "start_listeners.py").write_text(START_AND_END_DAG)
    result = parse(
        dags,
        tmp_path,
        AIRFLOW__CORE__LOAD_EXAMPLES="False",
        AIRFLOW__OPENLINEAGE__TRANSPORT='{"type": "console"}',
        AIRFLOW__OPENLINEAGE__NAMESPACE="adk-test",
    )
    assert result["listeners"] is True and result["errors"] == {}
    assert result["end_from_trigger"]["adk_start_listeners.wait"] is False
    assert result["start_from_trigger"]["adk_start_listeners.wait"] == [True, False]
