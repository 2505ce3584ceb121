"""An importable ``response_check`` is judged in the triggerer: a "not yet" costs no worker start.

The official ``HttpSensor`` stops deferring as soon as it has a ``response_check``; the kit's
sensor defers either way, and when the triggerer can import the check (a dotted path, or a
function of an installed package taking the response alone) the trigger runs it on each answer,
given a ``requests.Response`` as officially. A lambda or a function of the DAG file keeps the
worker path.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
import yaml

from airflow_deferrable_kit.sensors.http import HttpBatchReadySensor, triggerer_path
from airflow_deferrable_kit.testing import run_trigger_payload
from airflow_deferrable_kit.triggers.http import HttpBatchReadyTrigger
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
