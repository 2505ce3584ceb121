"""S3KeySensor's official ``check_fn``: the trigger finds candidates, the worker has the last word.

A falsy answer waits on within the same deadline: first a pause of one ``poke_interval`` in the
triggerer (the refused objects are likely still there), then a look from the worker, then the
S3 wait again.
"""

from __future__ import annotations

import uuid
from typing import Any

import pytest
from airflow.sdk import PokeReturnValue
from airflow.sdk.exceptions import AirflowSensorTimeout, TaskDeferred

from airflow_deferrable_kit.sensors.s3 import S3KeySensor
from airflow_deferrable_kit.testing import make_context
from airflow_deferrable_kit.triggers.base import parse_deadline
from airflow_deferrable_kit.triggers.s3 import S3KeyTrigger
from airflow_deferrable_kit.triggers.temporal import DateTimeTrigger
from scripts import services
from tests.integration.s3.test_sensor import s3_admin


@pytest.fixture
def bucket_with_small_file(s3_server: services.S3Server) -> str:
    name = f"adk-{uuid.uuid4().hex[:12]}"
    s3_admin(
        s3_server.endpoint_url,
        ("create_bucket", {"Bucket": name}),
        ("put_object", {"Bucket": name, "Key": "in/a.csv", "Body": b"12345"}),
    )
    return name


def big_enough(files: list[dict[str, Any]]) -> bool:
    return all(f["Size"] >= 100 for f in files)


def test_a_refusing_check_pauses_then_waits_again_within_the_same_deadline(
    bucket_with_small_file: str, moto_conn: str, s3_server: services.S3Server
) -> None:
    task = S3KeySensor(
        task_id="wait",
        bucket_key=f"s3://{bucket_with_small_file}/in/*.csv",
        wildcard_match=True,
        aws_conn_id=moto_conn,
        check_fn=big_enough,
        deferrable=True,
        poke_interval=5,
        timeout=600,
    )
    context = make_context(task)
    with pytest.raises(TaskDeferred) as paused:
        task.execute(context)
    assert isinstance(paused.value.trigger, DateTimeTrigger)
    assert paused.value.method_name == "resume_after_pause"
    deadline = paused.value.kwargs["deadline"]
    assert parse_deadline(paused.value.trigger.target_time) <= parse_deadline(deadline)

    # After the pause the worker looks once itself: the small file is still there and still
    # refused, so it pauses again (a trigger deferred now would fire at its first poll).
    with pytest.raises(TaskDeferred) as paused_again:
        task.resume_after_pause(context, {"status": "success"}, deadline=deadline)
    assert isinstance(paused_again.value.trigger, DateTimeTrigger)
    assert paused_again.value.kwargs["deadline"] == deadline
    # Gone meanwhile: nothing to judge, so the S3 wait again, within the same deadline.
    s3_admin(s3_server.endpoint_url, ("delete_object", {"Bucket": bucket_with_small_file, "Key": "in/a.csv"}))
    with pytest.raises(TaskDeferred) as waiting:
        task.resume_after_pause(context, {"status": "success"}, deadline=deadline)
    assert isinstance(waiting.value.trigger, S3KeyTrigger)
    assert waiting.value.kwargs["deadline"] == deadline
    assert waiting.value.trigger.deadline == deadline

    small = {"status": "success", "keys": [{"bucket": bucket_with_small_file, "key": "in/a.csv", "size": 5}]}
    with pytest.raises(TaskDeferred) as again:
        task.execute_complete(context, small, deadline=deadline)
    assert again.value.kwargs["deadline"] == deadline
    big = {"status": "success", "keys": [{"bucket": bucket_with_small_file, "key": "in/a.csv", "size": 500}]}
    assert task.execute_complete(context, big, deadline=deadline) == big


def test_the_deadline_passing_during_the_pause_ends_the_wait() -> None:
    task = S3KeySensor(task_id="wait", bucket_key="s3://adk-bucket/k", check_fn=big_enough, deferrable=True)
    timeout = {"status": "timeout", "message": "deadline passed"}
    with pytest.raises(AirflowSensorTimeout):
        task.resume_after_pause(make_context(task), timeout, deadline="2026-01-01T00:00:00+00:00")


def test_poke_path_runs_the_check_with_the_context(
    bucket_with_small_file: str, moto_conn: str, s3_server: services.S3Server
) -> None:
    seen: list[Any] = []

    def check(files: list[dict[str, Any]], **context: Any) -> bool:
        seen.append((files, context["task"].task_id))
        return any(f["Size"] > 10 for f in files)

    task = S3KeySensor(
        task_id="wait_poke",
        bucket_key=f"s3://{bucket_with_small_file}/in/a.csv",
        aws_conn_id=moto_conn,
        check_fn=check,
        deferrable=False,
    )
    assert task.poke(make_context(task)) is False
    assert seen[0][0][0]["Key"] == "in/a.csv" and seen[0][0][0]["Size"] == 5
    assert seen[0][1] == "wait_poke"
    s3_admin(
        s3_server.endpoint_url, ("put_object", {"Bucket": bucket_with_small_file, "Key": "in/a.csv", "Body": b"x" * 50})
    )
    result = task.poke(make_context(task))
    assert isinstance(result, PokeReturnValue) and result.is_done


def test_check_fn_with_end_from_trigger_is_refused_at_parse() -> None:
    with pytest.raises(
        ValueError, match="end_from_trigger=True cannot be combined with a callable checked in the worker"
    ):
        S3KeySensor(task_id="wait", bucket_key="s3://adk-bucket/k", check_fn=big_enough, end_from_trigger=True)


def test_check_fn_must_be_callable() -> None:
    with pytest.raises(TypeError, match="check_fn must be a callable"):
        S3KeySensor(task_id="wait", bucket_key="s3://adk-bucket/k", check_fn="pkg:fn")
