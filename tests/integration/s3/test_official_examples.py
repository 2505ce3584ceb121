"""The amazon provider's S3KeySensor example calls, import changed, against a real S3 API (moto).

For each call, the situation the example sets up (its objects there: met) and one where the
condition does not hold (a key missing, or a file the example's ``check_fn`` refuses) are run
through the kit's sensor on the path the call chooses: poked when it does not say
``deferrable=True``, deferred (and the trigger run) when it does. The official outcome, from its
source (tests/fixtures/official/amazon/s3.py): ``poke`` is true once every key exists and
``check_fn`` (if any) accepts their metadata; otherwise it keeps waiting, and its deferred path
waits on the same way.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Callable, Mapping
from typing import Any

import pytest
from airflow.sdk import PokeReturnValue
from airflow.sdk.exceptions import AirflowSensorTimeout, TaskDeferred

from airflow_deferrable_kit.testing import make_context, run_trigger
from airflow_deferrable_kit.triggers.base import deadline_after
from airflow_deferrable_kit.triggers.s3 import S3KeyTrigger
from scripts import services
from tests.fixtures.official_examples import amazon_s3
from tests.fixtures.official_examples.calls import ExampleCall
from tests.integration.s3.test_sensor import s3_admin

SMALL = b"0.5,milk"  # 8 bytes: the example's check_fn wants more than 20
#: Per call: the objects of the met situation and of one that is not met (placeholder -> body).
SITUATIONS: dict[str, tuple[Mapping[str, bytes], Mapping[str, bytes]]] = {
    "sensor_one_key": ({"key": amazon_s3.DATA.encode()}, {}),
    "sensor_two_keys": ({"key": amazon_s3.DATA.encode(), "key_2": amazon_s3.DATA.encode()}, {"key": b"x" * 30}),
    "sensor_key_with_function": ({"key": amazon_s3.DATA.encode()}, {"key": SMALL}),
}
BUILT = [call for call in amazon_s3.CALLS if call.kit == amazon_s3.KIT and not call.refused]


def situation(call: ExampleCall) -> tuple[Mapping[str, bytes], Mapping[str, bytes]]:
    return SITUATIONS[call.task_id.removesuffix("_deferrable")]


@pytest.fixture
def example_names(s3_server: services.S3Server, make_conn: Callable[..., str]) -> dict[str, str]:
    """The example's names, on a bucket of its own; its default ``aws_default`` connection is moto."""
    make_conn(s3_server.endpoint_url, conn_id="aws_default")
    env_id = f"adk-{uuid.uuid4().hex[:10]}"
    names = {"bucket": f"{env_id}-s3-bucket", "bucket_2": f"{env_id}-s3-bucket-2"}
    names |= {"key": f"{env_id}-key", "key_2": f"{env_id}-key2"}
    s3_admin(s3_server.endpoint_url, ("create_bucket", {"Bucket": names["bucket"]}))
    return names


def put(s3_server: services.S3Server, names: Mapping[str, str], objects: Mapping[str, bytes]) -> None:
    calls = [("put_object", {"Bucket": names["bucket"], "Key": names[k], "Body": body}) for k, body in objects.items()]
    if calls:
        s3_admin(s3_server.endpoint_url, *calls)


def with_deadline(trigger: S3KeyTrigger, seconds: float) -> S3KeyTrigger:
    return S3KeyTrigger(**{**trigger.serialize()[1], "deadline": deadline_after(seconds), "poll_interval": 0.5})


def kept_keys(payload: dict[str, Any]) -> set[str]:
    return {found["key"] for found in payload["keys"]}


@pytest.mark.parametrize("call", [c for c in BUILT if not c.arguments.get("deferrable")], ids=lambda c: c.task_id)
def test_poked_as_ported_it_waits_then_succeeds_as_officially(
    call: ExampleCall, example_names: dict[str, str], s3_server: services.S3Server
) -> None:
    met, not_met = situation(call)
    task = call.kit_class()(**call.filled(example_names))
    assert task.deferrable is False
    put(s3_server, example_names, not_met)
    assert task.poke(make_context(task)) is False  # official: poke() is false, it keeps waiting
    put(s3_server, example_names, met)
    result = task.poke(make_context(task))
    assert isinstance(result, PokeReturnValue) and result.is_done  # official: poke() is true
    wanted = {example_names[k] for k in met}
    assert kept_keys(result.xcom_value) == wanted


@pytest.mark.parametrize("call", [c for c in BUILT if c.arguments.get("deferrable")], ids=lambda c: c.task_id)
def test_deferred_it_waits_then_succeeds_as_officially(
    call: ExampleCall, example_names: dict[str, str], s3_server: services.S3Server
) -> None:
    met, not_met = situation(call)
    task = call.kit_class()(**call.filled(example_names))
    put(s3_server, example_names, not_met)
    context = make_context(task)
    with pytest.raises(TaskDeferred) as first:
        task.execute(context)  # the first look in the worker finds it not met
    if "check_fn" in call.arguments and not_met:
        # The key exists but the worker's check_fn refuses the small file: the task waits on (a
        # pause, then the S3 wait again), as the official execute_complete defers again.
        assert first.value.method_name == "resume_after_pause"
        put(s3_server, example_names, met)
        # After the pause the worker looks once itself and finds the condition met.
        payload = task.resume_after_pause(context, {"status": "success"}, **first.value.kwargs)
        assert payload["status"] == "success"
        assert kept_keys(payload) == {example_names[k] for k in met}
        return
    else:
        trigger = first.value.trigger
        assert isinstance(trigger, S3KeyTrigger)
        payload = asyncio.run(run_trigger(with_deadline(trigger, 1.5), timeout=30)).payload
        assert payload["status"] == "timeout"  # official: never fires; its deferral times out
        with pytest.raises(AirflowSensorTimeout):
            task.execute_complete(context, payload)
        put(s3_server, example_names, met)
    payload = asyncio.run(run_trigger(S3KeyTrigger(**trigger.serialize()[1]), timeout=30)).payload
    assert payload["status"] == "success"
    assert kept_keys(payload) == {example_names[k] for k in met}
    assert task.execute_complete(context, payload, deadline=trigger.deadline) == payload
