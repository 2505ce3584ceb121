"""An importable ``response_check`` is judged in the triggerer: a "not yet" costs no worker start.

The official ``HttpSensor`` stops deferring as soon as it has a ``response_check``; the kit's
sensor defers either way, and when the triggerer can import the check (a dotted path, or a
function of an installed package taking the response alone) the trigger runs it on each answer,
given a ``requests.Response`` as officially. A lambda or a function of the DAG file keeps the
worker path.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import pytest
import yaml

from airflow_deferrable_kit.sensors.http import HttpBatchReadySensor, triggerer_path
from airflow_deferrable_kit.testing import run_trigger_payload
from airflow_deferrable_kit.triggers import http as http_trigger
from airflow_deferrable_kit.triggers.base import deadline_after
from airflow_deferrable_kit.triggers.http import DEFAULT_MAX_BODY_BYTES, HttpBatchReadyTrigger
from tests.integration.http import predicates
from tests.integration.http.conftest import Server, reply, script

Serve = Callable[..., Server]
Conn = Callable[..., str]
CHECK = "tests.integration.http.predicates:ready_by_response"


def sensor(**kwargs: Any) -> HttpBatchReadySensor:
    return HttpBatchReadySensor(task_id="ready", http_conn_id="batch_api", endpoint="v1/status", **kwargs)


def defined_here(response: Any) -> bool:
    return bool(response)


def test_a_dotted_path_is_judged_in_the_triggerer() -> None:
    wait = sensor(response_check=CHECK, deferrable=True)
    assert wait.checks_in_worker() is None
    trigger = wait.build_trigger(deadline=None)
    assert isinstance(trigger, HttpBatchReadyTrigger)
    assert (trigger.predicate, trigger.predicate_receives, trigger.include_response) == (CHECK, "response", False)
    assert HttpBatchReadyTrigger(**trigger.serialize()[1]) == trigger


def test_an_installed_packages_function_is_judged_in_the_triggerer_by_its_path() -> None:
    assert triggerer_path(yaml.safe_load) == "yaml:safe_load"


@pytest.mark.parametrize(
    "check",
    [
        lambda response: True,
        defined_here,  # not an installed package: the triggerer may not have this module
        lambda response, ti: True,
    ],
    ids=["lambda", "outside-an-installed-package", "names-context-keys"],
)
def test_what_the_triggerer_cannot_import_stays_in_the_worker(check: Callable[..., bool]) -> None:
    assert triggerer_path(check) is None
    wait = sensor(response_check=check, deferrable=True)
    assert wait.checks_in_worker() == "response_check"
    trigger = wait.build_trigger(deadline=None)
    assert isinstance(trigger, HttpBatchReadyTrigger)
    assert trigger.predicate is None and trigger.include_response is True


def test_a_path_that_cannot_be_imported_or_beside_a_predicate_is_refused_at_parse() -> None:
    refused = r"response_check 'tests\.integration\.http\.predicates:nope' cannot be imported"
    with pytest.raises(ValueError, match=refused):
        sensor(response_check="tests.integration.http.predicates:nope")
    with pytest.raises(ValueError, match="response_check or predicate, not both"):
        sensor(response_check=CHECK, predicate="tests.integration.http.predicates:even_count_ready")
    with pytest.raises(ValueError, match="predicate_receives must be one of dict, response"):
        HttpBatchReadyTrigger(http_conn_id="batch_api", predicate=CHECK, predicate_receives="message")


async def test_the_trigger_gives_the_check_a_requests_response_and_waits_on_its_refusals(
    serve: Serve, connection: Conn
) -> None:
    states = ["pending", "pending", "ready"]
    server = serve(script(*[(lambda s=s: reply(200, {"state": s})) for s in states]))
    conn = connection("batch_api", host="127.0.0.1", port=server.port)
    predicates.RESPONSE_TYPES.clear()
    trigger = sensor(response_check=CHECK, poke_interval=0.05).build_trigger(deadline=None)
    payload = await run_trigger_payload(trigger)
    assert conn == "batch_api" and payload["status"] == "success"
    assert payload["decision"]["matcher"] == "predicate" and payload["decision"]["argument"] == CHECK
    assert len(server.requests) == 3  # two refusals judged here, no worker in between
    assert predicates.RESPONSE_TYPES == ["requests.models.Response"] * 3


def status_document(size: int) -> bytes:
    """A JSON status document of at least ``size`` bytes: ready, with a long list of files."""
    files = [f"s3://lake/orders/part-{i:07d}.parquet" for i in range(size // 36 + 1)]
    return json.dumps({"state": "ready", "files": files}).encode()


async def test_a_status_document_over_max_body_bytes_reaches_the_check_whole(serve: Serve, connection: Conn) -> None:
    # The official HttpSensor reads the whole body; a 1.8 MB document cut at 1 MiB made
    # response.json() raise and the task fail with predicate_error.
    body = status_document(1_800_000)
    assert len(body) > DEFAULT_MAX_BODY_BYTES
    server = serve(script(lambda: reply(200, body, headers={"Content-Type": "application/json"})))
    connection("batch_api", host="127.0.0.1", port=server.port)
    predicates.BODY_SIZES.clear()
    payload = await run_trigger_payload(sensor(response_check=CHECK).build_trigger(deadline=None))
    assert payload["status"] == "success" and payload["decision"]["matcher"] == "predicate", payload
    assert [len(body)] == predicates.BODY_SIZES and len(server.requests) == 1


async def test_a_body_over_what_a_check_may_be_given_fails_naming_max_body_bytes(
    serve: Serve, connection: Conn
) -> None:
    body = status_document(getattr(http_trigger, "PREDICATE_BODY_BYTES", 32 * 1024 * 1024) + 1024)
    server = serve(script(lambda: reply(200, body, headers={"Content-Type": "application/json"})))
    connection("batch_api", host="127.0.0.1", port=server.port)
    predicates.BODY_SIZES.clear()
    payload = await run_trigger_payload(sensor(response_check=CHECK).build_trigger(deadline=None))
    assert payload["status"] == "error" and payload["error_type"] == "bad_configuration", payload
    assert "max_body_bytes" in payload["message"] and "raise max_body_bytes" in payload["message"]
    assert predicates.BODY_SIZES == []  # never given a cut body
    # Raised above the body's size, the same check is given it whole.
    wait = sensor(response_check=CHECK, max_body_bytes=len(body)).build_trigger(deadline=None)
    assert (await run_trigger_payload(wait))["status"] == "success" and [len(body)] == predicates.BODY_SIZES


async def test_a_predicate_given_a_dict_gets_the_whole_body_too(serve: Serve, connection: Conn) -> None:
    body = json.dumps({"count": 2, "padding": "x" * 1_500_000}).encode()
    server = serve(script(lambda: reply(200, body, headers={"Content-Type": "application/json"})))
    conn = connection("batch_api", host="127.0.0.1", port=server.port)
    trigger = HttpBatchReadyTrigger(
        http_conn_id=conn, endpoint="v1/status", predicate="tests.integration.http.predicates:even_count_ready",
        poll_interval=0.05, deadline=deadline_after(2.0),
    )  # fmt: skip
    payload = await run_trigger_payload(trigger)
    assert payload["status"] == "success" and payload["decision"]["matcher"] == "predicate", payload
