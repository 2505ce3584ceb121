"""HttpBatchReadySensor: friendly conditions, deferral, the poke path and the example DAG."""

from __future__ import annotations

import asyncio
import importlib.util
import json
import sys
import threading
from collections.abc import Callable
from typing import Any

import pytest
from airflow.sdk.exceptions import AirflowSensorTimeout, AirflowSkipException

from airflow_deferrable_kit.sensors.base import WaitFailedError
from airflow_deferrable_kit.sensors.http import HttpBatchReadySensor
from airflow_deferrable_kit.testing import assert_defers, make_context
from airflow_deferrable_kit.triggers.http import HttpBatchReadyTrigger
from tests import REPO
from tests.integration.http.conftest import Server, reply, script

ROOT = REPO
Serve = Callable[..., Server]
Conn = Callable[..., str]


def states(*names: str) -> Any:
    return script(*[(lambda n=n: reply(200, {"state": n})) for n in names])


def sensor(**kwargs: Any) -> HttpBatchReadySensor:
    kwargs.setdefault("task_id", "batch_ready")
    kwargs.setdefault("http_conn_id", "batch_api")
    return HttpBatchReadySensor(**kwargs)


# ------------------------------------------------------------------------- construction
def test_friendly_conditions_become_one_canonical_acceptors_list() -> None:
    s = sensor(
        endpoint="v1/batches/1/status",
        success=[{"path": "state", "equals": "ready"}],
        failure=[{"path": "state", "in": ["failed", "cancelled"]}, {"status": 410}],
        retry=[{"status": [500, 502]}],
        acceptors=[{"state": "retry", "matcher": "path", "argument": "paused", "comparator": "exists"}],
    )
    trigger = s.build_trigger(deadline=None)
    assert trigger.acceptors == [
        {"state": "retry", "matcher": "path", "comparator": "exists", "argument": "paused"},
        {
            "state": "failure",
            "matcher": "path",
            "comparator": "in",
            "argument": "state",
            "expected": ["failed", "cancelled"],
        },
        {"state": "failure", "matcher": "status", "comparator": "equals", "expected": 410},
        {"state": "retry", "matcher": "status", "comparator": "in", "expected": [500, 502]},
        {"state": "success", "matcher": "path", "comparator": "equals", "argument": "state", "expected": "ready"},
    ]
    _, kwargs = trigger.serialize()
    assert HttpBatchReadyTrigger(**kwargs) == trigger


@pytest.mark.parametrize(
    ("kwargs", "error", "message"),
    [
        ({"success": [{"path": "state"}]}, ValueError, r"success\[0\] needs one of"),
        ({"failure": {"path": "state", "equals": "x"}}, ValueError, "failure must be a list"),
        ({"success": [{"status": "ok"}]}, ValueError, r"success\[0\]: a status acceptor expects HTTP status integers"),
        ({"endpoint": "http://other/x"}, ValueError, "endpoint must be a path relative"),
        ({"method": "TRACE"}, ValueError, "method must be one of"),
        ({"failure": [{"status": 410}]}, ValueError, "add a success condition"),
        ({"poke_interval": 0}, ValueError, "poke_interval must be a positive number"),
    ],
)
def test_bad_arguments_fail_at_dag_parse(kwargs: dict[str, Any], error: type[Exception], message: str) -> None:
    with pytest.raises(error, match=message):
        sensor(**kwargs)


def test_templated_values_are_validated_after_rendering() -> None:
    s = sensor(endpoint="v1/batches/{{ ds }}/status", success=[{"path": "batch", "equals": "{{ ds }}"}])
    assert s.endpoint == "v1/batches/{{ ds }}/status"
    assert s.acceptors[0]["expected"] == "{{ ds }}"
    assert set(s.template_fields) >= {"endpoint", "query", "json_body", "acceptors", "http_conn_id"}


def test_defers_with_no_secret_in_the_kwargs(connection: Conn) -> None:
    connection("batch_api", host="127.0.0.1", port=1, login="etl", password="hunter2-secret")
    s = sensor(
        endpoint="v1/batches/1",
        success=[{"path": "state", "equals": "ready"}],
        deferrable=True,
        check_before_defer=False,
        timeout=3600,
    )
    trigger = assert_defers(s, HttpBatchReadyTrigger)
    assert trigger.deadline is not None
    assert trigger.poll_interval == s.poke_interval
    assert "hunter2" not in json.dumps(trigger.serialize())


# ---------------------------------------------------------------------------- poke path
def test_poke_mode_uses_the_same_acceptors(serve: Serve, connection: Conn) -> None:
    server = serve(states("pending", "pending", "ready"))
    connection("batch_api", host="127.0.0.1", port=server.port)
    s = sensor(
        endpoint="v1/batches/1",
        success=[{"path": "state", "equals": "ready"}],
        deferrable=False,
        poke_interval=0.05,
        timeout=30,
    )
    payload = s.execute(make_context(s))
    assert payload["status"] == "success"
    assert payload["decision"]["argument"] == "state"
    assert len(server.requests) == 3


def test_poke_mode_failure_acceptor_fails_the_task(serve: Serve, connection: Conn) -> None:
    server = serve(states("pending", "failed"))
    connection("batch_api", host="127.0.0.1", port=server.port)
    s = sensor(
        success=[{"path": "state", "equals": "ready"}],
        failure=[{"path": "state", "equals": "failed"}],
        deferrable=False,
        poke_interval=0.05,
        soft_fail=True,  # an error is never softened into a skip
    )
    with pytest.raises(WaitFailedError, match="condition_failed"):
        s.execute(make_context(s))
    assert len(server.requests) == 2


def test_poke_mode_transient_errors_are_poked_again_until_timeout(serve: Serve, connection: Conn) -> None:
    server = serve(script(lambda: reply(503)))
    connection("batch_api", host="127.0.0.1", port=server.port)
    s = sensor(deferrable=False, poke_interval=0.05, timeout=0.3)
    with pytest.raises(AirflowSensorTimeout):
        s.execute(make_context(s))
    assert len(server.requests) >= 2  # a 503 did not fail the task: it poked again


def test_deferrable_sensor_finishes_in_the_worker_when_already_ready(serve: Serve, connection: Conn) -> None:
    server = serve(states("ready"))
    connection("batch_api", host="127.0.0.1", port=server.port)
    s = sensor(success=[{"path": "state", "equals": "ready"}], deferrable=True, select=["state"])
    payload = s.execute(make_context(s))
    assert payload["fields"] == {"state": "ready"}
    assert len(server.requests) == 1


def test_resume_returns_the_payload_or_fails() -> None:
    s = sensor(deferrable=True)
    ok = {"status": "success", "status_code": 200, "url": "http://x/y"}
    assert s.execute_complete(make_context(s), ok) == ok
    with pytest.raises(WaitFailedError, match="authorization"):
        s.execute_complete(make_context(s), {"status": "error", "error_type": "authorization", "message": "denied"})


# --------------------------------------------------------------------------- example DAG
def test_example_dag_parses_without_network(monkeypatch: pytest.MonkeyPatch) -> None:
    import socket

    def no_network(*args: Any, **kwargs: Any) -> None:
        raise AssertionError("the example DAG opened a network connection at parse time")

    monkeypatch.setattr(socket.socket, "connect", no_network)
    path = ROOT / "dags" / "example_http.py"
    spec = importlib.util.spec_from_file_location("example_http_dag", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, "example_http_dag", module)
    spec.loader.exec_module(module)
    dag = module.dag
    sensors = [t for t in dag.tasks if isinstance(t, HttpBatchReadySensor)]
    assert len(sensors) >= 2
    for task in sensors:
        assert task.deferrable is True
        assert any(a["state"] == "success" for a in task.acceptors) or task.predicate or not task.acceptors


@pytest.mark.parametrize(("soft_fail", "outcome"), [(False, AirflowSensorTimeout), (True, AirflowSkipException)])
def test_the_first_look_in_the_worker_ends_at_the_sensor_timeout(
    serve: Serve, connection: Conn, soft_fail: bool, outcome: type[Exception]
) -> None:
    """A server that never answers holds the first look (before deferring) only until ``timeout``."""
    released = threading.Event()

    async def stall(seen: Any) -> Any:
        await asyncio.to_thread(released.wait)  # in the server's own loop
        return reply(200, {"state": "ready"})

    server = serve(stall)
    connection("batch_api", host="127.0.0.1", port=server.port)
    s = sensor(deferrable=True, timeout=1, request_timeout=600, soft_fail=soft_fail)
    try:
        with pytest.raises(outcome, match="first look in the worker had no answer by the deadline"):
            s.execute(make_context(s))
    finally:
        released.set()
    assert len(server.requests) == 1  # it was looking, not deferred
