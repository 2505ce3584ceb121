"""An unknown conn_id ends the wait as Airflow's own sensors end it: with the connection error.

Airflow's sensors fail at the first poke on a mistyped ``conn_id``. In the triggerer a miss is
retried for a grace window (there "not found" can mean "could not ask"), but the window never
turns a typo into a timeout, nor a skip with ``soft_fail``.
"""

from __future__ import annotations

import datetime as dt
import uuid
from typing import Any

import pytest
from airflow.sdk.exceptions import TaskDeferred

from airflow_deferrable_kit import connections
from airflow_deferrable_kit.sensors.base import WaitFailedError
from airflow_deferrable_kit.sensors.s3 import S3KeySensor
from airflow_deferrable_kit.testing import make_context, run_trigger_payload
from airflow_deferrable_kit.triggers.base import deadline_after
from airflow_deferrable_kit.triggers.s3 import S3KeyTrigger
from tests.integration.s3.test_sensor import s3_admin
from tests.support.supervisor import install_supervisor


@pytest.fixture(autouse=True)
def _grace_as_in_production(monkeypatch: pytest.MonkeyPatch) -> None:
    """The suite believes misses at once; these tests need the triggerer's real window, which opens
    when a secrets backend cannot be asked (here: the supervisor cannot reach the API server)."""
    monkeypatch.setattr(connections, "NOT_FOUND_GRACE", 30.0)
    monkeypatch.setattr(connections, "_first_miss", {})
    install_supervisor(monkeypatch, "unreachable")


def typo_sensor(**kwargs: Any) -> S3KeySensor:
    return S3KeySensor(
        task_id="wait_typo", bucket_key="s3://some-bucket/k.csv", aws_conn_id="aws_no_such_conn", **kwargs
    )


@pytest.mark.parametrize(
    "kwargs",
    [
        {"deferrable": False, "mode": "reschedule", "soft_fail": True},
        {"deferrable": False, "mode": "poke", "soft_fail": True},
        {"deferrable": True, "soft_fail": True},
    ],
    ids=["reschedule", "poke", "deferrable-first-look"],
)
def test_an_unknown_conn_id_fails_at_the_first_poke(kwargs: dict[str, Any]) -> None:
    task = typo_sensor(poke_interval=30, timeout=7 * 24 * 3600, **kwargs)
    with pytest.raises(WaitFailedError, match=r"connection_not_found: aws_conn_id='aws_no_such_conn': no Airflow"):
        task.execute(make_context(task))  # not a reschedule, not a deferral, not a skip
    assert connections._first_miss == {}  # the worker never opened a grace window


def test_a_connection_defined_later_is_found_by_the_next_poke(monkeypatch: pytest.MonkeyPatch, s3_server: Any) -> None:
    """The lookup is not cached as missing: believing a miss at once costs a fixed typo one retry."""
    bucket = f"adk-{uuid.uuid4().hex[:12]}"
    s3_admin(s3_server.endpoint_url, ("create_bucket", {"Bucket": bucket}))
    task = S3KeySensor(
        task_id="wait_typo", bucket_key=f"s3://{bucket}/k.csv", aws_conn_id="aws_no_such_conn", deferrable=True
    )
    with pytest.raises(WaitFailedError):
        task.execute(make_context(task))
    monkeypatch.setenv(
        "AIRFLOW_CONN_AWS_NO_SUCH_CONN",
        '{"conn_type": "aws", "login": "k", "password": "s", '
        f'"extra": {{"endpoint_url": "{s3_server.endpoint_url}", "region_name": "us-east-1"}}}}',
    )
    with pytest.raises(TaskDeferred):  # found now: the bucket's key is missing, so it defers
        task.execute(make_context(task))


@pytest.mark.parametrize("soft_fail", [False, True])
async def test_a_deadline_inside_the_grace_ends_with_the_connection_error_not_a_timeout(soft_fail: bool) -> None:
    trigger = S3KeyTrigger(
        bucket_key="s3://some-bucket/k.csv",
        aws_conn_id="aws_no_such_conn",
        poll_interval=0.05,
        max_backoff=0.2,
        soft_fail=soft_fail,
        deadline=deadline_after(5),
    )
    payload = await run_trigger_payload(trigger)
    assert payload["status"] == "error"
    assert payload["error_type"] == "connection_not_found"
    assert "aws_conn_id='aws_no_such_conn'" in payload["message"]


async def test_a_long_wait_keeps_the_grace_for_a_blip() -> None:
    """With the deadline far away the first miss is retried: it may be a triggerer restart."""
    trigger = S3KeyTrigger(
        bucket_key="s3://some-bucket/k.csv",
        aws_conn_id="aws_no_such_conn",
        poll_interval=0.05,
        max_backoff=0.2,
        deadline=(dt.datetime.now(dt.timezone.utc) + dt.timedelta(hours=1)).isoformat(),
    )
    with pytest.raises(connections.ConnectionMissing) as first:
        await trigger.check()
    error = trigger.classify_error(first.value)
    assert isinstance(error, connections.TransientError) and error.error_type == "unavailable"
    await trigger.cleanup()
