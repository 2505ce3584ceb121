"""HttpJobOperator and HttpJobTrigger against a real job API on 127.0.0.1 (``job_api.py``).

The evidence is what the server counts: submits, jobs created, cancels. The task state store is
stood in for by :class:`MemoryStore` (the accessor's ``get`` / ``set``, as a worker calls them);
the real store is exercised end to end in ``tests/e2e/test_http_jobs_e2e.py``.
"""

from __future__ import annotations

import asyncio
import base64
import json
from collections.abc import Callable
from typing import Any

import pytest
from airflow.sdk.exceptions import AirflowTaskTimeout, TaskDeferred

from airflow_deferrable_kit.leases import held_keys
from airflow_deferrable_kit.operators.http import HttpJobError, HttpJobOperator
from airflow_deferrable_kit.testing import FakeClock, make_context, run_trigger_payload
from airflow_deferrable_kit.triggers.http_jobs import HttpJobTrigger
from tests.integration.http.conftest import Seen, Server, reply
from tests.integration.http.job_api import JobApi, start

Serve = Callable[..., Server]
Conn = Callable[..., str]

STATUS = {
    "success": [{"path": "state", "equals": "succeeded"}],
    "failure": [{"path": "state", "in": ["failed", "cancelled"]}],
    "running": [{"path": "state", "equals": "running"}],
}


class MemoryStore:
    """The task state store as a worker's task sees it (``get`` / ``set``), kept in memory."""

    def __init__(self) -> None:
        self.values: dict[str, Any] = {}

    def get(self, key: str, default: Any = None) -> Any:
        return self.values.get(key, default)

    def set(self, key: str, value: Any, *, retention: Any = None) -> None:
        self.values[key] = json.loads(json.dumps(value))


def api_and_conn(serve: Serve, connection: Conn, **behaviour: Any) -> tuple[JobApi, str]:
    api = start(serve, **behaviour)
    assert api.server is not None
    return api, connection("jobs_api", host="127.0.0.1", port=api.server.port, login="svc", password="s3cr3t-job-token")


def job_operator(conn_id: str, **kwargs: Any) -> HttpJobOperator:
    for name, value in STATUS.items():
        kwargs.setdefault(name, value)
    kwargs.setdefault("endpoint", "jobs")
    kwargs.setdefault("data", {"sql": "select 1"})
    kwargs.setdefault("poll_interval", 0.05)
    kwargs.setdefault("max_backoff", 0.2)
    kwargs.setdefault("deferrable", True)
    kwargs.setdefault("items_path", "items")
    kwargs.setdefault("next_link_path", "next")
    kwargs.setdefault("result_link_path", "result_url")
    return HttpJobOperator(task_id=kwargs.pop("task_id", "job"), http_conn_id=conn_id, **kwargs)


def execute(op: HttpJobOperator, store: MemoryStore | None) -> Any:
    """``op.execute`` as a worker runs it: the result, or the ``TaskDeferred`` it raised."""
    context = make_context(op, **({"task_state_store": store} if store is not None else {}))
    try:
        return op.execute(context)  # type: ignore[arg-type]
    except TaskDeferred as deferred:
        return deferred


def run(trigger: HttpJobTrigger) -> Any:
    return asyncio.run(run_trigger_payload(trigger))


async def polled(api: JobApi, times: int) -> None:
    """Until the job's status was asked ``times`` times (the server counts)."""
    for _ in range(3000):
        if api.jobs["j1"].polls >= times:
            return
        await asyncio.sleep(0.01)
    raise AssertionError(f"the job was polled {api.jobs['j1'].polls} times, not {times}")


def resume(op: HttpJobOperator, deferred: TaskDeferred, store: MemoryStore | None) -> Any:
    payload = run(deferred.trigger)  # type: ignore[arg-type]
    context = make_context(op, **({"task_state_store": store} if store is not None else {}))
    return op.execute_complete(context, payload, **(deferred.kwargs or {}))  # type: ignore[arg-type]


# --------------------------------------------------------------------------- answer shapes
@pytest.mark.parametrize("shape", ["location", "operation", "azure", "content", "id"])
def test_each_submit_answer_is_followed_to_the_paged_result(serve: Serve, connection: Conn, shape: str) -> None:
    api, conn = api_and_conn(serve, connection, shape=shape, runs_for=2)
    extra = {"status_endpoint": "jobs/{id}", "job_id_path": "id"} if shape == "id" else {}
    op = job_operator(conn, **extra)
    store = MemoryStore()
    deferred = execute(op, store)
    assert isinstance(deferred, TaskDeferred)
    saved = store.values["http_job"]
    assert saved["state"] == "running" and saved["status_url"].endswith("jobs/j1"), saved
    assert deferred.trigger.endpoint == saved["status_url"]
    payload = resume(op, deferred, store)
    assert payload["status"] == "success"
    assert payload["result"] == [{"n": n} for n in range(5)] and payload["pages"] == 3 and payload["complete"]
    assert api.submits == 1 and api.created == 1 and api.cancels == []
    assert store.values["http_job"]["state"] == "succeeded"
    assert json.loads(api.jobs["j1"].body) == {"sql": "select 1"}


def test_the_wait_alone_goes_to_its_trigger_queue(
    serve: Serve, connection: Conn, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The queue Airflow's own worker sends with the deferral (``_defer_task``) is ``trigger_queue``."""
    from types import SimpleNamespace

    import structlog
    from airflow.sdk.execution_time.task_runner import _defer_task

    monkeypatch.setenv("AIRFLOW__TRIGGERER__QUEUES_ENABLED", "True")
    api, conn = api_and_conn(serve, connection, shape="location", runs_for=2)
    op = job_operator(conn, queue="etl-workers", trigger_queue="trg-jobs-api")
    deferred = execute(op, MemoryStore())
    assert isinstance(deferred, TaskDeferred)
    ti = SimpleNamespace(task=op, dag_id="d", task_id=op.task_id, run_id="r")
    message, _ = _defer_task(deferred, ti, structlog.get_logger())  # type: ignore[arg-type]
    assert message.queue == "trg-jobs-api"  # type: ignore[union-attr]
    assert api.submits == 1


def test_a_synchronous_answer_is_the_result_with_no_deferral(serve: Serve, connection: Conn) -> None:
    api, conn = api_and_conn(serve, connection, shape="sync")
    op = job_operator(conn, items_path=None, next_link_path=None, result_link_path=None, select=["answer"])
    store = MemoryStore()
    payload = execute(op, store)
    assert not isinstance(payload, TaskDeferred)
    assert payload["status"] == "success" and payload["result"]["answer"] == 42 and payload["fields"] == {"answer": 42}
    assert api.submits == 1 and "http_job" not in store.values


def test_a_pending_statement_is_polled_by_the_id_in_its_answer(serve: Serve, connection: Conn) -> None:
    """The Databricks statement shape: 200 with a state, the status URL built from the id."""
    api, conn = api_and_conn(serve, connection, shape="pending", runs_for=1)
    op = job_operator(
        conn,
        success=[{"path": "status.state", "equals": "SUCCEEDED"}],
        failure=[{"path": "status.state", "in": ["FAILED", "CANCELED"]}],
        running=[{"path": "status.state", "in": ["PENDING", "RUNNING"]}],
        status_endpoint="jobs/{id}",
        job_id_path="statement_id",
        result_endpoint="jobs/{id}/result",
        result_link_path=None,
    )
    deferred = execute(op, MemoryStore())
    assert isinstance(deferred, TaskDeferred)
    assert deferred.trigger.job["id"] == "j1" and deferred.trigger.endpoint == "jobs/j1"
    payload = resume(op, deferred, None)
    assert payload["result"] == [{"n": n} for n in range(5)] and api.submits == 1


def test_retry_after_on_the_submit_delays_the_first_poll(serve: Serve, connection: Conn) -> None:
    _, conn = api_and_conn(serve, connection, retry_after="7")
    deferred = execute(job_operator(conn), MemoryStore())
    trigger = deferred.trigger
    assert "poll_after" in trigger.job
    clock = FakeClock()
    trigger.clock = clock
    assert run(trigger)["status"] == "success"
    assert clock.sleeps[0] > 6, clock.sleeps


def test_a_303_see_other_leads_to_the_result(serve: Serve, connection: Conn) -> None:
    _, conn = api_and_conn(serve, connection, see_other=True, runs_for=1)
    op = job_operator(conn)
    payload = resume(op, execute(op, None), None)
    assert payload["status"] == "success" and payload["decision"]["matcher"] == "redirect"
    assert payload["result"] == [{"n": n} for n in range(5)] and payload["pages"] == 3


# ------------------------------------------------------------------------------ pagination
@pytest.mark.parametrize(
    ("paging", "options"),
    [
        ("next", {"next_link_path": "next"}),
        ("link", {"next_link_path": None}),
        ("cursor", {"next_link_path": None, "cursor_path": "cursor", "cursor_param": "cursor"}),
    ],
)
def test_every_page_is_followed(serve: Serve, connection: Conn, paging: str, options: dict[str, Any]) -> None:
    _, conn = api_and_conn(serve, connection, paging=paging, items=7, page_size=3)
    op = job_operator(conn, result_link_path="result_url", **options)
    payload = resume(op, execute(op, None), None)
    assert payload["result"] == [{"n": n} for n in range(7)] and payload["pages"] == 3 and payload["complete"]


def test_max_pages_stops_and_the_cursor_carries_the_fetch_on(serve: Serve, connection: Conn) -> None:
    api, conn = api_and_conn(serve, connection, paging="cursor", items=7, page_size=3)
    op = job_operator(
        conn, result_endpoint="jobs/{id}/result", job_id_path="id", next_link_path=None, result_link_path=None,
        cursor_path="cursor", cursor_param="cursor", max_pages=2,
    )  # fmt: skip
    payload = resume(op, execute(op, None), None)
    assert payload["result"] == [{"n": n} for n in range(6)] and not payload["complete"]
    assert payload["next"]["cursor"] == "6"
    # A fetch carried on from the cursor (a later deferral) reads what is left, and only that.
    carried = op.build_trigger(
        {"status_url": "jobs/j1", "id": "j1", "result_url": "jobs/j1/result", "cursor": payload["next"]["cursor"]},
        None,
    )
    rest = run(carried)
    assert rest["result"] == [{"n": 6}] and rest["complete"] and api.submits == 1


def test_a_result_too_large_for_xcom_is_cut_and_says_so(serve: Serve, connection: Conn) -> None:
    _, conn = api_and_conn(serve, connection, items=20_000, page_size=5_000)
    op = job_operator(conn)
    payload = resume(op, execute(op, None), None)
    assert payload["status"] == "success" and payload["pages"] == 4
    assert len(json.dumps(payload)) <= 64 * 1024
    assert any(cut["path"] == "$.result" for cut in payload["truncated"]), payload["truncated"]


# ------------------------------------------------------------------------- failure and retry
def test_a_failed_job_fails_with_its_message_and_fields(serve: Serve, connection: Conn) -> None:
    api, conn = api_and_conn(serve, connection, fails=True)
    op = job_operator(conn, select=["error.message", "error.code"])
    store = MemoryStore()
    deferred = execute(op, store)
    payload = run(deferred.trigger)
    assert payload["status"] == "error" and payload["error_type"] == "condition_failed"
    assert "division by zero in step 3" in payload["message"]
    assert payload["fields"] == {"error.message": "division by zero in step 3", "error.code": "E42"}
    with pytest.raises(HttpJobError, match="division by zero"):
        op.execute_complete(make_context(op, task_state_store=store), payload, **deferred.kwargs)  # type: ignore[arg-type]
    assert store.values["http_job"]["state"] == "failed"
    # A retry does not send the job again unless told to.
    with pytest.raises(HttpJobError, match="resubmit_on_retry=False"):
        execute(job_operator(conn), store)
    assert api.submits == 1
    api.fails = False
    again = execute(job_operator(conn, resubmit_on_retry=True), store)
    assert isinstance(again, TaskDeferred)
    assert api.submits == 2 and api.created == 2 and api.keys[0] != api.keys[1]


def test_a_retry_after_the_wait_failed_re_attaches_without_submitting(serve: Serve, connection: Conn) -> None:
    api, conn = api_and_conn(serve, connection, runs_for=1000)
    store = MemoryStore()
    first = execute(job_operator(conn), store)
    assert isinstance(first, TaskDeferred)
    # The try ends without an answer (a crashed worker, a trigger error): the next try re-attaches.
    second = execute(job_operator(conn), store)
    assert isinstance(second, TaskDeferred)
    assert second.trigger.endpoint == first.trigger.endpoint and api.submits == 1
    api.runs_for = 0
    payload = execute(job_operator(conn), store)  # the job is done by now: finished at once, no deferral
    assert payload["status"] == "success" and api.submits == 1 and api.created == 1


def test_a_triggerer_killed_mid_wait_rebuilds_the_trigger_and_submits_nothing(serve: Serve, connection: Conn) -> None:
    api, conn = api_and_conn(serve, connection, runs_for=1000)
    deferred = execute(job_operator(conn), MemoryStore())
    _, kwargs = deferred.trigger.serialize()

    async def killed_then_restarted() -> Any:
        trigger = HttpJobTrigger(**json.loads(json.dumps(kwargs)))
        task = asyncio.ensure_future(run_trigger_payload(trigger))
        await polled(api, 2)
        task.cancel()  # the triggerer went away: no on_kill, only cleanup
        await asyncio.gather(task, return_exceptions=True)
        api.runs_for = api.jobs["j1"].polls + 1
        return await run_trigger_payload(HttpJobTrigger(**json.loads(json.dumps(kwargs))))

    payload = asyncio.run(killed_then_restarted())
    assert payload["status"] == "success"
    assert api.submits == 1 and api.cancels == []


def test_no_idempotency_store_still_sends_one_key_per_task_instance(serve: Serve, connection: Conn) -> None:
    """Airflow 3.2 (no task state store): a retry submits again, with the same key; the server dedupes."""
    api, conn = api_and_conn(serve, connection, runs_for=1000)
    first, second = execute(job_operator(conn), None), execute(job_operator(conn), None)
    assert api.submits == 2 and api.created == 1 and api.keys[0] == api.keys[1] is not None
    assert first.trigger.endpoint == second.trigger.endpoint


# ------------------------------------------------------------------------------------ cancel
def test_a_timeout_cancels_the_job_once_and_the_retry_submits_anew(serve: Serve, connection: Conn) -> None:
    api, conn = api_and_conn(serve, connection, runs_for=10_000)
    op = job_operator(conn, timeout=0.3)
    store = MemoryStore()
    deferred = execute(op, store)
    payload = run(deferred.trigger)
    assert payload["status"] == "timeout" and payload["cancel"]["sent"] is True
    assert api.cancels == [("DELETE", "j1")]
    with pytest.raises(AirflowTaskTimeout, match="cancelled"):
        op.execute_complete(make_context(op, task_state_store=store), payload, **deferred.kwargs)  # type: ignore[arg-type]
    assert store.values["http_job"]["state"] == "cancelled"
    assert isinstance(execute(job_operator(conn), store), TaskDeferred)
    assert api.submits == 2 and api.created == 2 and len(api.cancels) == 1


def test_on_kill_in_the_triggerer_sends_the_configured_cancel_once(serve: Serve, connection: Conn) -> None:
    api, conn = api_and_conn(serve, connection, runs_for=10_000)
    op = job_operator(conn, cancel_endpoint="jobs/{id}/cancel", cancel_method="POST", job_id_path="id")
    trigger = execute(op, MemoryStore()).trigger

    async def killed() -> None:
        task = asyncio.ensure_future(run_trigger_payload(trigger))
        await polled(api, 1)
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        await trigger.on_kill()  # what Airflow 3.3's runner calls after a user's kill

    asyncio.run(killed())
    assert api.cancels == [("POST", "j1")] and api.submits == 1


def test_nothing_is_cancelled_after_a_success(serve: Serve, connection: Conn) -> None:
    api, conn = api_and_conn(serve, connection)
    op = job_operator(conn, deferrable=False)
    payload = execute(op, MemoryStore())
    assert payload["status"] == "success" and payload["result"] == [{"n": n} for n in range(5)]
    op.on_kill()
    assert api.cancels == [] and api.submits == 1


def test_the_worker_path_runs_the_same_loop_and_cancels_on_kill(serve: Serve, connection: Conn) -> None:
    api, conn = api_and_conn(serve, connection, runs_for=10_000)
    op = job_operator(conn, deferrable=False, timeout=0.3)
    with pytest.raises(AirflowTaskTimeout):
        execute(op, MemoryStore())
    assert api.cancels == [("DELETE", "j1")]
    op.on_kill()  # the job ended (cancelled): a later kill sends nothing more
    assert len(api.cancels) == 1


# ------------------------------------------------------------------------- bad answers
def test_a_202_naming_no_job_fails_saying_what_to_set(serve: Serve, connection: Conn) -> None:
    api, conn = api_and_conn(serve, connection, shape="id")
    with pytest.raises(HttpJobError, match="status_endpoint='jobs/\\{id\\}' and job_id_path"):
        execute(job_operator(conn), MemoryStore())
    assert api.submits == 1


def test_a_refused_submit_fails_with_the_status_and_nothing_is_followed(serve: Serve, connection: Conn) -> None:
    api, conn = api_and_conn(serve, connection)
    store = MemoryStore()
    with pytest.raises(HttpJobError, match="returned 404"):
        execute(job_operator(conn, endpoint="nowhere"), store)
    assert store.values == {} and api.submits == 0 and api.server is not None and len(api.server.requests) == 1


def test_status_errors_back_off_and_the_wait_goes_on(serve: Serve, connection: Conn) -> None:
    api, conn = api_and_conn(serve, connection, runs_for=2, status_code_while_running=503)
    op = job_operator(conn)
    payload = resume(op, execute(op, None), None)
    assert payload["status"] == "success" and api.submits == 1


def test_the_trigger_kwargs_hold_no_credential(serve: Serve, connection: Conn) -> None:
    api, conn = api_and_conn(serve, connection)
    deferred = execute(job_operator(conn, headers={"X-Team": "data"}), MemoryStore())
    _, kwargs = deferred.trigger.serialize()
    text = json.dumps(kwargs)
    assert "s3cr3t-job-token" not in text and "X-Team" not in text
    assert api.server is not None
    submit = api.server.requests[0]
    assert submit.headers["Authorization"] == "Basic " + base64.b64encode(b"svc:s3cr3t-job-token").decode()
    assert submit.headers["X-Team"] == "data" and submit.headers["Idempotency-Key"]


# ------------------------------------------------------------------------------ example DAG
def test_the_example_dag_parses_without_a_network(monkeypatch: pytest.MonkeyPatch) -> None:
    import importlib.util
    import socket
    import sys

    from tests import REPO

    def no_network(*args: Any, **kwargs: Any) -> None:
        raise AssertionError("the example DAG opened a network connection at parse time")

    monkeypatch.setattr(socket.socket, "connect", no_network)
    spec = importlib.util.spec_from_file_location("example_http_job_dag", REPO / "dags" / "example_http_job.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, "example_http_job_dag", module)
    spec.loader.exec_module(module)
    jobs = [t for t in module.dag.tasks if isinstance(t, HttpJobOperator)]
    assert len(jobs) == 1 and jobs[0].deferrable and jobs[0].http_conn_id == "batch_api"
    assert [a["state"] for a in jobs[0]._acceptors] == ["failure", "retry", "success"]


# --------------------------------------------------------------------------- isolation
@pytest.mark.parametrize("fault", ["hang", "error"])
def test_one_hanging_or_failing_job_among_thirty_healthy_ones_delays_none_of_them(
    serve: Serve, connection: Conn, fault: str
) -> None:
    """30 jobs on one API (the one session, the one host's socket pool) beside 3 whose status
    answers 500, or holds every poll past ``request_timeout``.

    Each healthy job is polled exactly as often as it runs, with no retry, and all of them end
    before the first bad one gives up; the bad ones back off until their ``timeout``, end naming
    the error, and have their job cancelled once.
    """
    api = JobApi(runs_for=2)
    poisoned: set[str] = set()

    async def answer(seen: Seen) -> Any:
        parts = [part for part in seen.path.split("/") if part]
        if seen.method == "GET" and parts[:1] == ["jobs"] and len(parts) == 2 and parts[1] in poisoned:
            if fault == "hang":
                await asyncio.sleep(60)  # cancelled when the client gives up (handler_cancellation)
            return reply(500, {"error": "internal error"})
        return api.handler(seen)

    api.server = serve(answer)
    conn = connection("jobs_api", host="127.0.0.1", port=api.server.port, login="svc", password="s3cr3t-job-token")
    common = {"request_timeout": 0.5, "poll_interval": 0.05, "max_backoff": 0.5}
    healthy = [job_operator(conn, task_id=f"ok{i}", data={"sql": f"ok {i}"}, timeout=120, **common) for i in range(30)]
    bad = [job_operator(conn, task_id=f"bad{i}", data={"sql": f"bad {i}"}, timeout=6, **common) for i in range(3)]
    deferred = [execute(op, MemoryStore()) for op in [*healthy, *bad]]
    assert all(isinstance(d, TaskDeferred) for d in deferred)
    poisoned.update(api.job_of(f"bad {i}").id for i in range(3))
    ended: dict[int, float] = {}

    async def wait(index: int, trigger: Any) -> dict[str, Any]:
        payload = await run_trigger_payload(trigger, timeout=60)
        ended[index] = asyncio.get_running_loop().time()
        return payload

    async def every_wait() -> list[dict[str, Any]]:
        payloads = await asyncio.gather(*(wait(i, d.trigger) for i, d in enumerate(deferred)))  # type: ignore[union-attr]
        assert held_keys() == {}  # every lease of the loop given back, the bad waits' too
        return payloads

    payloads = asyncio.run(every_wait())

    ok, failed = payloads[: len(healthy)], payloads[len(healthy) :]
    assert [p["status"] for p in ok] == ["success"] * len(healthy), ok
    assert all(p["result"] == [{"n": n} for n in range(5)] for p in ok)
    for i in range(len(healthy)):
        job = api.job_of(f"ok {i}")
        status_polls = [s for s in api.server.requests if s.method == "GET" and s.path == f"/jobs/{job.id}"]
        assert len(status_polls) == 3, (job.id, len(status_polls))  # running, running, succeeded: no retry
    assert max(ended[i] for i in range(len(healthy))) < min(ended[i] for i in range(len(healthy), len(deferred)))
    error_type = "network" if fault == "hang" else "unavailable"
    for payload in failed:
        assert payload["status"] == "timeout", payload
        assert f"last transient error ({error_type})" in payload["message"], payload["message"]
    assert sorted(api.cancels) == sorted(("DELETE", job_id) for job_id in poisoned)
    assert api.submits == len(deferred) and api.created == len(deferred)
