"""HttpBatchReadyTrigger against real aiohttp servers: readiness, errors, backoff, auth, sharing.

Nothing here asserts an upper bound on time. Backoff is checked by counting requests and by the
server-side gaps between them, which can only be *longer* than the sleeps (sleeps never end
early); the fake clock variant checks the exact sleeps the trigger chose.
"""

from __future__ import annotations

import asyncio
import base64
import email.utils
import json
import threading
from collections.abc import Callable
from typing import Any

import pytest
import structlog
from aiohttp import web

import airflow_deferrable_kit.triggers.http as http_module
from airflow_deferrable_kit._http import responses
from airflow_deferrable_kit._http.client import SESSION_KEY, SESSION_LIMIT_PER_HOST
from airflow_deferrable_kit.connections import get_connection
from airflow_deferrable_kit.leases import held_keys
from airflow_deferrable_kit.payload import MAX_PAYLOAD_BYTES
from airflow_deferrable_kit.testing import FakeClock, run_trigger_payload, watch_blocking
from airflow_deferrable_kit.triggers.base import MIN_RETRY_DELAY, deadline_after
from airflow_deferrable_kit.triggers.http import HttpBatchReadyTrigger
from tests.integration.http import predicates
from tests.integration.http.conftest import Seen, Server, reply, script

READY = {"path": "state", "equals": "ready"}
Serve = Callable[..., Server]
Conn = Callable[..., str]


def acceptor(state: str, **sugar: Any) -> dict[str, Any]:
    """Canonical acceptor from sugar, as the sensor would build it."""
    from airflow_deferrable_kit.conditions import build_acceptors

    return build_acceptors(matchers=http_module.MATCHERS, **{state: [sugar]})[0]


def make(conn_id: str, **kwargs: Any) -> HttpBatchReadyTrigger:
    kwargs.setdefault("endpoint", "v1/batches/42/status")
    kwargs.setdefault("poll_interval", 0.05)
    kwargs.setdefault("max_backoff", 0.2)
    return HttpBatchReadyTrigger(http_conn_id=conn_id, **kwargs)


def api(serve: Serve, connection: Conn, handler: Any, **conn_fields: Any) -> tuple[Server, str]:
    server = serve(handler)
    conn_fields.setdefault("host", "127.0.0.1")
    return server, connection("batch_api", port=server.port, **conn_fields)


def states(*names: str) -> Any:
    return script(*[(lambda n=n: reply(200, {"state": n, "rows": 10})) for n in names])


# --------------------------------------------------------------------------- readiness
async def test_pending_then_ready_reports_what_decided(serve: Serve, connection: Conn) -> None:
    server, conn = api(serve, connection, states("pending", "pending", "ready"))
    trigger = make(
        conn,
        acceptors=[acceptor("failure", path="state", equals="failed"), acceptor("success", **READY)],
        query={"env": "prod", "tag": ["a", "b"], "dry": False},
        select=["rows", "missing"],
    )
    payload = await run_trigger_payload(trigger)
    assert payload["status"] == "success"
    assert payload["status_code"] == 200
    assert payload["url"] == f"http://127.0.0.1:{server.port}/v1/batches/42/status?env=prod&tag=a&tag=b&dry=false"
    assert payload["decision"] == {
        "state": "success",
        "matcher": "path",
        "argument": "state",
        "comparator": "equals",
        "expected": "ready",
        "actual": "ready",
    }
    assert payload["observed"] == {"path:state": "ready"}
    assert payload["fields"] == {"rows": 10, "missing": None}
    assert json.loads(payload["body_excerpt"]) == {"state": "ready", "rows": 10}
    assert len(server.requests) == 3
    assert server.requests[0].query == {"env": ["prod"], "tag": ["a", "b"], "dry": ["false"]}
    assert all(seen.path == "/v1/batches/42/status" for seen in server.requests)


async def test_failed_state_ends_the_wait_at_once_with_a_body_excerpt(serve: Serve, connection: Conn) -> None:
    server, conn = api(serve, connection, states("pending", "failed", "ready"))
    trigger = make(
        conn,
        acceptors=[acceptor("failure", path="state", **{"in": ["failed", "cancelled"]}), acceptor("success", **READY)],
    )
    payload = await run_trigger_payload(trigger)
    assert payload["status"] == "error"
    assert payload["error_type"] == "condition_failed"
    assert payload["decision"]["actual"] == "failed"
    assert payload["decision"]["state"] == "failure"
    assert '"failed"' in payload["body_excerpt"]
    assert "reported failure" in payload["message"] and '"state": "failed"' in payload["message"]
    assert len(server.requests) == 2  # never polled again after the failure


async def test_404_is_not_yet_by_default_then_ready(serve: Serve, connection: Conn) -> None:
    server, conn = api(
        serve, connection, script(lambda: reply(404, {"detail": "no such batch"}), lambda: reply(200, {"state": "x"}))
    )
    payload = await run_trigger_payload(make(conn))  # no acceptors: any 2xx is ready
    assert payload["status"] == "success"
    assert payload["decision"] == {"state": "success", "matcher": "default", "comparator": "2xx", "actual": 200}
    assert len(server.requests) == 2


async def test_configurable_not_yet_codes(serve: Serve, connection: Conn) -> None:
    server, conn = api(serve, connection, script(lambda: reply(202), lambda: reply(404)))
    payload = await run_trigger_payload(make(conn, not_yet_codes=[202]))
    # 202 is "not yet" as configured; 404 no longer is, so like any other 4xx it is fatal.
    assert payload["status"] == "error"
    assert payload["error_type"] == "not_found"
    assert len(server.requests) == 2


async def test_status_acceptor_decides_before_the_body_is_needed(serve: Serve, connection: Conn) -> None:
    _, conn = api(serve, connection, script(lambda: reply(202), lambda: reply(204)))
    trigger = make(
        conn,
        not_yet_codes=[202],
        acceptors=[acceptor("success", status=204), acceptor("success", **READY)],
    )
    payload = await run_trigger_payload(trigger)
    assert payload["status"] == "success"
    assert payload["decision"]["matcher"] == "status"
    assert payload["body_excerpt"] == ""


async def test_path_acceptors_never_look_at_error_bodies(serve: Serve, connection: Conn) -> None:
    # A 503 body without "pending" must not satisfy "ready once 'pending' is gone".
    server, conn = api(serve, connection, script(lambda: reply(503, "<html>down</html>"), lambda: reply(200, {})))
    trigger = make(conn, acceptors=[acceptor("success", path="pending", exists=False)])
    payload = await run_trigger_payload(trigger)
    assert payload["status"] == "success"
    assert payload["status_code"] == 200
    assert len(server.requests) == 2


async def test_post_with_json_body(serve: Serve, connection: Conn) -> None:
    server, conn = api(serve, connection, states("ready"))
    payload = await run_trigger_payload(
        make(
            conn,
            method="post",
            json_body={"batch": "2024-01-01", "ids": [1, 2]},
            acceptors=[acceptor("success", **READY)],
        )
    )
    assert payload["method"] == "POST"
    assert server.requests[0].method == "POST"
    assert json.loads(server.requests[0].body) == {"batch": "2024-01-01", "ids": [1, 2]}
    assert server.requests[0].headers["Content-Type"].startswith("application/json")


# ------------------------------------------------------------------------------ bodies
async def test_non_json_body_with_path_acceptors_is_fatal_after_a_few_in_a_row_and_says_why(
    serve: Serve, connection: Conn
) -> None:
    server, conn = api(
        serve, connection, script(lambda: reply(200, "<html>login page</html>", headers={"Content-Type": "text/html"}))
    )
    payload = await run_trigger_payload(make(conn, acceptors=[acceptor("success", **READY)]))
    assert payload["status"] == "error"
    assert payload["error_type"] == "protocol"
    assert "not JSON" in payload["message"] and "text/html" in payload["message"]
    assert f"{http_module.MAX_UNREADABLE_BODIES} answers in a row" in payload["message"]
    assert payload["body_excerpt"] == "<html>login page</html>"
    assert len(server.requests) == http_module.MAX_UNREADABLE_BODIES


async def test_a_few_non_json_bodies_are_not_yet_and_json_resets_the_count(serve: Serve, connection: Conn) -> None:
    # A proxy's HTML page during a deploy: one short of the limit, then JSON again (the count
    # starts over), one short again, then ready.
    page = lambda: reply(200, "<html>deploying</html>", headers={"Content-Type": "text/html"})  # noqa: E731
    short = http_module.MAX_UNREADABLE_BODIES - 1
    steps = [page] * short + [lambda: reply(200, {"state": "pending"})] + [page] * short
    server, conn = api(serve, connection, script(*steps, lambda: reply(200, {"state": "ready"})))
    with structlog.testing.capture_logs() as logs:
        payload = await run_trigger_payload(make(conn, acceptors=[acceptor("success", **READY)]))
    assert payload["status"] == "success"
    assert len(server.requests) == 2 * short + 2
    warnings = [str(e["event"]) for e in logs if e["log_level"] == "warning" and "not JSON" in str(e["event"])]
    assert len(warnings) == 2 * short
    assert "taken as not yet" in warnings[0]


async def test_non_json_body_is_fine_when_only_status_matters(serve: Serve, connection: Conn) -> None:
    _, conn = api(serve, connection, script(lambda: reply(200, "OK ready")))
    payload = await run_trigger_payload(make(conn))
    assert payload["status"] == "success"
    assert payload["body_excerpt"] == "OK ready"


async def test_huge_body_is_capped_in_the_payload(serve: Serve, connection: Conn) -> None:
    huge = ("x" * 1023 + "\n") * 5 * 1024  # 5 MiB
    _, conn = api(serve, connection, script(lambda: reply(200, huge)))
    payload = await run_trigger_payload(make(conn, excerpt_chars=500))
    assert payload["status"] == "success"
    assert payload["body_excerpt"].startswith("x" * 500 + "...")
    assert "not read to the end" in payload["body_excerpt"]
    assert len(json.dumps(payload)) < 2000 < MAX_PAYLOAD_BYTES


async def test_huge_body_cannot_be_evaluated_as_json(serve: Serve, connection: Conn) -> None:
    huge = {"state": "ready", "rows": list(range(400_000))}  # ~2.7 MB of JSON
    _, conn = api(serve, connection, script(lambda: reply(200, huge)))
    payload = await run_trigger_payload(make(conn, acceptors=[acceptor("success", **READY)]))
    assert payload["status"] == "error"
    assert payload["error_type"] == "bad_configuration"
    assert "max_body_bytes=1048576" in payload["message"]
    assert len(json.dumps(payload)) < MAX_PAYLOAD_BYTES


async def test_large_json_is_parsed_off_the_loop_and_big_values_are_capped(
    serve: Serve, connection: Conn, monkeypatch: pytest.MonkeyPatch
) -> None:
    big = {"state": "ready", "rows": list(range(100_000))}  # ~590 KB of JSON
    _, conn = api(serve, connection, script(lambda: reply(200, big)))
    parsed_on: list[tuple[str, int]] = []
    real_loads = json.loads

    def spy(text: Any, *args: Any, **kwargs: Any) -> Any:
        parsed_on.append((threading.current_thread().name, len(text)))
        return real_loads(text, *args, **kwargs)

    monkeypatch.setattr(responses.json, "loads", spy)
    payload = await run_trigger_payload(
        make(conn, acceptors=[acceptor("success", **READY)], select=["rows", "rows[-1]"])
    )
    monkeypatch.undo()
    assert payload["status"] == "success"
    big_parses = [name for name, size in parsed_on if size > responses.THREAD_PARSE_BYTES]
    assert big_parses and threading.main_thread().name not in big_parses
    assert payload["fields"]["rows[-1]"] == 99_999
    assert isinstance(payload["fields"]["rows"], str) and "more characters" in payload["fields"]["rows"]
    assert len(json.dumps(payload)) < MAX_PAYLOAD_BYTES


# ------------------------------------------------------------------------------ errors
@pytest.mark.parametrize("code", [401, 403])
async def test_401_and_403_are_fatal_after_one_request(serve: Serve, connection: Conn, code: int) -> None:
    server, conn = api(serve, connection, script(lambda: reply(code, {"error": "denied"})))
    payload = await run_trigger_payload(make(conn))
    assert payload["status"] == "error"
    assert payload["error_type"] == {401: "authentication", 403: "authorization"}[code]
    assert payload["status_code"] == code
    assert '"denied"' in payload["body_excerpt"]
    assert payload["message"].startswith(f"http_conn_id={conn!r}: the server "), payload["message"]  # names it
    assert len(server.requests) == 1


async def test_503_storm_backs_off_until_the_deadline(serve: Serve, connection: Conn) -> None:
    server, conn = api(serve, connection, script(lambda: reply(503, "busy")))
    trigger = make(conn, deadline=deadline_after(1.5))
    payload = await run_trigger_payload(trigger)
    assert payload["status"] == "timeout"
    assert "last response: 503 Service Unavailable" in payload["message"]
    count = len(server.requests)
    floor = min(MIN_RETRY_DELAY, trigger.poll_interval)
    # Every retry slept at least `floor` first, so 1.5 s can hold at most 1 + 1.5 / floor requests
    # (the official trigger sent ~1,900 in 3 s).
    assert 2 <= count <= 1 + int(1.5 / floor)
    assert all(gap >= floor - 0.005 for gap in server.gaps()), server.gaps()


async def test_429_retry_after_is_honoured(serve: Serve, connection: Conn) -> None:
    server, conn = api(
        serve,
        connection,
        script(
            lambda: reply(429, headers={"Retry-After": "1"}),
            lambda: reply(429, headers={"Retry-After": "1"}),
            lambda: reply(200, {"state": "ready"}),
        ),
    )
    payload = await run_trigger_payload(make(conn))
    assert payload["status"] == "success"
    assert len(server.requests) == 3
    assert all(gap >= 1.0 - 0.01 for gap in server.gaps()), server.gaps()


async def test_every_request_but_the_first_follows_a_sleep(serve: Serve, connection: Conn) -> None:
    clock = FakeClock()

    def http_date_in_two_minutes() -> web.Response:
        return reply(503, headers={"Retry-After": email.utils.formatdate(int(clock.now) + 120, usegmt=True)})

    server, conn = api(
        serve,
        connection,
        script(
            lambda: reply(503),
            lambda: reply(429, headers={"Retry-After": "7"}),
            http_date_in_two_minutes,
            lambda: reply(404),
            lambda: reply(202, headers={"Retry-After": "30"}),
            lambda: reply(200, {"state": "pending"}),
            lambda: reply(200, {"state": "ready"}),
        ),
    )
    trigger = make(conn, not_yet_codes=[404, 202], acceptors=[acceptor("success", **READY)])
    trigger.clock = clock  # type: ignore[misc]
    payload = await run_trigger_payload(trigger)
    assert payload["status"] == "success"
    assert len(server.requests) == 7
    assert len(clock.sleeps) == 6  # one sleep before every request but the first
    assert clock.sleeps[0] >= min(MIN_RETRY_DELAY, 0.05)  # plain 503: at least the backoff floor
    assert clock.sleeps[1] == 7  # 429 Retry-After in seconds (the jittered backoff is below it)
    assert 119 < clock.sleeps[2] <= 120  # 503 Retry-After as an HTTP-date
    assert 0 < clock.sleeps[3] <= 0.05  # 404: healthy "not yet", the first poll interval (random phase)
    assert clock.sleeps[4] == 30  # 202 "not yet" with Retry-After
    assert clock.sleeps[5] == pytest.approx(0.05)


async def test_connection_refused_until_the_server_comes_up(serve: Serve, connection: Conn, unused_port: int) -> None:
    conn = connection("batch_api", host="127.0.0.1", port=unused_port)
    trigger = make(conn, acceptors=[acceptor("success", **READY)])
    task = asyncio.ensure_future(run_trigger_payload(trigger))
    await asyncio.sleep(0.6)
    assert not task.done()  # refused connections are transient: still waiting
    server = await asyncio.to_thread(serve, states("ready"), port=unused_port)
    payload = await task
    assert payload["status"] == "success"
    assert len(server.requests) == 1


async def test_request_timeout_is_transient(serve: Serve, connection: Conn) -> None:
    async def handler(seen: Seen) -> web.Response:
        if seen.index == 0:
            await asyncio.sleep(5)  # cancelled when the client gives up (handler_cancellation)
        return reply(200, {"state": "ready"})

    server, conn = api(serve, connection, handler)
    payload = await run_trigger_payload(make(conn, request_timeout=0.5))
    assert payload["status"] == "success"
    assert len(server.requests) >= 2  # the first request timed out and was retried


async def test_unknown_connection_is_fatal() -> None:
    payload = await run_trigger_payload(make("no_such_http_conn"))
    assert payload["status"] == "error"
    assert payload["error_type"] == "connection_not_found"


# --------------------------------------------------------------------------- predicates
async def test_sync_predicate_runs_off_the_loop(serve: Serve, connection: Conn) -> None:
    server, conn = api(serve, connection, script(lambda: reply(200, {"count": 3}), lambda: reply(200, {"count": 4})))
    predicates.SYNC_THREADS.clear()
    payload = await run_trigger_payload(make(conn, predicate="tests.integration.http.predicates:even_count_ready"))
    assert payload["status"] == "success"
    assert payload["decision"] == {
        "state": "success",
        "matcher": "predicate",
        "argument": "tests.integration.http.predicates:even_count_ready",
        "returned": "True",
    }
    assert len(server.requests) == 2
    assert predicates.SYNC_THREADS and "MainThread" not in predicates.SYNC_THREADS


async def test_async_predicate_can_fail_the_wait(serve: Serve, connection: Conn) -> None:
    server, conn = api(
        serve,
        connection,
        script(
            lambda: reply(200, "", headers={"X-Batch": "busy"}), lambda: reply(200, "", headers={"X-Batch": "broken"})
        ),
    )
    payload = await run_trigger_payload(make(conn, predicate="tests.integration.http.predicates.header_says"))
    assert payload["error_type"] == "condition_failed"
    assert "returned 'failure'" in payload["message"]
    assert len(server.requests) == 2


async def test_a_crashing_predicate_is_a_clear_fatal_error(serve: Serve, connection: Conn) -> None:
    _, conn = api(serve, connection, states("ready"))
    payload = await run_trigger_payload(make(conn, predicate="tests.integration.http.predicates:explodes"))
    assert payload["error_type"] == "predicate_error"
    assert "predicate bug" in payload["message"]


# --------------------------------------------------------------------------------- auth
SECRET = "s3cr3t-pa55word"
TOKEN = "tok-0123456789abcdef"


def _assert_secret_free(trigger: HttpBatchReadyTrigger, payload: dict[str, Any], *secrets: str) -> None:
    text = json.dumps(trigger.serialize()) + json.dumps(payload)
    for secret in secrets:
        assert secret not in text
        assert base64.b64encode(secret.encode()).decode() not in text


@pytest.mark.parametrize(
    ("fields", "expected"),
    [
        ({"login": "etl", "password": SECRET}, "Basic " + base64.b64encode(f"etl:{SECRET}".encode()).decode()),
        ({"extra": {"bearer_token": TOKEN}}, f"Bearer {TOKEN}"),
        ({"password": TOKEN, "extra": {"auth_type": "bearer"}}, f"Bearer {TOKEN}"),
        (
            {"login": "etl", "password": SECRET, "extra": {"Authorization": "Token other"}},
            "Basic " + base64.b64encode(f"etl:{SECRET}".encode()).decode(),
        ),
    ],
    ids=["basic", "bearer-extra", "bearer-password", "login-beats-extra-authorization"],
)
async def test_auth_header_reaches_the_server_but_never_the_kwargs(
    serve: Serve, connection: Conn, fields: dict[str, Any], expected: str
) -> None:
    server, conn = api(serve, connection, states("ready"), **fields)
    trigger = make(conn)
    payload = await run_trigger_payload(trigger)
    assert payload["status"] == "success"
    assert server.requests[0].headers["Authorization"] == expected
    _assert_secret_free(trigger, payload, SECRET, TOKEN)


async def test_credentials_in_the_host_url_are_basic_auth_and_leave_the_payload_url(
    serve: Serve, connection: Conn
) -> None:
    server = serve(states("ready"))
    conn = connection("batch_api", host=f"http://etl:{SECRET}@127.0.0.1:{server.port}/api")
    trigger = make(conn, endpoint="/status")
    payload = await run_trigger_payload(trigger)
    assert server.requests[0].path == "/api/status"
    assert server.requests[0].headers["Authorization"] == "Basic " + base64.b64encode(f"etl:{SECRET}".encode()).decode()
    assert payload["url"] == f"http://127.0.0.1:{server.port}/api/status"
    _assert_secret_free(trigger, payload, SECRET)


async def test_extra_headers_from_the_connection(serve: Serve, connection: Conn) -> None:
    server, conn = api(
        serve,
        connection,
        states("ready"),
        extra={"X-Api-Key": SECRET, "headers": {"X-Team": "data", "X-Retries": 3}, "timeout": 10, "verify": True},
    )
    trigger = make(conn)
    payload = await run_trigger_payload(trigger)
    headers = server.requests[0].headers
    assert (headers["X-Api-Key"], headers["X-Team"], headers["X-Retries"]) == (SECRET, "data", "3")
    assert "timeout" not in {name.lower() for name in headers} and "verify" not in {n.lower() for n in headers}
    assert "Authorization" not in headers
    _assert_secret_free(trigger, payload, SECRET)


async def test_unsupported_auth_type_is_a_clear_fatal_error(serve: Serve, connection: Conn) -> None:
    server, conn = api(serve, connection, states("ready"), extra={"auth_type": "requests_kerberos.HTTPKerberosAuth"})
    payload = await run_trigger_payload(make(conn))
    assert payload["error_type"] == "bad_connection"
    assert "auth_type" in payload["message"]
    assert server.requests == []


async def test_requests_go_through_the_connection_proxy(serve: Serve, connection: Conn) -> None:
    proxy = serve(states("ready"))
    conn = connection(
        "via_proxy",
        host="http://batches.invalid",
        extra={"proxy": f"http://proxyuser:{TOKEN}@127.0.0.1:{proxy.port}"},
    )
    trigger = make(conn, endpoint="v1/x")
    payload = await run_trigger_payload(trigger)
    assert payload["status"] == "success"
    seen = proxy.requests[0]
    assert seen.target == "http://batches.invalid/v1/x"  # absolute form: the request was sent to a proxy
    assert seen.headers["Proxy-Authorization"] == "Basic " + base64.b64encode(f"proxyuser:{TOKEN}".encode()).decode()
    assert payload["url"] == "http://batches.invalid/v1/x"
    _assert_secret_free(trigger, payload, TOKEN)


# ---------------------------------------------------------------------------------- TLS
async def test_tls_verification(serve: Serve, connection: Conn, tls: Any) -> None:
    server = serve(states("ready"), ssl_context=tls.server_context())
    connection("tls_default", host="127.0.0.1", schema="https", port=server.port)
    connection("tls_insecure", host=f"https://127.0.0.1:{server.port}", extra={"verify": False})
    connection("tls_ca", host=f"https://127.0.0.1:{server.port}", extra={"verify": str(tls.cert)})
    rejected = await run_trigger_payload(make("tls_default"))
    assert rejected["error_type"] == "tls"
    assert (await run_trigger_payload(make("tls_insecure")))["status"] == "success"
    ok = await run_trigger_payload(make("tls_ca"))
    assert ok["status"] == "success" and ok["url"].startswith("https://")
    assert len(server.requests) == 2


# ------------------------------------------------------------------------------ sharing
async def test_one_session_and_few_sockets_for_many_triggers(
    serve: Serve, connection: Conn, monkeypatch: pytest.MonkeyPatch
) -> None:
    polls: dict[str, int] = {}

    def handler(seen: Seen) -> web.Response:
        polls[seen.path] = polls.get(seen.path, 0) + 1
        return reply(200, {"state": "ready" if polls[seen.path] >= 3 else "pending"})

    server, conn = api(serve, connection, handler)
    opened: list[Any] = []
    real_open = http_module.open_session

    async def counting_open(options: Any) -> Any:
        session = await real_open(options)
        opened.append(session)
        return session

    monkeypatch.setattr(http_module, "open_session", counting_open)
    n = 200
    triggers = [make(conn, endpoint=f"v1/batches/{i}", acceptors=[acceptor("success", **READY)]) for i in range(n)]
    tasks = [asyncio.ensure_future(run_trigger_payload(t)) for t in triggers]
    peak = 0
    while not all(task.done() for task in tasks):
        peak = max(peak, held_keys().get(SESSION_KEY, 0))
        await asyncio.sleep(0.01)
    payloads = await asyncio.gather(*tasks)
    assert [p["status"] for p in payloads] == ["success"] * n
    assert len(server.requests) == 3 * n
    assert peak > 1  # many triggers held a lease on the same session at once...
    assert len(opened) == 1  # ...and only one ClientSession was ever made
    assert len(server.client_ports) <= SESSION_LIMIT_PER_HOST  # pooled keep-alive sockets, not one per wait
    assert SESSION_KEY not in held_keys()  # released and closed after the last trigger
    assert opened[0].closed


async def test_many_triggers_never_block_the_loop(serve: Serve, connection: Conn, blocking_calls: Any) -> None:
    _, conn = api(serve, connection, states("pending", "ready"), login="etl", password=SECRET, extra={"X-A": "1"})
    # Airflow's first connection lookup imports its own modules on the loop: not ours, so warm it.
    await get_connection(conn)
    triggers = [make(conn, endpoint=f"v1/batches/{i}", acceptors=[acceptor("success", **READY)]) for i in range(20)]
    # Two checks. The audit is the strict, deterministic one: no synchronous disk, DNS, sleep or
    # import call on the loop from package code, however short. The slow-callback report is a
    # backstop for gross blocking; its threshold is far above any step of ours (~10 ms) because
    # on two shared, loaded cores the OS alone can pause a healthy callback for a few hundred ms.
    with blocking_calls() as calls, watch_blocking(1.0) as blocked:
        payloads = await asyncio.gather(*(run_trigger_payload(t) for t in triggers))
    assert {p["status"] for p in payloads} == {"success"}
    assert calls == []
    assert blocked == []


async def test_the_blocking_audit_catches_a_blocking_call(blocking_calls: Any) -> None:
    """The audit above is not vacuous: importing a module on the loop from package code is caught."""
    import sys

    from airflow_deferrable_kit.conditions import import_predicate

    sys.modules.pop("tabnanny", None)
    with blocking_calls() as calls:
        import_predicate("tabnanny:check")
    assert any(event == "open" and "tabnanny" in args for event, args, _ in calls)


async def test_cancel_releases_the_shared_session(serve: Serve, connection: Conn) -> None:
    server, conn = api(serve, connection, states("pending"))
    trigger = make(conn, acceptors=[acceptor("success", **READY)])
    events = trigger.run()
    task = asyncio.ensure_future(events.__anext__())
    while len(server.requests) < 2:  # noqa: ASYNC110 - the server runs in another thread
        await asyncio.sleep(0.02)
    assert held_keys().get(SESSION_KEY) == 1
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    await trigger.cleanup()
    assert SESSION_KEY not in held_keys()
