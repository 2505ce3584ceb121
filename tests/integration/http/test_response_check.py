"""The official ``response_check``, deferrable: the trigger finds a candidate, the worker has the last word.

Each test drives the sensor as the worker would (``execute``, ``resume_after_pause``,
``execute_complete``) and runs the trigger it defers to against a real aiohttp server whose
answer changes, so what crosses from the triggerer to the worker is the real event.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable
from typing import Any

import pytest
from airflow.sdk import PokeReturnValue
from airflow.sdk.exceptions import AirflowSensorTimeout, AirflowSkipException, TaskDeferred

from airflow_deferrable_kit.payload import MAX_PAYLOAD_BYTES, json_size
from airflow_deferrable_kit.sensors.base import WaitFailedError
from airflow_deferrable_kit.sensors.http import HttpBatchReadySensor
from airflow_deferrable_kit.testing import make_context, run_trigger_payload
from airflow_deferrable_kit.triggers.http import RESPONSE_BODY_EVENT_BYTES, HttpBatchReadyTrigger
from airflow_deferrable_kit.triggers.temporal import DateTimeTrigger
from tests.integration.http.conftest import Seen, Server, reply, script

Serve = Callable[..., Server]
Conn = Callable[..., str]


def states(*names: str) -> Any:
    return script(*[(lambda n=n: reply(200, {"state": n})) for n in names])


def is_ready(response: Any) -> bool:
    return bool(response.json()["state"] == "ready")


def sensor(conn: str, **kwargs: Any) -> HttpBatchReadySensor:
    kwargs.setdefault("task_id", "batch_ready")
    kwargs.setdefault("endpoint", "v1/batches/1/status")
    kwargs.setdefault("deferrable", True)
    kwargs.setdefault("poke_interval", 5)
    kwargs.setdefault("timeout", 600)
    return HttpBatchReadySensor(http_conn_id=conn, **kwargs)


def api(serve: Serve, connection: Conn, handler: Any, **fields: Any) -> tuple[Server, str]:
    server = serve(handler)
    return server, connection("batch_api", host="127.0.0.1", port=server.port, **fields)


def deferred_trigger(raised: pytest.ExceptionInfo[TaskDeferred]) -> HttpBatchReadyTrigger:
    trigger = raised.value.trigger
    assert isinstance(trigger, HttpBatchReadyTrigger)
    return trigger


def run(trigger: HttpBatchReadyTrigger) -> dict[str, Any]:
    """The trigger's one event, as the triggerer would fire it (through JSON, as it is stored)."""
    payload = asyncio.run(run_trigger_payload(trigger))
    return json.loads(json.dumps(payload))


# ------------------------------------------------------------------ not yet, then ready
def test_a_false_answer_re_defers_within_the_same_deadline_then_true_succeeds(serve: Serve, connection: Conn) -> None:
    pending = lambda: reply(200, {"state": "pending"})  # noqa: E731
    server, conn = api(
        serve,
        connection,
        script(pending, pending, lambda: reply(404), pending, lambda: reply(200, {"state": "ready"})),
    )
    calls: list[str] = []

    def check(response: Any) -> bool:
        calls.append(response.json()["state"])
        return is_ready(response)

    task = sensor(conn, response_check=check)
    context = make_context(task)
    with pytest.raises(TaskDeferred) as paused:  # the first look, in the worker: pending, refused
        task.execute(context)
    assert isinstance(paused.value.trigger, DateTimeTrigger)
    deadline = paused.value.kwargs["deadline"]

    with pytest.raises(TaskDeferred) as paused_again:  # after the pause the worker looks itself: refused
        task.resume_after_pause(context, {"status": "success"}, deadline=deadline)
    assert isinstance(paused_again.value.trigger, DateTimeTrigger)
    assert paused_again.value.kwargs["deadline"] == deadline  # the clock is not restarted
    assert paused_again.value.trigger.deadline == deadline

    with pytest.raises(TaskDeferred) as waiting:  # the look says not yet (404): wait in the triggerer
        task.resume_after_pause(context, {"status": "success"}, deadline=deadline)
    trigger = deferred_trigger(waiting)
    assert trigger.deadline == deadline and trigger.include_response is True

    event = run(trigger)  # the trigger's candidate: a 2xx, body still "pending"
    assert event["status"] == "success" and event["response"]["complete"] is True
    with pytest.raises(TaskDeferred) as paused_third:
        task.execute_complete(context, event, deadline=deadline)
    assert isinstance(paused_third.value.trigger, DateTimeTrigger)
    assert paused_third.value.kwargs == {"deadline": deadline, "refusals": 1}  # counted for the timeout message

    result = task.resume_after_pause(context, {"status": "success"}, deadline=deadline)
    assert result["status"] == "success" and result["status_code"] == 200
    assert "response" not in result  # the response travels for the check, never as the XCom
    assert json.loads(result["body_excerpt"]) == {"state": "ready"}
    assert calls == ["pending", "pending", "pending", "ready"]
    assert len(server.requests) == 5  # one request per look: the event carried the body


def test_the_deadline_passing_while_paused_times_the_task_out(serve: Serve, connection: Conn) -> None:
    _, conn = api(serve, connection, states("pending"))
    task = sensor(conn, response_check=is_ready, timeout=600)
    context = make_context(task)
    with pytest.raises(TaskDeferred) as paused:
        task.execute(context)
    assert paused.value.kwargs["refusals"] == 1
    with pytest.raises(AirflowSensorTimeout) as timed_out:
        task.resume_after_pause(context, {"status": "timeout", "message": "deadline passed"}, **paused.value.kwargs)
    # The message names the HTTP wait and the refusals, not the pause that happened to end it.
    message = str(timed_out.value)
    assert "v1/batches/1/status" in message, message
    assert "response_check said not yet to what the trigger found 1 time(s)" in message, message


def test_the_callable_gets_a_requests_response(serve: Serve, connection: Conn) -> None:
    def handler(seen: Seen) -> Any:
        return reply(200, "état: prêt".encode("latin-1"), headers={"Content-Type": "text/plain; charset=latin-1"})

    _, conn = api(serve, connection, handler)
    seen: dict[str, Any] = {}

    def check(response: Any) -> bool:
        import requests

        seen.update(
            kind=isinstance(response, requests.Response),
            status=response.status_code,
            ok=response.ok,
            reason=response.reason,
            text=response.text,
            type=response.headers["content-type"],  # case-insensitive, as requests' headers are
            url=response.url,
        )
        response.raise_for_status()
        return True

    task = sensor(conn, response_check=check, check_before_defer=False, query={"day": "2026-01-31"})
    with pytest.raises(TaskDeferred) as waiting:
        task.execute(make_context(task))
    result = task.execute_complete(make_context(task), run(deferred_trigger(waiting)), **waiting.value.kwargs)
    assert result["status"] == "success"
    assert seen == {
        "kind": True,
        "status": 200,
        "ok": True,
        "reason": "OK",
        "text": "état: prêt",
        "type": "text/plain; charset=latin-1",
        "url": result["url"],
    }
    assert seen["url"].endswith("/v1/batches/1/status?day=2026-01-31")


def test_context_keys_are_passed_as_the_official_sensor_passes_them(serve: Serve, connection: Conn) -> None:
    _, conn = api(serve, connection, states("ready"))
    got: dict[str, Any] = {}

    def named(response: Any, ds: str, run_id: str) -> bool:
        got["named"] = (ds, run_id)
        return True

    def everything(response: Any, **context: Any) -> bool:
        got["all"] = set(context)
        return True

    for check in (named, everything):
        task = sensor(conn, response_check=check)
        context = make_context(task, ds="2026-01-31")
        assert task.execute(context)["status"] == "success"  # ready at the first look
    assert got["named"] == ("2026-01-31", "test_run")
    assert got["all"] >= {"ti", "task", "ds", "run_id", "logical_date"}


def test_the_conditions_pick_the_candidates_the_callable_judges(serve: Serve, connection: Conn) -> None:
    _, conn = api(serve, connection, states("pending", "ready"))
    judged: list[str] = []

    def check(response: Any) -> bool:
        judged.append(response.json()["state"])
        return True

    task = sensor(conn, response_check=check, success=[{"path": "state", "equals": "ready"}], poke_interval=0.05)
    with pytest.raises(TaskDeferred) as waiting:
        task.execute(make_context(task))  # pending: the conditions say not yet, the callable is not asked
    assert isinstance(waiting.value.trigger, HttpBatchReadyTrigger)
    result = task.execute_complete(make_context(task), run(deferred_trigger(waiting)), **waiting.value.kwargs)
    assert result["decision"]["argument"] == "state"
    assert judged == ["ready"]


def test_a_poke_return_value_says_done_and_gives_the_xcom(serve: Serve, connection: Conn) -> None:
    _, conn = api(serve, connection, states("pending", "ready"))

    def check(response: Any) -> PokeReturnValue:
        state = response.json()["state"]
        return PokeReturnValue(is_done=state == "ready", xcom_value={"state": state})

    task = sensor(conn, response_check=check, check_before_defer=False)
    context = make_context(task)
    with pytest.raises(TaskDeferred) as waiting:
        task.execute(context)
    with pytest.raises(TaskDeferred):  # not done: paused, then waits again
        task.execute_complete(context, run(deferred_trigger(waiting)), **waiting.value.kwargs)
    assert task.execute_complete(context, run(deferred_trigger(waiting)), **waiting.value.kwargs) == {"state": "ready"}


def test_poke_mode_runs_the_callable_on_every_candidate(serve: Serve, connection: Conn) -> None:
    server, conn = api(serve, connection, states("pending", "pending", "ready"))
    task = sensor(conn, response_check=is_ready, deferrable=False, poke_interval=0.05, timeout=30)
    result = task.execute(make_context(task))
    assert result["status"] == "success" and "response" not in result
    assert len(server.requests) == 3


# ---------------------------------------------------------------------------- exceptions
class Broken(Exception):
    pass


def broken(response: Any) -> bool:
    raise Broken("the check itself is wrong")


def test_an_exception_in_the_callable_fails_the_task(serve: Serve, connection: Conn) -> None:
    _, conn = api(serve, connection, states("ready"))
    task = sensor(conn, response_check=broken, check_before_defer=False, soft_fail=True)
    with pytest.raises(TaskDeferred) as waiting:
        task.execute(make_context(task))
    event = run(deferred_trigger(waiting))
    with pytest.raises(Broken, match="the check itself is wrong"):  # even with soft_fail, as officially
        task.execute_complete(make_context(task), event, **waiting.value.kwargs)


def test_never_fail_skips_and_silent_fail_waits_on_as_officially(serve: Serve, connection: Conn) -> None:
    _, conn = api(serve, connection, states("ready"))
    skipping = sensor(conn, response_check=broken, never_fail=True)
    with pytest.raises(AirflowSkipException, match="response_check raised"):
        skipping.execute(make_context(skipping))
    silent = sensor(conn, response_check=broken, silent_fail=True)
    with pytest.raises(TaskDeferred) as paused:
        silent.execute(make_context(silent))
    assert isinstance(paused.value.trigger, DateTimeTrigger)


# --------------------------------------------------------------- bodies the event cannot carry
def test_a_body_over_the_event_budget_is_fetched_again_whole_in_the_worker(serve: Serve, connection: Conn) -> None:
    big = {"state": "ready", "files": ["f" * 100] * 2000}  # ~200 KB
    server, conn = api(serve, connection, lambda seen: reply(200, big))
    sizes: list[int] = []

    def check(response: Any) -> bool:
        sizes.append(len(response.content))
        return len(response.json()["files"]) == 2000

    task = sensor(conn, response_check=check, check_before_defer=False)
    with pytest.raises(TaskDeferred) as waiting:
        task.execute(make_context(task))
    event = run(deferred_trigger(waiting))
    assert event["response"]["content"] is None and event["response"]["complete"] is False
    assert json_size(event) <= MAX_PAYLOAD_BYTES

    result = task.execute_complete(make_context(task), event, **waiting.value.kwargs)
    assert result["status"] == "success" and "response" not in result
    assert sizes == [len(json.dumps(big))]  # the whole body, as the official sensor reads it
    assert len(server.requests) == 2  # the trigger's look and the worker's


def test_a_body_over_max_body_bytes_reaches_the_callable_whole(serve: Serve, connection: Conn) -> None:
    body = json.dumps({"state": "ready", "pad": "x" * 5000}).encode()
    _, conn = api(serve, connection, lambda seen: reply(200, body, headers={"Content-Type": "application/json"}))
    got: list[bytes] = []
    task = sensor(conn, response_check=lambda response: got.append(response.content) or True, max_body_bytes=1000)
    assert task.execute(make_context(task))["status"] == "success"  # the first look read 1,000 bytes
    assert got == [body]


def test_a_body_small_enough_travels_in_the_event(serve: Serve, connection: Conn) -> None:
    body = b"x" * RESPONSE_BODY_EVENT_BYTES
    server, conn = api(serve, connection, lambda seen: reply(200, body))
    got: list[bytes] = []
    task = sensor(conn, response_check=lambda response: got.append(response.content) or True, check_before_defer=False)
    with pytest.raises(TaskDeferred) as waiting:
        task.execute(make_context(task))
    task.execute_complete(make_context(task), run(deferred_trigger(waiting)), **waiting.value.kwargs)
    assert got == [body]
    assert len(server.requests) == 1


def test_a_body_echoing_a_secret_never_travels_but_the_callable_sees_it(serve: Serve, connection: Conn) -> None:
    token = "tok-3f9a8c7e-never-in-an-event"

    def echo(seen: Seen) -> Any:
        return reply(200, {"state": "ready", "you_sent": seen.headers.get("Authorization")})

    server, conn = api(serve, connection, echo, extra={"bearer_token": token})
    got: list[str] = []
    task = sensor(
        conn, response_check=lambda response: got.append(response.json()["you_sent"]) or True, check_before_defer=False
    )
    with pytest.raises(TaskDeferred) as waiting:
        task.execute(make_context(task))
    event = run(deferred_trigger(waiting))
    assert token not in json.dumps(event)
    assert event["response"]["content"] is None  # it would have been masked: the worker asks again
    result = task.execute_complete(make_context(task), event, **waiting.value.kwargs)
    assert got == [f"Bearer {token}"]
    assert token not in json.dumps(result)
    assert len(server.requests) == 2


def test_the_look_again_can_say_not_yet_or_fail(serve: Serve, connection: Conn) -> None:
    big = {"state": "ready", "pad": "y" * (RESPONSE_BODY_EVENT_BYTES + 10)}
    server, conn = api(
        serve,
        connection,
        script(lambda: reply(200, big), lambda: reply(404), lambda: reply(200, big), lambda: reply(403, "no")),
    )
    task = sensor(conn, response_check=lambda response: True, check_before_defer=False)
    with pytest.raises(TaskDeferred) as waiting:
        task.execute(make_context(task))
    with pytest.raises(TaskDeferred) as paused:  # the worker's look got a 404: not yet, wait on
        task.execute_complete(make_context(task), run(deferred_trigger(waiting)), **waiting.value.kwargs)
    assert isinstance(paused.value.trigger, DateTimeTrigger)
    assert paused.value.kwargs == {**waiting.value.kwargs, "refusals": 1}  # same deadline, one refusal counted
    with pytest.raises(WaitFailedError, match=r"authorization: .*returned 403"):  # a 403 fails, as the trigger's would
        task.execute_complete(make_context(task), run(deferred_trigger(waiting)), **waiting.value.kwargs)
    assert len(server.requests) == 4
