"""The batch API of the compose examples and the demo (scripts/batch_api.py), served for real.

Served on 127.0.0.1 with aiohttp's TestServer (port 0) or, for the command line, as the process
the compose file runs. The last tests drive the kit's HTTP trigger through the ``batch_api``
connection exactly as docker-compose.yaml defines it (only host and port changed).
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import urllib.error
import urllib.request
from collections.abc import AsyncIterator, Callable
from typing import Any

import aiohttp
import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer

from airflow_deferrable_kit.conditions import build_acceptors
from airflow_deferrable_kit.testing import run_trigger_payload
from airflow_deferrable_kit.triggers.http import MATCHERS, HttpBatchReadyTrigger
from scripts import batch_api
from scripts.batch_api import make_app
from scripts.services import free_port, wait_for_port
from tests.release.compose_file import REPO, connections, environment, load_compose, option_value

TOKEN = "test-token-0b1f"


Listener = Callable[[web.Request, web.StreamResponse], None]


class Api:
    """A running batch API, a client session bound to it, and every response it sent."""

    def __init__(self, app: web.Application) -> None:
        self.server = TestServer(app, host="127.0.0.1", port=0)
        self.session = aiohttp.ClientSession()
        self.responses: list[tuple[str, str, int]] = []
        self.listeners: list[Listener] = []
        # Signals freeze when the app starts: register the one hook now, fan out to listeners.
        app.on_response_prepare.append(self._record)

    async def _record(self, request: web.Request, response: web.StreamResponse) -> None:
        self.responses.append((request.method, request.path, response.status))
        for listener in self.listeners:
            listener(request, response)

    @property
    def base(self) -> str:
        return f"http://127.0.0.1:{self.server.port}"

    async def call(
        self, method: str, path: str, body: Any = None, *, token: str | None = TOKEN, raw: bytes | None = None
    ) -> tuple[int, Any]:
        headers = {"Authorization": f"Bearer {token}"} if token is not None else {}
        data = raw if raw is not None else (None if body is None else json.dumps(body).encode())
        async with self.session.request(method, self.base + path, data=data, headers=headers) as resp:
            text = await resp.text()
            return resp.status, (json.loads(text) if text else None)

    async def close(self) -> None:
        await self.session.close()
        await self.server.close()


async def serve(token: str | None) -> Api:
    api = Api(make_app(token, report_retry_after=1))
    await api.server.start_server()
    return api


@pytest.fixture
async def api() -> AsyncIterator[Api]:
    client = await serve(TOKEN)
    try:
        yield client
    finally:
        await client.close()


# ------------------------------------------------------------------------------ the API
async def test_unknown_batch_is_404(api: Api) -> None:
    status, body = await api.call("GET", "/v1/batches/2024-01-01/status")
    assert status == 404
    assert body == {"error": "unknown batch", "batch_id": "2024-01-01"}


async def test_pending_then_ready(api: Api) -> None:
    status, created = await api.call("PUT", "/v1/batches/b1", {})
    assert status == 201
    assert created["state"] == "pending" and created["rows"] is None
    status, body = await api.call("GET", "/v1/batches/b1/status")
    assert (status, body["batch_id"], body["state"], body["rows"]) == (200, "b1", "pending", None)

    status, updated = await api.call("PUT", "/v1/batches/b1", {"state": "ready", "rows": 42})
    assert status == 200
    status, body = await api.call("GET", "/v1/batches/b1/status")
    assert status == 200
    assert body == {
        "batch_id": "b1",
        "state": "ready",
        "rows": 42,
        "message": None,
        "updated_at": updated["updated_at"],
    }
    assert body["updated_at"] >= created["updated_at"]


async def test_failed_with_a_message_and_partial_updates(api: Api) -> None:
    await api.call("PUT", "/v1/batches/b2", {"state": "pending", "rows": 7})
    status, body = await api.call("PUT", "/v1/batches/b2", {"state": "failed", "message": "upstream export crashed"})
    assert status == 200
    # Fields not given keep their value.
    assert (body["state"], body["rows"], body["message"]) == ("failed", 7, "upstream export crashed")
    status, body = await api.call("PUT", "/v1/batches/b2", {"rows": None, "message": None})
    assert (body["state"], body["rows"], body["message"]) == ("failed", None, None)


async def test_list_and_delete(api: Api) -> None:
    await api.call("PUT", "/v1/batches/a", {"state": "ready", "rows": 1})
    await api.call("PUT", "/v1/batches/b", {})
    status, body = await api.call("GET", "/v1/batches")
    assert status == 200 and [b["batch_id"] for b in body["batches"]] == ["a", "b"]
    status, _ = await api.call("DELETE", "/v1/batches/a")
    assert status == 204
    assert (await api.call("GET", "/v1/batches/a/status"))[0] == 404
    assert (await api.call("DELETE", "/v1/batches/a"))[0] == 404


@pytest.mark.parametrize(
    ("body", "raw", "reason"),
    [
        ({"state": "done"}, None, "state must be one of pending, ready, failed"),
        ({"rows": -1}, None, "rows must be an integer >= 0"),
        ({"rows": True}, None, "rows must be an integer >= 0"),
        ({"rows": "42"}, None, "rows must be an integer >= 0"),
        ({"message": 5}, None, "message must be a string"),
        ({"state": "ready", "colour": "red"}, None, "unknown field(s) colour"),
        ([1, 2], None, "the body must be a JSON object"),
        (None, b"{not json", "body is not valid JSON"),
    ],
)
async def test_bad_updates_are_rejected_and_change_nothing(api: Api, body: Any, raw: bytes | None, reason: str) -> None:
    await api.call("PUT", "/v1/batches/b3", {"state": "pending", "rows": 3})
    status, error = await api.call("PUT", "/v1/batches/b3", body, raw=raw)
    assert status == 400
    assert reason in error["error"]
    _, after = await api.call("GET", "/v1/batches/b3/status")
    assert (after["state"], after["rows"]) == ("pending", 3)


async def test_overlong_batch_id_is_rejected(api: Api) -> None:
    status, body = await api.call("GET", "/v1/batches/" + "x" * 201 + "/status")
    assert status == 400 and "longer than 200" in body["error"]


@pytest.mark.parametrize(
    "header",
    [None, "Bearer wrong-token", f"Basic {TOKEN}", f"Bearer {TOKEN}x", "Bearer"],
)
async def test_wrong_or_missing_token_is_401_everywhere_under_v1(api: Api, header: str | None) -> None:
    headers = {"Authorization": header} if header is not None else {}
    for method, path, body in [
        ("GET", "/v1/batches/b4/status", None),
        ("PUT", "/v1/batches/b4", {"state": "ready"}),
        ("GET", "/v1/batches", None),
        ("DELETE", "/v1/batches/b4", None),
    ]:
        data = None if body is None else json.dumps(body).encode()
        async with api.session.request(method, api.base + path, data=data, headers=headers) as resp:
            assert resp.status == 401, (method, path)
            assert resp.headers["WWW-Authenticate"] == 'Bearer realm="batch-api"'
            assert (await resp.json()) == {"error": "missing or invalid bearer token"}
    # The rejected PUT did not create the batch.
    assert (await api.call("GET", "/v1/batches/b4/status"))[0] == 404


async def test_health_needs_no_token(api: Api) -> None:
    status, body = await api.call("GET", "/healthz", token=None)
    assert (status, body) == (200, {"status": "ok"})


async def test_without_a_token_there_is_no_auth() -> None:
    client = await serve(None)
    try:
        status, _ = await client.call("PUT", "/v1/batches/open", {"state": "ready"}, token=None)
        assert status == 201
        status, body = await client.call("GET", "/v1/batches/open/status", token="anything")
        assert (status, body["state"]) == (200, "ready")
    finally:
        await client.close()


async def test_summary_only_when_asked_for(api: Api) -> None:
    await api.call("PUT", "/v1/batches/s", {"state": "ready", "summary": {"files": 2}})
    _, plain = await api.call("GET", "/v1/batches/s/status")
    assert "summary" not in plain
    _, detailed = await api.call("GET", "/v1/batches/s/status?include=rows,summary")
    assert detailed["summary"] == {"files": 2}
    status, error = await api.call("PUT", "/v1/batches/s", {"summary": [1]})
    assert (status, error["error"]) == (400, "summary must be a JSON object or null")


async def test_exports_publish_and_unpublish(api: Api) -> None:
    assert (await api.call("GET", "/v1/exports/2024-01-01"))[0] == 404
    status, body = await api.call("PUT", "/v1/exports/2024-01-01", {"files": 4})
    assert (status, body["published"], body["files"]) == (201, True, 4)
    assert (await api.call("PUT", "/v1/exports/2024-01-01"))[0] == 200
    async with api.session.head(api.base + "/v1/exports/2024-01-01", headers={"Authorization": f"Bearer {TOKEN}"}) as r:
        assert r.status == 200
    assert (await api.call("PUT", "/v1/exports/x", {"files": -1}))[0] == 400
    assert (await api.call("DELETE", "/v1/exports/2024-01-01"))[0] == 204
    assert (await api.call("GET", "/v1/exports/2024-01-01"))[0] == 404


async def test_reports_answer_404_202_200_422(api: Api) -> None:
    query = {"report": "daily_revenue", "date": "2024-01-01"}
    status, body = await api.call("POST", "/v1/reports/query", query)
    assert (status, body["error"]) == (404, "unknown report")
    assert (await api.call("PUT", "/v1/reports/daily_revenue/2024-01-01", {"state": "running"}))[0] == 201
    async with api.session.post(
        api.base + "/v1/reports/query", json=query, headers={"Authorization": f"Bearer {TOKEN}"}
    ) as resp:
        assert (resp.status, resp.headers["Retry-After"]) == (202, "1")
    await api.call("PUT", "/v1/reports/daily_revenue/2024-01-01", {"state": "done", "rows": 12})
    status, body = await api.call("POST", "/v1/reports/query", query)
    assert (status, body["state"], body["rows"]) == (200, "done", 12)
    await api.call("PUT", "/v1/reports/daily_revenue/2024-01-01", {"state": "failed", "message": "bad input"})
    status, body = await api.call("POST", "/v1/reports/query", query)
    assert (status, body["message"]) == (422, "bad input")
    assert (await api.call("POST", "/v1/reports/query", {"report": "x"}))[0] == 400
    assert (await api.call("PUT", "/v1/reports/x/2024-01-01", {"rows": 1}))[0] == 400


def test_validate_update_is_importable_and_strict() -> None:
    assert batch_api.validate_update({"state": "ready", "rows": 0}) == {"state": "ready", "rows": 0}
    with pytest.raises(ValueError, match="rows"):
        batch_api.validate_update({"rows": 1.5})


# ------------------------------------------------------------------------- command line
def _request(url: str, *, method: str = "GET", body: Any = None, token: str | None = None) -> tuple[int, Any]:
    headers = {"Content-Type": "application/json"}
    if token:
        headers["Authorization"] = f"Bearer {token}"
    data = None if body is None else json.dumps(body).encode()
    request = urllib.request.Request(url, data=data, method=method, headers=headers)
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            return response.status, json.loads(response.read() or b"null")
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read() or b"null")


def test_runs_from_the_command_line_with_the_token_from_the_environment() -> None:
    """``python scripts/batch_api.py --host 127.0.0.1 --port N``, as the compose service runs it."""
    port = free_port()
    env = {**os.environ, "BATCH_API_TOKEN": TOKEN}
    proc = subprocess.Popen(
        [sys.executable, str(REPO / "scripts" / "batch_api.py"), "--host", "127.0.0.1", "--port", str(port)],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    try:
        wait_for_port(port, timeout=30, proc=proc, what="batch_api.py")
        base = f"http://127.0.0.1:{port}"
        assert _request(f"{base}/healthz") == (200, {"status": "ok"})
        assert _request(f"{base}/v1/batches/cli/status")[0] == 401
        assert (
            _request(f"{base}/v1/batches/cli", method="PUT", body={"state": "ready", "rows": 5}, token=TOKEN)[0] == 201
        )
        status, body = _request(f"{base}/v1/batches/cli/status", token=TOKEN)
        assert (status, body["state"], body["rows"]) == (200, "ready", 5)
    finally:
        proc.terminate()
        output, _ = proc.communicate(timeout=30)
    assert proc.returncode == 0, output.decode(errors="replace")
    assert f"batch API on http://127.0.0.1:{port} (bearer token required)" in output.decode()


# ----------------------------------------------- the compose connection + the HTTP trigger
@pytest.fixture
def compose_connection(monkeypatch: pytest.MonkeyPatch) -> Callable[[int], str]:
    """Define ``batch_api`` as docker-compose.yaml does, pointed at 127.0.0.1:<port>."""

    def define(port: int, **changes: Any) -> str:
        services = load_compose({"ADK_BATCH_API_TOKEN": TOKEN})["services"]
        conn = connections(services["triggerer-1"])["batch_api"]
        assert conn["password"] == TOKEN
        conn.update(host="127.0.0.1", port=port, **changes)
        monkeypatch.setenv("AIRFLOW_CONN_BATCH_API", json.dumps(conn))
        return "batch_api"

    return define


def trigger(conn_id: str, **options: Any) -> HttpBatchReadyTrigger:
    """An HTTP wait as the sensor builds it: conditions as canonical acceptors, fast polls."""
    groups = {name: options.pop(name) for name in ("success", "failure") if name in options}
    options["acceptors"] = build_acceptors(matchers=MATCHERS, **groups)
    options.setdefault("poll_interval", 0.05)
    options.setdefault("max_backoff", 0.2)
    options["http_conn_id"] = conn_id
    return HttpBatchReadyTrigger(**options)


def batch_ready(conn_id: str, ds: str) -> HttpBatchReadyTrigger:
    """The first wait of dags/example_http.py (``ds`` rendered)."""
    return trigger(
        conn_id,
        endpoint=f"v1/batches/{ds}/status",
        query={"include": "summary"},
        success=[{"path": "state", "equals": "ready"}],
        failure=[{"path": "state", "in": ["failed", "cancelled"]}],
        select=["rows", "summary.files"],
    )


def test_compose_service_command_matches_the_script() -> None:
    services = load_compose()["services"]
    service = services["batch-api"]
    command = service["command"]
    script = command[0]
    mounted = {v.split(":")[1]: v.split(":")[0] for v in service["volumes"]}
    assert (REPO / mounted[script]).resolve() == (REPO / "scripts" / "batch_api.py").resolve()
    assert option_value(command, "--host") == "0.0.0.0"  # reachable from the other containers
    assert environment(service)["BATCH_API_TOKEN"] == connections(services["scheduler"])["batch_api"]["password"]


async def test_http_trigger_waits_through_pending_until_ready(api: Api, compose_connection: Callable[..., str]) -> None:
    conn_id = compose_connection(api.server.port)
    await api.call("PUT", "/v1/batches/2024-01-01", {"state": "pending"})
    seen_pending = asyncio.Event()

    def on_pending(request: web.Request, response: web.StreamResponse) -> None:
        if request.path.endswith("/status") and response.status == 200:
            seen_pending.set()

    api.listeners.append(on_pending)
    waiting = asyncio.ensure_future(run_trigger_payload(batch_ready(conn_id, "2024-01-01")))
    await asyncio.wait_for(seen_pending.wait(), 30)
    assert not waiting.done()
    await api.call("PUT", "/v1/batches/2024-01-01", {"state": "ready", "rows": 42, "summary": {"files": 3}})
    payload = await waiting
    assert payload["status"] == "success"
    assert payload["status_code"] == 200
    assert payload["fields"] == {"rows": 42, "summary.files": 3}
    assert payload["decision"]["actual"] == "ready"
    polls = [r for r in api.responses if r[1] == "/v1/batches/2024-01-01/status"]
    assert polls[0][2] == 200 and len(polls) >= 2
    assert TOKEN not in json.dumps(payload)


async def test_http_trigger_treats_unknown_batch_as_not_yet(api: Api, compose_connection: Callable[..., str]) -> None:
    conn_id = compose_connection(api.server.port)
    first_404 = asyncio.Event()

    def on_404(request: web.Request, response: web.StreamResponse) -> None:
        if response.status == 404:
            first_404.set()

    api.listeners.append(on_404)
    waiting = asyncio.ensure_future(run_trigger_payload(batch_ready(conn_id, "late")))
    await asyncio.wait_for(first_404.wait(), 30)
    await api.call("PUT", "/v1/batches/late", {"state": "ready", "rows": 1})
    assert (await waiting)["status"] == "success"


async def test_http_trigger_fails_at_once_on_a_failed_batch(api: Api, compose_connection: Callable[..., str]) -> None:
    conn_id = compose_connection(api.server.port)
    await api.call("PUT", "/v1/batches/bad", {"state": "failed", "message": "export crashed"})
    payload = await run_trigger_payload(batch_ready(conn_id, "bad"))
    assert payload["status"] == "error"
    assert "export crashed" in json.dumps(payload)
    assert len([r for r in api.responses if r[1] == "/v1/batches/bad/status"]) == 1


async def test_http_trigger_with_a_wrong_token_fails_instead_of_waiting(
    api: Api, compose_connection: Callable[..., str]
) -> None:
    conn_id = compose_connection(api.server.port, password="not-the-token")
    await api.call("PUT", "/v1/batches/auth", {"state": "ready", "rows": 1})
    payload = await run_trigger_payload(batch_ready(conn_id, "auth"))
    assert payload["status"] == "error"
    assert "401" in json.dumps(payload)
    assert "not-the-token" not in json.dumps(payload)
    assert [r[2] for r in api.responses if r[1] == "/v1/batches/auth/status"] == [401]


async def test_export_published_head_wait(api: Api, compose_connection: Callable[..., str]) -> None:
    """The second wait of dags/example_http.py: HEAD, any 2xx is ready, 404 is not yet."""
    conn_id = compose_connection(api.server.port)
    polled = asyncio.Event()
    api.listeners.append(lambda request, response: polled.set() if request.path == "/v1/exports/d1" else None)
    waiting = asyncio.ensure_future(run_trigger_payload(trigger(conn_id, endpoint="v1/exports/d1", method="HEAD")))
    await asyncio.wait_for(polled.wait(), 30)
    await api.call("PUT", "/v1/exports/d1", {"files": 1})
    payload = await waiting
    assert (payload["status"], payload["status_code"], payload["method"]) == ("success", 200, "HEAD")
    assert next(r[:1] + r[2:] for r in api.responses if r[1] == "/v1/exports/d1") == ("HEAD", 404)


async def test_report_ready_post_wait(api: Api, compose_connection: Callable[..., str]) -> None:
    """The third wait of dags/example_http.py: POST; 404/202 not yet, 200 ready, 422 failed."""
    conn_id = compose_connection(api.server.port)

    def report(name: str) -> HttpBatchReadyTrigger:
        return trigger(
            conn_id,
            endpoint="v1/reports/query",
            method="POST",
            json_body={"report": name, "date": "2024-01-01"},
            not_yet_codes=[404, 202],
            success=[{"status": 200}],
            failure=[{"status": 422}],
        )

    await api.call("PUT", "/v1/reports/revenue/2024-01-01", {"state": "running"})
    accepted = asyncio.Event()
    api.listeners.append(lambda request, response: accepted.set() if response.status == 202 else None)
    waiting = asyncio.ensure_future(run_trigger_payload(report("revenue")))
    await asyncio.wait_for(accepted.wait(), 30)
    await api.call("PUT", "/v1/reports/revenue/2024-01-01", {"state": "done", "rows": 7})
    assert (await waiting)["status"] == "success"

    await api.call("PUT", "/v1/reports/broken/2024-01-01", {"state": "failed", "message": "bad input"})
    failed = await run_trigger_payload(report("broken"))
    assert failed["status"] == "error" and "422" in json.dumps(failed)
