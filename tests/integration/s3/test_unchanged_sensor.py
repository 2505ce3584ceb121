"""S3KeysUnchangedSensor against a real S3 API server (moto): poked, deferred, and the ported example.

The inactivity clock runs on a fake clock (the trigger class's ``clock``), so hours of waiting
take no time and no assert depends on timing.
"""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from typing import Any

import pytest
from airflow.sdk import PokeReturnValue
from airflow.sdk.exceptions import TaskDeferred

from airflow_deferrable_kit.sensors.base import WaitFailedError
from airflow_deferrable_kit.sensors.s3 import S3KeysUnchangedSensor
from airflow_deferrable_kit.testing import FakeClock, make_context, run_trigger
from airflow_deferrable_kit.triggers.s3_unchanged import S3KeysUnchangedTrigger, keys_fingerprint
from scripts import services
from tests.fixtures.official_examples import amazon_s3
from tests.integration.s3.conftest import SECRET
from tests.integration.s3.test_sensor import s3_admin
from tests.integration.s3.test_unchanged import iso


@pytest.fixture
def sync_bucket(s3_server: services.S3Server) -> str:
    name = f"adk-{uuid.uuid4().hex[:12]}"
    s3_admin(s3_server.endpoint_url, ("create_bucket", {"Bucket": name}))
    return name


@pytest.fixture
def clock(monkeypatch: pytest.MonkeyPatch) -> FakeClock:
    # The sensor's deadline comes from the wall clock: start there (whole seconds, for exact times).
    fake = FakeClock(start=float(int(time.time())))
    monkeypatch.setattr(S3KeysUnchangedTrigger, "clock", fake)
    return fake


def put(s3_server: services.S3Server, bucket: str, *keys: str) -> None:
    s3_admin(s3_server.endpoint_url, *(("put_object", {"Bucket": bucket, "Key": key, "Body": b"abc"}) for key in keys))


def sensor(**kwargs: Any) -> S3KeysUnchangedSensor:
    kwargs.setdefault("task_id", "wait_unchanged")
    kwargs.setdefault("prefix", "out/")
    kwargs.setdefault("poke_interval", 60)
    kwargs.setdefault("inactivity_period", 300)
    return S3KeysUnchangedSensor(**kwargs)


def test_poked_the_clock_restarts_on_new_keys_and_it_succeeds_after_the_period(
    clock: FakeClock, sync_bucket: str, moto_conn: str, s3_server: services.S3Server
) -> None:
    start = clock.now
    put(s3_server, sync_bucket, "out/a", "out/b")
    task = sensor(bucket_name=sync_bucket, aws_conn_id=moto_conn, deferrable=False)
    context = make_context(task)
    assert task.poke(context) is False  # new keys: the clock starts
    clock.advance(240)
    assert task.poke(context) is False  # unchanged for 240 s < 300 s
    put(s3_server, sync_bucket, "out/c")
    clock.advance(60)
    assert task.poke(context) is False  # a new key: the clock restarts
    clock.advance(299)
    assert task.poke(context) is False
    clock.advance(1)
    result = task.poke(context)
    assert isinstance(result, PokeReturnValue) and result.is_done
    assert result.xcom_value["object_count"] == 3
    assert result.xcom_value["total_size"] == 9
    assert result.xcom_value["last_changed"] == iso(start + 300)


def test_poked_a_deletion_fails_the_task_without_allow_delete_even_with_soft_fail(
    clock: FakeClock, sync_bucket: str, moto_conn: str, s3_server: services.S3Server
) -> None:
    put(s3_server, sync_bucket, "out/a", "out/b")
    task = sensor(bucket_name=sync_bucket, aws_conn_id=moto_conn, deferrable=False, allow_delete=False, soft_fail=True)
    context = make_context(task)
    assert task.poke(context) is False
    s3_admin(s3_server.endpoint_url, ("delete_object", {"Bucket": sync_bucket, "Key": "out/a"}))
    clock.advance(60)
    with pytest.raises(WaitFailedError, match=r"condition_failed: .*1 key\(s\) were deleted.*out/a"):
        task.poke(context)


def test_deferred_the_worker_look_is_handed_over_small_and_the_trigger_keeps_its_clock(
    clock: FakeClock, sync_bucket: str, moto_conn: str, s3_server: services.S3Server
) -> None:
    start = clock.now
    keys = [f"out/part-{i:03d}" for i in range(50)]
    put(s3_server, sync_bucket, *keys)
    task = sensor(bucket_name=sync_bucket, aws_conn_id=moto_conn, deferrable=True, previous_objects={"out/part-000"})
    context = make_context(task)
    with pytest.raises(TaskDeferred) as deferred:
        task.execute(context)  # the worker's look: 49 new keys, the clock starts
    trigger = deferred.value.trigger
    assert isinstance(trigger, S3KeysUnchangedTrigger)
    kwargs = trigger.serialize()[1]
    assert kwargs["previous_objects"] is None  # the keys stay out of the trigger table ...
    assert kwargs["last_look"] == {  # ... their fingerprint and count go in
        "observed_at": iso(start),
        "changed_at": iso(start),
        "fingerprint": keys_fingerprint(keys),
        "count": 50,
    }
    assert SECRET not in json.dumps(kwargs)

    clock.advance(30)  # the triggerer picks it up
    rebuilt = S3KeysUnchangedTrigger(**json.loads(json.dumps(kwargs)))
    rebuilt.spread_polls = False  # type: ignore[misc]
    payload = asyncio.run(run_trigger(rebuilt)).payload
    assert (payload["status"], payload["last_changed"], payload["object_count"]) == ("success", iso(start), 50)
    assert clock.now == start + 300  # the clock started at the worker's look, not at the trigger's
    assert task.execute_complete(context, payload, **deferred.value.kwargs) == payload


@pytest.mark.parametrize("picked_up_after", [30, 3600], ids=["picked-up-at-once", "after-a-triggerer-restart"])
def test_deferred_a_key_replaced_after_the_workers_look_fails_the_task_without_allow_delete(
    clock: FakeClock, sync_bucket: str, moto_conn: str, s3_server: services.S3Server, picked_up_after: int
) -> None:
    """The official ``is_keys_unchanged`` fails the task when a key of the last look is gone, whatever
    was added beside it. One key deleted and another added between the worker's look and the
    trigger's first listing (or the rebuild from the same kwargs after a triggerer restart) used to
    restart the inactivity clock instead."""
    put(s3_server, sync_bucket, "out/a", "out/b")
    task = sensor(bucket_name=sync_bucket, aws_conn_id=moto_conn, deferrable=True, allow_delete=False)
    context = make_context(task)
    with pytest.raises(TaskDeferred) as deferred:
        task.execute(context)  # the worker's look: {out/a, out/b}
    kwargs = deferred.value.trigger.serialize()[1]
    assert "out/a" not in json.dumps(kwargs)  # still no key in the trigger table

    s3_admin(s3_server.endpoint_url, ("delete_object", {"Bucket": sync_bucket, "Key": "out/b"}))
    put(s3_server, sync_bucket, "out/c")  # as many keys as the worker saw, one of them another
    clock.advance(picked_up_after)
    rebuilt = S3KeysUnchangedTrigger(**json.loads(json.dumps(kwargs)))
    payload = asyncio.run(run_trigger(rebuilt)).payload
    assert (payload["status"], payload["error_type"]) == ("error", "condition_failed")
    with pytest.raises(WaitFailedError, match=r"^condition_failed: .*1 key\(s\) were deleted.*allow_delete=False"):
        task.execute_complete(context, payload, **deferred.value.kwargs)


@pytest.mark.parametrize(
    ("kwargs", "error", "match"),
    [
        ({"verify": False}, TypeError, r"verify= of the official S3KeysUnchangedSensor .*extras of the aws connection"),
        ({"region_name": "eu-west-1"}, TypeError, r"region_name="),
        ({"botocore_config": {"retries": {}}}, TypeError, r"botocore_config=.*config_kwargs"),
        ({"deferrable": False, "mode": "reschedule"}, ValueError, r"mode='reschedule' cannot work"),
        ({"previous_objects": "out/a"}, ValueError, r"previous_objects must be a set or list"),
        ({"inactivity_period": -5}, ValueError, r"inactivity_period"),
        ({"min_objects": 1.5}, ValueError, r"min_objects"),
    ],
)
def test_bad_arguments_fail_at_parse(kwargs: dict[str, Any], error: type[Exception], match: str) -> None:
    with pytest.raises(error, match=match):
        sensor(bucket_name="bucket-a", **kwargs)


def test_official_defaults_are_accepted_and_the_sensor_is_templated() -> None:
    task = sensor(bucket_name="{{ params.bucket }}", prefix="out/{{ ds }}/", verify=True, region_name=None)
    assert task.template_fields == ("bucket_name", "prefix", "aws_conn_id")
    context = make_context(task, params={"bucket": "bucket-a"})
    task.render_template_fields(context)
    trigger = task.build_trigger(deadline=None)
    assert (trigger.bucket_name, trigger.prefix) == ("bucket-a", f"out/{context['ds']}/")
    assert "last_look" not in S3KeysUnchangedSensor.wait_parameter_names()


def test_the_ported_example_call_waits_for_the_bucket_to_settle_as_officially(
    clock: FakeClock, make_conn: Any, s3_server: services.S3Server, sync_bucket: str
) -> None:
    """amazon ``example_s3.py``'s ``sensor_keys_unchanged``: the whole bucket (prefix ""), 10 s of
    inactivity, poked; officially ``poke`` is false until one poke finds the keys unchanged 10 s on."""
    make_conn(s3_server.endpoint_url, conn_id="aws_default")
    (call,) = [c for c in amazon_s3.CALLS if c.task_id == "sensor_keys_unchanged"]
    task = call.kit_class()(**call.filled({"bucket_2": sync_bucket}))
    put(s3_server, sync_bucket, "created-by-the-example")
    context = make_context(task)
    assert task.poke(context) is False  # new keys
    clock.advance(9)
    assert task.poke(context) is False
    clock.advance(1)
    result = task.poke(context)
    assert isinstance(result, PokeReturnValue) and result.is_done
    assert (result.xcom_value["prefix"], result.xcom_value["object_count"]) == ("", 1)
