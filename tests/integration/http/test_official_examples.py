"""The http provider's HttpSensor example calls, import changed, against a real aiohttp server.

The official outcome, from its source (tests/fixtures/official/http/http.py) with no
``response_check``: any 2xx answer ends the wait; a 404 (``response_error_codes_allowlist``'s
default) means not yet, until the timeout. Another error differs, as documented: its deferrable
``execute`` pokes once in the worker first, and there a 503 raises and fails the task (a later
one, in its trigger, is retried at once, without a pause, until the timeout); here a 503 is
transient wherever it comes, retried with backoff until the timeout.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

import pytest
from airflow.sdk.exceptions import AirflowSensorTimeout

from airflow_deferrable_kit.testing import assert_defers, make_context, run_trigger
from airflow_deferrable_kit.triggers.base import deadline_after
from airflow_deferrable_kit.triggers.http import HttpBatchReadyTrigger
from tests.fixtures.official_examples import http
from tests.fixtures.official_examples.calls import ExampleCall
from tests.integration.http.conftest import Server, reply, script

CHECK_ASYNC: ExampleCall = next(c for c in http.CALLS if c.task_id == "http_sensor_check_async")
CHECK: ExampleCall = next(c for c in http.CALLS if c.task_id == "http_sensor_check")


def deferred_trigger(server: Server, connection: Callable[..., str]) -> tuple[Any, HttpBatchReadyTrigger]:
    """The example's task on its ``http_default`` connection, pointed at ``server``, deferred."""
    connection("http_default", host="127.0.0.1", port=server.port)
    task = CHECK_ASYNC.kit_class()(**CHECK_ASYNC.filled({}))
    return task, assert_defers(task, HttpBatchReadyTrigger, context=make_context(task))


def test_a_2xx_answer_ends_the_wait(serve: Callable[..., Server], connection: Callable[..., str]) -> None:
    server = serve(script(lambda: reply(404), lambda: reply(200, {"status": "up"})))
    task, trigger = deferred_trigger(server, connection)  # the first look (a 404) is not yet
    assert trigger.poll_interval == 5  # the example's poke_interval
    payload = asyncio.run(run_trigger(HttpBatchReadyTrigger(**trigger.serialize()[1]), timeout=30)).payload
    assert payload["status"] == "success" and payload["status_code"] == 200
    assert task.execute_complete(make_context(task), payload) == payload
    assert [(seen.method, seen.path, seen.query) for seen in server.requests] == [("GET", "/", {})] * 2


@pytest.mark.parametrize("status", [404, 503], ids=["not_yet_404_as_officially", "lasting_503_retried"])
def test_no_2xx_before_the_timeout_fails_the_task(
    status: int, serve: Callable[..., Server], connection: Callable[..., str]
) -> None:
    server = serve(script(lambda: reply(status)))
    task, trigger = deferred_trigger(server, connection)
    short = HttpBatchReadyTrigger(**{**trigger.serialize()[1], "deadline": deadline_after(1.5), "poll_interval": 0.2})
    payload = asyncio.run(run_trigger(short, timeout=30)).payload
    assert payload["status"] == "timeout"
    with pytest.raises(AirflowSensorTimeout):
        task.execute_complete(make_context(task), payload)
    assert len(server.requests) >= 2  # it kept asking


# ------------------------------------------------------------- http_sensor_check (response_check)
HTTPBIN_PAGE = "<html><title>httpbin.org</title></html>"


@pytest.mark.parametrize("met", [True, False], ids=["body_names_httpbin", "body_does_not"])
def test_the_response_check_example_pokes_as_officially(
    met: bool, serve: Callable[..., Server], connection: Callable[..., str]
) -> None:
    """As the example runs it (no ``deferrable``: Airflow's default, poking): the lambda decides."""
    server = serve(script(lambda: reply(200, HTTPBIN_PAGE if met else "<html>other</html>")))
    connection("http_default", host="127.0.0.1", port=server.port)
    task = CHECK.kit_class()(**CHECK.filled({}))
    assert task.deferrable is False and task.poke_interval == 5
    result = task.poke(make_context(task))
    assert bool(getattr(result, "is_done", result)) is met  # officially: poke() is response_check's answer


def test_the_response_check_example_deferred_ends_on_a_body_naming_httpbin(
    serve: Callable[..., Server], connection: Callable[..., str]
) -> None:
    """With ``deferrable=True`` the lambda still decides, in the worker: a refused body waits on
    (a pause, then a look from the worker), and the body that names httpbin ends the wait."""
    from airflow.sdk.exceptions import TaskDeferred

    bodies = iter(["<html>other</html>", HTTPBIN_PAGE])
    server = serve(script(lambda: reply(200, next(bodies, HTTPBIN_PAGE))))
    connection("http_default", host="127.0.0.1", port=server.port)
    task = CHECK.kit_class()(**CHECK.filled({}), deferrable=True)
    context = make_context(task)
    with pytest.raises(TaskDeferred) as paused:
        task.execute(context)  # the first look in the worker: a 200 the lambda refuses
    assert paused.value.method_name == "resume_after_pause"
    payload = task.resume_after_pause(context, {"status": "success"}, **paused.value.kwargs)
    assert payload["status"] == "success" and payload["status_code"] == 200
    assert len(server.requests) == 2
