"""HTTP conditions as users write them: JSONPath roots, status codes as strings, and errors that
name the entry the user wrote (``success[1]``), all settled when the DAG is parsed."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from airflow_deferrable_kit.sensors.http import HttpBatchReadySensor
from airflow_deferrable_kit.testing import run_trigger_payload
from airflow_deferrable_kit.triggers.base import deadline_after
from airflow_deferrable_kit.triggers.http import HttpBatchReadyTrigger
from tests.integration.http.conftest import Server, reply, script

Serve = Callable[..., Server]
Conn = Callable[..., str]
READY = {"path": "state", "equals": "ready"}


def sensor(**kwargs: Any) -> HttpBatchReadySensor:
    kwargs.setdefault("task_id", "batch_ready")
    kwargs.setdefault("http_conn_id", "batch_api")
    kwargs.setdefault("endpoint", "v1/batches/42")
    kwargs.setdefault("poke_interval", 0.05)
    return HttpBatchReadySensor(**kwargs)


def deferred(s: HttpBatchReadySensor, seconds: float = 10) -> HttpBatchReadyTrigger:
    trigger = s.build_trigger(deadline=deadline_after(seconds))
    assert isinstance(trigger, HttpBatchReadyTrigger)
    return trigger


def serve_api(serve: Serve, connection: Conn, *steps: Callable[[], Any]) -> str:
    server = serve(script(*steps))
    return connection("batch_api", host="127.0.0.1", port=server.port)


# ------------------------------------------------------------------------- JSON paths
async def test_a_jsonpath_rooted_path_matches_and_selects_like_the_plain_one(serve: Serve, connection: Conn) -> None:
    """``$.state`` used to be read as the key "$" and never matched: the wait ran to its timeout."""
    serve_api(
        serve,
        connection,
        lambda: reply(200, {"state": "pending", "rows": 1}),
        lambda: reply(200, {"state": "ready", "rows": 10, "files": [{"name": "a.csv"}]}),
    )
    s = sensor(success=[{"path": "$.state", "equals": "ready"}], select=["$.rows", "$.files[0].name"])

    payload = await run_trigger_payload(deferred(s))

    assert payload["status"] == "success", payload
    assert payload["decision"]["argument"] == "$.state"
    assert payload["fields"] == {"$.rows": 10, "$.files[0].name": "a.csv"}


@pytest.mark.parametrize(
    ("arguments", "named", "feature"),
    [
        ({"success": [READY, {"path": "items[*].state", "equals": "ready"}]}, "success[1]", "a wildcard '[*]'"),
        ({"failure": [{"path": "$..error", "exists": True}], "success": [READY]}, "failure[0]", "recursive descent"),
        ({"success": [{"path": "items[?(@.ok)]", "exists": True}]}, "success[0]", "a filter"),
        ({"success": [{"path": "@.state", "equals": "ready"}]}, "success[0]", "the current node '@'"),
        ({"select": ["rows", "items[*].name"]}, "select", "a wildcard '[*]'"),
    ],
)
def test_jsonpath_syntax_the_parser_does_not_read_is_refused_at_parse(
    arguments: dict[str, Any], named: str, feature: str
) -> None:
    with pytest.raises(ValueError) as caught:
        sensor(**arguments)
    message = str(caught.value)
    assert message.startswith(named), message
    assert feature in message, message
    assert "use names joined by dots" in message, message


# ------------------------------------------------------------------------ status codes
@pytest.mark.parametrize(
    ("arguments", "named", "bad"),
    [
        ({"success": [READY, {"status": 99}]}, "success[1]", "99"),
        ({"success": [READY], "failure": [{"status": ["410", "gone"]}]}, "failure[0]", "['410', 'gone']"),
        ({"success": [READY], "retry": [{"status": True}]}, "retry[0]", "True"),
        ({"acceptors": [{"state": "success", "matcher": "status", "expected": 1000}]}, "acceptors[0]", "1000"),
    ],
)
def test_a_bad_status_is_named_by_the_entry_the_user_wrote(arguments: dict[str, Any], named: str, bad: str) -> None:
    """The check used to run on the merged list in the trigger, so it said ``acceptors[1]``."""
    with pytest.raises(ValueError) as caught:
        sensor(**arguments)
    message = str(caught.value)
    assert message.startswith(f"{named}: a status acceptor expects HTTP status integers (100-599)"), message
    assert message.endswith(f"got {bad}"), message


def test_status_codes_given_as_digit_strings_become_integers() -> None:
    """Airflow's HttpSensor takes ``response_error_codes_allowlist=["404"]``; the same codes work here."""
    s = sensor(success=[{"status": "204"}], failure=[{"status": ["410", 422]}], not_yet_codes=["404", "202"])
    trigger = s.build_trigger(deadline=None)
    assert [(a["state"], a["expected"]) for a in trigger.acceptors] == [("failure", [410, 422]), ("success", 204)]
    assert trigger.not_yet_codes == [404, 202]
    _, kwargs = trigger.serialize()
    assert HttpBatchReadyTrigger(**kwargs) == trigger

    canonical = HttpBatchReadyTrigger(acceptors=[{"state": "success", "matcher": "status", "expected": "204"}])
    assert [a.expected for a in canonical._conditions.acceptors] == [204]


async def test_string_codes_decide_real_responses(serve: Serve, connection: Conn) -> None:
    serve_api(serve, connection, lambda: reply(202), lambda: reply(204))
    s = sensor(success=[{"status": "204"}], not_yet_codes=["202"])

    payload = await run_trigger_payload(deferred(s))

    assert payload["status"] == "success", payload
    assert payload["status_code"] == 204
    assert payload["decision"]["expected"] == 204


def test_a_templated_status_is_left_for_the_trigger_to_check_once_rendered() -> None:
    s = sensor(success=[{"status": "{{ params.ready_code }}"}])
    assert s.acceptors[0]["expected"] == "{{ params.ready_code }}"
    rendered = [{**s.acceptors[0], "expected": "204"}]
    assert HttpBatchReadyTrigger(acceptors=rendered)._conditions.acceptors[0].expected == 204
    with pytest.raises(ValueError, match=r"^acceptors\[0\]: a status acceptor expects"):
        HttpBatchReadyTrigger(acceptors=[{**s.acceptors[0], "expected": "ready"}])
