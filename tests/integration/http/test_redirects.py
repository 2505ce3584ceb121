"""Redirects are followed as ``requests`` follows them for the official ``HttpSensor``.

Same limit (30), same method rules (303, and 301/302 after a POST, become a GET without a body;
307/308 repeat the request), and a hop that leaves the connection's origin carries none of its
credentials. The payload says where the answer came from.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import pytest

from airflow_deferrable_kit import _redact
from airflow_deferrable_kit._http.client import MAX_REDIRECTS, keeps_credentials
from airflow_deferrable_kit.testing import run_trigger_payload
from airflow_deferrable_kit.triggers.base import deadline_after
from airflow_deferrable_kit.triggers.http import HttpBatchReadyTrigger
from tests.integration.http.conftest import Seen, Server, reply, script

Serve = Callable[..., Server]
Conn = Callable[..., str]
READY = {"state": "ready"}


def make(conn_id: str, **kwargs: Any) -> HttpBatchReadyTrigger:
    kwargs.setdefault("endpoint", "v1/status")
    kwargs.setdefault("poll_interval", 0.05)
    kwargs.setdefault("max_backoff", 0.2)
    kwargs.setdefault("select", ["state"])
    return HttpBatchReadyTrigger(http_conn_id=conn_id, **kwargs)


def moved(status: int, location: str) -> Callable[[Seen], Any]:
    """Redirect the first request only; answer ready at the new place."""

    def handle(seen: Seen) -> Any:
        return reply(status, headers={"Location": location}) if seen.path == "/v1/status" else reply(200, READY)

    return handle


async def test_a_permanent_redirect_on_the_same_host_is_followed_with_the_credentials(
    serve: Serve, connection: Conn
) -> None:
    server = serve(moved(301, "/v2/status"))
    conn = connection("moved_api", host="127.0.0.1", port=server.port, login="svc", password="s3cret")
    payload = await run_trigger_payload(make(conn))
    assert payload["status"] == "success" and payload["fields"] == {"state": "ready"}
    assert payload["final_url"] == f"{server.url}/v2/status" and payload["redirects"] == 1
    assert [seen.path for seen in server.requests] == ["/v1/status", "/v2/status"]
    assert all(seen.headers.get("Authorization", "").startswith("Basic ") for seen in server.requests)


async def test_a_redirect_to_another_origin_carries_no_credential(serve: Serve, connection: Conn) -> None:
    other = serve(script(lambda: reply(200, READY)))
    server = serve(moved(302, f"{other.url}/elsewhere"))
    extra = {"X-Api-Key": "k-123", "X-Team": "data"}
    conn = connection(
        "moved_api", host="127.0.0.1", port=server.port, login="svc", password="s3cret", extra=json.dumps(extra)
    )
    payload = await run_trigger_payload(make(conn))
    assert payload["status"] == "success" and payload["final_url"] == f"{other.url}/elsewhere"
    first, hop = server.requests[0].headers, other.requests[0].headers
    assert "Authorization" in first and first["X-Api-Key"] == "k-123"
    assert "Authorization" not in hop and "X-Api-Key" not in hop, hop  # the other origin sees no credential
    assert hop["X-Team"] == "data"  # headers that are no credential still go


async def test_see_other_after_a_post_becomes_a_get_without_the_body(serve: Serve, connection: Conn) -> None:
    server = serve(moved(303, "/v2/status"))
    conn = connection("moved_api", host="127.0.0.1", port=server.port)
    payload = await run_trigger_payload(make(conn, method="POST", json_body={"batch": 7}))
    assert payload["status"] == "success"
    assert [(seen.method, seen.body) for seen in server.requests] == [("POST", b'{"batch": 7}'), ("GET", b"")]


async def test_a_temporary_redirect_repeats_the_post_with_its_body(serve: Serve, connection: Conn) -> None:
    server = serve(moved(307, "/v2/status"))
    conn = connection("moved_api", host="127.0.0.1", port=server.port)
    payload = await run_trigger_payload(make(conn, method="POST", json_body={"batch": 7}))
    assert payload["status"] == "success"
    assert [(seen.method, seen.body) for seen in server.requests] == [("POST", b'{"batch": 7}')] * 2


async def test_a_redirect_loop_stops_at_requests_limit_with_a_clear_error(serve: Serve, connection: Conn) -> None:
    server = serve(script(lambda: reply(302, headers={"Location": "/v1/status"})))
    conn = connection("moved_api", host="127.0.0.1", port=server.port)
    payload = await run_trigger_payload(make(conn))
    assert payload["status"] == "error" and payload["error_type"] == "bad_request"
    assert f"more than {MAX_REDIRECTS} redirects" in payload["message"]
    assert len(server.requests) == MAX_REDIRECTS + 1


def test_the_origin_rule_is_requests_rule() -> None:
    from yarl import URL

    assert keeps_credentials(URL("http://a.example/x"), URL("http://a.example:80/y"))
    assert keeps_credentials(URL("http://a.example/x"), URL("https://a.example/y"))  # upgrade to TLS
    assert not keeps_credentials(URL("https://a.example/x"), URL("http://a.example/y"))  # downgrade
    assert not keeps_credentials(URL("http://a.example/x"), URL("http://b.example/x"))
    assert not keeps_credentials(URL("http://a.example:8080/x"), URL("http://a.example:8081/x"))


@pytest.mark.parametrize(
    ("location", "scheme"),
    [
        ("ftp://files.example/batch.csv?X-Amz-Signature=5f1e0c9a7b3d&part=1", "ftp"),
        ("file:///etc/passwd", "file"),
        ("javascript:alert(1)", "javascript"),
    ],
)
async def test_a_redirect_to_a_scheme_other_than_http_fails_at_once(
    serve: Serve, connection: Conn, location: str, scheme: str
) -> None:
    # requests raises InvalidSchema at once; retrying cannot make an ftp: URL answer over HTTP,
    # and a timeout would let soft_fail skip a task whose endpoint is broken.
    server = serve(moved(302, location))
    conn = connection("moved_api", host="127.0.0.1", port=server.port)
    payload = await run_trigger_payload(make(conn, deadline=deadline_after(3.0)))
    assert payload["status"] == "error" and payload["error_type"] == "protocol", payload
    assert f"scheme {scheme!r}" in payload["message"] and len(server.requests) == 1
    assert _redact.redact_url(location) in payload["message"]  # the URL, with its signature masked
    assert "5f1e0c9a7b3d" not in json.dumps(payload)
