"""S3KeySensor: validation at parse, deferral, the poke path (same check), outcomes, the example DAG."""

from __future__ import annotations

import ast
import asyncio
import json
import runpy
import socket
import uuid
from typing import Any

import pytest
from airflow.sdk import PokeReturnValue
from airflow.sdk.exceptions import AirflowRescheduleException, AirflowSensorTimeout, AirflowSkipException

from airflow_deferrable_kit import extras
from airflow_deferrable_kit._s3.client import new_client
from airflow_deferrable_kit.sensors.base import WaitFailedError
from airflow_deferrable_kit.sensors.s3 import S3KeySensor
from airflow_deferrable_kit.testing import assert_defers, make_context
from airflow_deferrable_kit.triggers.s3 import S3KeyTrigger
from scripts import services
from tests import REPO
from tests.integration.s3.conftest import SECRET, admin_settings

ROOT = REPO


def s3_admin(endpoint_url: str, *calls: tuple[str, dict[str, Any]]) -> None:
    """Run admin calls (e.g. ("put_object", {...})) from synchronous tests."""

    async def run() -> None:
        client = await new_client(admin_settings(endpoint_url))
        try:
            for method, kwargs in calls:
                await getattr(client, method)(**kwargs)
        finally:
            await client.close()

    asyncio.run(run())


@pytest.fixture
def sync_bucket(s3_server: services.S3Server) -> str:
    name = f"adk-{uuid.uuid4().hex[:12]}"
    s3_admin(s3_server.endpoint_url, ("create_bucket", {"Bucket": name}))
    return name


def sensor(**kwargs: Any) -> S3KeySensor:
    kwargs.setdefault("task_id", "wait")
    kwargs.setdefault("poke_interval", 0.05)
    return S3KeySensor(**kwargs)


# --------------------------------------------------------------------------- construction
@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"bucket_key": "relative.csv"}, "bucket_name is required"),
        ({"bucket_key": "s3://bk1/k", "bucket_name": "other"}, "bucket_name"),
        ({"bucket_key": "s3://bk1/k", "min_size": -5}, "min_size"),
        ({"bucket_key": "s3://bk1/k", "wildcard_match": "yes"}, "wildcard_match"),
        ({"bucket_key": "s3://bk1/k", "poke_interval": 0}, "poke_interval"),
    ],
)
def test_bad_arguments_fail_at_parse(kwargs: dict[str, Any], match: str) -> None:
    with pytest.raises(ValueError, match=match):
        sensor(**kwargs)


def test_bucket_key_is_required() -> None:
    with pytest.raises(TypeError, match="bucket_key"):
        S3KeySensor(task_id="wait")  # type: ignore[call-arg]


def test_templated_values_are_validated_once_rendered() -> None:
    task = sensor(bucket_key="{{ params.key }}", bucket_name=None)  # unknown until run time: accepted
    assert task.template_fields == ("bucket_key", "bucket_name", "aws_conn_id")
    task.render_template_fields(make_context(task, params={"key": "relative/only.csv"}))
    assert task.bucket_key == "relative/only.csv"
    with pytest.raises(ValueError, match="bucket_name is required"):
        task.build_trigger(deadline=None)

    task = sensor(bucket_key=("s3://bk1/{{ ds }}/a.csv", "s3://bk1/{{ ds }}/b.csv"), aws_conn_id="{{ params.conn }}")
    context = make_context(task, params={"conn": "aws_reporting"})
    task.render_template_fields(context)
    trigger = task.build_trigger(deadline=None)
    assert trigger.bucket_key == [f"s3://bk1/{context['ds']}/a.csv", f"s3://bk1/{context['ds']}/b.csv"]
    assert trigger.aws_conn_id == "aws_reporting"


def test_missing_extra_fails_at_parse_with_the_pip_command(monkeypatch: pytest.MonkeyPatch) -> None:
    real = extras.importlib.util.find_spec
    monkeypatch.setattr(
        extras.importlib.util, "find_spec", lambda name, *a: None if name == "aiobotocore" else real(name, *a)
    )
    with pytest.raises(extras.MissingExtraError, match=r"airflow-deferrable-kit\[s3\]"):
        sensor(bucket_key="s3://bk1/k")


def test_modules_import_aiobotocore_only_inside_functions() -> None:
    """The sensor module must import without the extra, so the missing-extra error can be clear."""
    for relative in (
        "airflow_deferrable_kit/sensors/s3.py",
        "airflow_deferrable_kit/triggers/s3.py",
        "airflow_deferrable_kit/_s3/client.py",
        "airflow_deferrable_kit/_s3/poller.py",
        "airflow_deferrable_kit/_s3/signed.py",
    ):
        tree = ast.parse((ROOT / relative).read_text())
        top_level = set()
        for node in tree.body:
            if isinstance(node, ast.Import):
                top_level |= {alias.name.split(".")[0] for alias in node.names}
            elif isinstance(node, ast.ImportFrom) and node.module:
                top_level.add(node.module.split(".")[0])
        assert not top_level & {"aiobotocore", "botocore", "boto3"}, relative


def test_example_dag_parses_without_network(monkeypatch: pytest.MonkeyPatch) -> None:
    def no_network(*args: Any, **kwargs: Any) -> None:
        raise AssertionError("the example DAG made a network call while parsing")

    monkeypatch.setattr(socket.socket, "connect", no_network)
    monkeypatch.setattr(socket, "getaddrinfo", no_network)
    namespace = runpy.run_path(str(ROOT / "dags" / "example_s3.py"))
    dag = namespace["dag"]
    sensors = [t for t in dag.tasks if isinstance(t, S3KeySensor)]
    assert {t.task_id for t in sensors} == {"wait_for_orders", "wait_for_export", "wait_in_worker"}
    assert all(t.aws_conn_id == "s3_demo" for t in sensors)


# ---------------------------------------------------------------------------- deferral
def test_defers_with_the_trigger_when_the_key_is_missing(sync_bucket: str, moto_conn: str) -> None:
    task = sensor(bucket_key=f"s3://{sync_bucket}/later.csv", aws_conn_id=moto_conn, deferrable=True, timeout=600)
    trigger = assert_defers(task, S3KeyTrigger)
    _, kwargs = trigger.serialize()
    assert kwargs["bucket_key"] == f"s3://{sync_bucket}/later.csv"
    assert kwargs["aws_conn_id"] == moto_conn
    assert kwargs["poll_interval"] == 0.05
    assert kwargs["deadline"] is not None
    assert SECRET not in json.dumps(kwargs)


def test_already_present_key_finishes_in_the_worker(
    sync_bucket: str, moto_conn: str, s3_server: services.S3Server
) -> None:
    s3_admin(s3_server.endpoint_url, ("put_object", {"Bucket": sync_bucket, "Key": "now.csv", "Body": b"12345"}))
    task = sensor(bucket_key="now.csv", bucket_name=sync_bucket, aws_conn_id=moto_conn, deferrable=True)
    payload = task.execute(make_context(task))
    assert payload["status"] == "success"
    assert payload["keys"][0]["size"] == 5


def test_resume_turns_the_event_into_the_outcome() -> None:
    task = sensor(bucket_key="s3://bk1/k", soft_fail=True)
    ok = {"status": "success", "keys": [{"key": "k"}], "keys_not_listed": 0}
    assert task.execute_complete(make_context(task), ok) == ok
    with pytest.raises(AirflowSkipException):
        task.execute_complete(make_context(task), {"status": "timeout", "message": "deadline passed"})
    with pytest.raises(WaitFailedError, match="authorization"):  # soft_fail never hides an error
        task.execute_complete(make_context(task), {"status": "error", "error_type": "authorization", "message": "m"})


# ------------------------------------------------------------------- deferrable=False
def test_poke_uses_the_same_check(sync_bucket: str, moto_conn: str, s3_server: services.S3Server) -> None:
    task = sensor(bucket_key="in/*.csv", bucket_name=sync_bucket, wildcard_match=True, aws_conn_id=moto_conn)
    assert task.poke(make_context(task)) is False
    s3_admin(s3_server.endpoint_url, ("put_object", {"Bucket": sync_bucket, "Key": "in/deep/a.csv", "Body": b"a"}))
    result = task.poke(make_context(task))
    assert isinstance(result, PokeReturnValue) and result.is_done
    assert [k["key"] for k in result.xcom_value["keys"]] == ["in/deep/a.csv"]


def test_poke_mode_execute_returns_the_payload(sync_bucket: str, moto_conn: str, s3_server: services.S3Server) -> None:
    s3_admin(s3_server.endpoint_url, ("put_object", {"Bucket": sync_bucket, "Key": "x.csv", "Body": b"x"}))
    task = sensor(bucket_key=f"s3://{sync_bucket}/x.csv", aws_conn_id=moto_conn, deferrable=False, timeout=30)
    payload = task.execute(make_context(task))
    assert payload["keys"][0]["key"] == "x.csv"


def test_poke_mode_times_out_or_skips(sync_bucket: str, moto_conn: str) -> None:
    common = {"bucket_key": f"s3://{sync_bucket}/never.csv", "aws_conn_id": moto_conn, "deferrable": False}
    with pytest.raises(AirflowSensorTimeout):
        sensor(timeout=0.2, **common).execute(make_context())
    with pytest.raises(AirflowSkipException):
        sensor(timeout=0.2, soft_fail=True, **common).execute(make_context())


def test_reschedule_mode_gives_the_slot_back(sync_bucket: str, moto_conn: str) -> None:
    task = sensor(
        bucket_key=f"s3://{sync_bucket}/never.csv", aws_conn_id=moto_conn, deferrable=False, mode="reschedule"
    )
    with pytest.raises(AirflowRescheduleException):
        task.execute(make_context(task))


def test_poke_path_errors_fail_even_with_soft_fail(moto_conn: str) -> None:
    task = sensor(bucket_key="s3://adk-no-such-bucket/k", aws_conn_id=moto_conn, deferrable=False, soft_fail=True)
    with pytest.raises(WaitFailedError, match=r"not_found: .*the bucket does not exist"):
        task.execute(make_context(task))
