"""Redirects are followed as ``requests`` follows them for the official ``HttpSensor``.

Same limit (30), same method and body rules (checked against requests itself on the same
server), cookies a redirect sets sent on that request's next hops only, and a hop that leaves the
connection's origin carries none of its credentials. A redirect to another scheme fails at once.
The payload says where the answer came from.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable
from typing import Any

import pytest

from airflow_deferrable_kit import _redact
from airflow_deferrable_kit._http.client import keeps_credentials
from airflow_deferrable_kit._http.responses import MAX_REDIRECTS
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


def hops(server: Server) -> list[tuple[str, str, bytes, str | None]]:
    """What each hop sent: method, path, body and content type."""
    return [(seen.method, seen.path, seen.body, seen.headers.get("Content-Type")) for seen in server.requests]


def send_with_requests(method: str, url: str, body: Any) -> None:
    import requests

    with requests.Session() as session:
        session.trust_env = False  # no proxy or netrc from this machine
        session.request(method, url, json=body, timeout=10)


@pytest.mark.parametrize("status", [301, 302, 303, 307, 308])
@pytest.mark.parametrize("method", ["GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS"])
async def test_every_hop_has_the_method_and_body_requests_gives_it(
    serve: Serve, connection: Conn, status: int, method: str
) -> None:
    # requests itself, against the same server, is the reference: 302 and 303 send a GET without
    # a body for every method but HEAD, 301 turns a POST into a GET, and every redirect but 307
    # and 308 drops the body.
    server = serve(moved(status, "/v2/status"))
    conn = connection("moved_api", host="127.0.0.1", port=server.port)
    body = None if method in ("GET", "HEAD") else {"batch": 7}
    payload = await run_trigger_payload(make(conn, method=method, json_body=body))
    assert payload["status"] == "success" and payload["redirects"] == 1
    ours = hops(server)
    server.requests.clear()
    await asyncio.to_thread(send_with_requests, method, f"{server.url}/v1/status", body)
    assert ours == hops(server)


def gateway(seen: Seen) -> Any:
    """A login gateway: sets its session cookie on a redirect and loops until the cookie comes back."""
    if seen.path == "/sso":
        return reply(302, headers={"Location": "/v1/status", "Set-Cookie": "gw_session=s-0042; Path=/; HttpOnly"})
    if "gw_session=s-0042" not in seen.headers.get("Cookie", ""):
        return reply(302, headers={"Location": "/sso"})
    return reply(200, READY)


async def test_a_cookie_a_redirect_sets_is_sent_on_the_next_hops_of_that_request_only(
    serve: Serve, connection: Conn
) -> None:
    server = serve(gateway)
    conn = connection("gated_api", host="127.0.0.1", port=server.port, extra={"Cookie": "team=data"})
    first = await run_trigger_payload(make(conn))
    second = await run_trigger_payload(make(conn))  # another wait: another request, a jar of its own
    assert first["status"] == second["status"] == "success" and first["redirects"] == 2
    one_request = [
        ("/v1/status", "team=data"),
        ("/sso", "team=data"),
        ("/v1/status", "team=data; gw_session=s-0042"),
    ]
    assert [(seen.path, seen.headers.get("Cookie")) for seen in server.requests] == one_request * 2


async def test_a_cookie_set_by_one_origin_never_goes_to_another(serve: Serve, connection: Conn) -> None:
    other = serve(script(lambda: reply(200, READY)))

    def handle(seen: Seen) -> Any:
        if seen.path == "/v1/status":
            return reply(302, headers={"Location": "/sso", "Set-Cookie": "gw_session=s-0042; Path=/"})
        return reply(302, headers={"Location": f"http://localhost:{other.port}/elsewhere"})  # another host

    server = serve(handle)
    conn = connection("moved_api", host="127.0.0.1", port=server.port)
    payload = await run_trigger_payload(make(conn))
    assert payload["status"] == "success" and payload["redirects"] == 2
    assert server.requests[1].headers.get("Cookie") == "gw_session=s-0042"  # the jar works...
    assert "Cookie" not in other.requests[0].headers  # ...for the host that set it only (ports are no boundary)


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
