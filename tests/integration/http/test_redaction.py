"""Known secrets are redacted from payloads, messages and log lines, even when a server echoes them.

Servers here are real aiohttp servers that quote the request's credentials back in 401, 403 and
500 bodies: the bearer token, the basic-auth header, an API-key header from the connection.
"""

from __future__ import annotations

import base64
import json
from collections.abc import Callable
from typing import Any
from urllib.parse import quote, unquote

import pytest
import structlog

from airflow_deferrable_kit import _redact
from airflow_deferrable_kit.testing import run_trigger_payload
from airflow_deferrable_kit.triggers.base import deadline_after
from airflow_deferrable_kit.triggers.http import HttpBatchReadyTrigger
from tests.integration.http.conftest import Seen, Server, reply

Serve = Callable[..., Server]
Conn = Callable[..., str]

TOKEN = "tok-3f9a1c7e5d"
API_KEY = "key-88e1b2c4aa"
LOGIN, PASSWORD = "svc-loader", "p@ss/w0rd:9"


def echo(status: int) -> Callable[[Seen], Any]:
    """A server that quotes every credential it was sent, in its body and its headers."""

    def handle(seen: Seen) -> Any:
        sent = {name: value for name, value in seen.headers.items() if name.lower() in ("authorization", "x-api-key")}
        return reply(status, {"error": "denied", "you_sent": sent}, headers={"X-Echo": json.dumps(sent)})

    return handle


def forms(*secrets: str) -> list[str]:
    pair = f"{LOGIN}:{PASSWORD}"
    out = [*secrets, base64.b64encode(pair.encode()).decode(), quote(PASSWORD, safe="")]
    return out + [base64.b64encode(s.encode()).decode() for s in secrets]


def assert_clean(text: str, secrets: list[str]) -> None:
    leaked = [secret for secret in secrets if secret in text]
    assert leaked == [], f"leaked {leaked} in {text[:500]}"


def make(conn_id: str, **kwargs: Any) -> HttpBatchReadyTrigger:
    kwargs.setdefault("endpoint", "v1/status")
    kwargs.setdefault("poll_interval", 0.05)
    kwargs.setdefault("max_backoff", 0.1)
    return HttpBatchReadyTrigger(http_conn_id=conn_id, **kwargs)


@pytest.mark.parametrize("status", [401, 403])
async def test_an_echoed_bearer_token_and_api_key_never_reach_the_error_payload_or_log(
    serve: Serve, connection: Conn, status: int
) -> None:
    server = serve(echo(status))
    conn = connection(
        "echo_bearer", host="127.0.0.1", port=server.port, extra={"bearer_token": TOKEN, "X-Api-Key": API_KEY}
    )
    with structlog.testing.capture_logs() as logs:
        payload = await run_trigger_payload(make(conn))
    assert payload["status"] == "error" and payload["status_code"] == status
    assert server.requests[0].headers["Authorization"] == f"Bearer {TOKEN}"  # the secret really was sent
    assert "***" in payload["body_excerpt"]  # and really was echoed, then masked
    assert_clean(json.dumps(payload), forms(TOKEN, API_KEY))
    assert_clean(json.dumps(logs, default=str), forms(TOKEN, API_KEY))


async def test_basic_auth_echoed_by_a_500_is_masked_in_every_retry_warning_and_the_timeout(
    serve: Serve, connection: Conn
) -> None:
    server = serve(echo(500))
    conn = connection(
        "echo_basic", host="127.0.0.1", port=server.port, login=LOGIN, password=PASSWORD, extra={"X-Api-Key": API_KEY}
    )
    with structlog.testing.capture_logs() as logs:
        payload = await run_trigger_payload(make(conn, deadline=deadline_after(0.6)))
    assert payload["status"] == "timeout"
    assert len(server.requests) >= 2
    warnings = [entry for entry in logs if entry.get("log_level") == "warning"]
    assert warnings, "the 500s were retried with a warning each"
    assert_clean(json.dumps(payload), forms(API_KEY))
    assert_clean(json.dumps(logs, default=str), forms(API_KEY))


async def test_a_password_in_the_connection_host_url_is_masked(serve: Serve, connection: Conn) -> None:
    server = serve(echo(503))
    conn = connection("echo_url", host=f"http://{LOGIN}:{quote(PASSWORD, safe='')}@127.0.0.1:{server.port}")
    with structlog.testing.capture_logs() as logs:
        payload = await run_trigger_payload(make(conn, deadline=deadline_after(0.4)))
    assert payload["status"] == "timeout"
    assert_clean(json.dumps(payload) + json.dumps(logs, default=str), [PASSWORD, quote(PASSWORD, safe="")])


def test_every_form_of_a_registered_secret_is_redacted_and_short_values_are_not() -> None:
    _redact.register("s3cr3t-value", login="bob")
    text = " | ".join(
        [
            "plain s3cr3t-value",
            "basic " + base64.b64encode(b"bob:s3cr3t-value").decode(),
            "b64 " + base64.b64encode(b"s3cr3t-value").decode(),
            "url http://bob:s3cr3t-value@host/",
        ]
    )
    redacted = _redact.redact(text)
    assert "s3cr3t-value" not in redacted and redacted.count("***") == 4
    assert not _redact.register("abcd")  # too short to be a secret worth masking (Airflow: under 5)
    assert _redact.redact("abcd def") == "abcd def"


def test_registered_secrets_go_to_airflows_secrets_masker_too() -> None:
    from airflow.sdk._shared.secrets_masker import _secrets_masker

    _redact.register("masked-by-airflow-too")
    assert _secrets_masker().redact("x masked-by-airflow-too y") != "x masked-by-airflow-too y"


async def test_inside_a_loop_airflows_masker_is_told_off_the_loop() -> None:
    import asyncio

    from airflow.sdk._shared.secrets_masker import _secrets_masker

    _redact.register("masked-from-a-thread")
    await asyncio.gather(*_redact._handing_over)
    assert _secrets_masker().redact("x masked-from-a-thread y") != "x masked-from-a-thread y"
    assert _redact.redact("x masked-from-a-thread y") == "x *** y"  # ours at once, in the loop


def test_ordinary_header_values_are_not_secrets(monkeypatch: pytest.MonkeyPatch) -> None:
    # One HTTP connection with an everyday header must not mask that word in every other payload.
    from airflow_deferrable_kit._http.client import connection_headers

    headers = connection_headers(
        {"X-Team": "data", "Accept": "application/json", "X-Api-Key": API_KEY}, login=None, password=None
    )
    assert headers["X-Team"] == "data"
    text = "s3://b/data/one.csv unknown_database application/json " + API_KEY
    assert _redact.redact(text) == "s3://b/data/one.csv unknown_database application/json ***"


# ------------------------------------------------------------- URLs the server chose
#: A pre-signed URL as an API answers 302 with it: S3's, GCS's and Azure SAS's signing
#: parameters and an OAuth token, beside parameters that are no secret (kept as they are).
SIGNED_VALUES = {
    "X-Amz-Credential": "AKIAEXAMPLE0042%2F20240101%2Fus-east-1%2Fs3%2Faws4_request",
    "X-Amz-Signature": "5f1e0c9a7b3d2e4f6a8b0c1d2e3f4a5b6c7d8e9f",
    "X-Goog-Signature": "9e8d7c6b5a4f3e2d1c0b",
    "access_token": "ya29.tokvalue-77",
    "sig": "AzSig0042%2Bvalue",
    "se": "2030-01-01T00%3A00%3A00Z",
    "sp": "racwd",
}
SIGNED_QUERY = "&".join([*(f"{name}={value}" for name, value in SIGNED_VALUES.items()), "sv=2022-11-02", "part=1"])
MASKED_QUERY = "&".join([*(f"{name}=***" for name in SIGNED_VALUES), "sv=2022-11-02", "part=1"])


def signed_redirect(seen: Seen) -> Any:
    if seen.path == "/v1/status":
        return reply(302, headers={"Location": f"/signed/batch.json?{SIGNED_QUERY}"})
    return reply(200, {"state": "ready"})


def assert_no_signed_value(text: str) -> None:
    values = [value for value in SIGNED_VALUES.values() if len(value) >= 5]
    assert_clean(text, values + [unquote(value) for value in values])  # as sent, and as yarl prints it


async def test_secret_query_values_of_a_url_the_server_chose_never_reach_the_xcom_or_log(
    serve: Serve, connection: Conn
) -> None:
    server = serve(signed_redirect)
    conn = connection("signed_api", host="127.0.0.1", port=server.port)
    with structlog.testing.capture_logs() as logs:
        payload = await run_trigger_payload(make(conn, select=["state"]))
    assert payload["status"] == "success" and payload["redirects"] == 1
    hop = server.requests[1]
    assert {name: hop.query[name] for name in SIGNED_VALUES} == {
        name: [unquote(value)] for name, value in SIGNED_VALUES.items()
    }  # followed with the real values
    assert payload["final_url"] == f"{server.url}/signed/batch.json?{MASKED_QUERY}"  # the names stay, the values go
    assert_no_signed_value(json.dumps(payload) + json.dumps(logs, default=str))


async def test_secret_query_values_of_a_url_the_server_chose_never_reach_an_asset_event(
    serve: Serve, connection: Conn
) -> None:
    from airflow_deferrable_kit.testing_events import WatcherHarness
    from airflow_deferrable_kit.triggers.http_events import HttpBatchReadyEventTrigger

    server = serve(signed_redirect)
    conn = connection("signed_api", host="127.0.0.1", port=server.port)
    watcher = HttpBatchReadyEventTrigger(
        http_conn_id=conn, endpoint="v1/status", poll_interval=0.05, backfill=True,
        success=[{"path": "state", "equals": "ready"}],
    )  # fmt: skip
    with structlog.testing.capture_logs() as logs:
        async with WatcherHarness() as triggerer:
            watch = await triggerer.start(watcher)
            [event] = await watch.wait_for_events(1)
    assert event["final_url"] == f"{server.url}/signed/batch.json?{MASKED_QUERY}"
    assert_no_signed_value(json.dumps(event) + json.dumps(logs, default=str))


async def test_a_redirect_loop_through_a_signed_url_names_it_masked(serve: Serve, connection: Conn) -> None:
    where = f"/v1/status?{SIGNED_QUERY}"  # quoted in the body too, as Express and nginx do
    server = serve(lambda seen: reply(302, f"Found. Redirecting to {where}", headers={"Location": where}))
    conn = connection("signed_api", host="127.0.0.1", port=server.port)
    with structlog.testing.capture_logs() as logs:
        payload = await run_trigger_payload(make(conn))
    assert payload["status"] == "error" and payload["error_type"] == "bad_request"
    assert f"redirect to '/v1/status?{MASKED_QUERY}' not followed" in payload["message"]
    assert_no_signed_value(json.dumps(payload) + json.dumps(logs, default=str))


async def test_a_url_header_of_the_answer_is_masked_in_the_response_an_event_carries(
    serve: Serve, connection: Conn
) -> None:
    where = f"/signed/batch.json?{SIGNED_QUERY}"
    server = serve(lambda seen: reply(200, {"state": "ready"}, headers={"Content-Location": where}))
    conn = connection("signed_api", host="127.0.0.1", port=server.port)
    payload = await run_trigger_payload(make(conn, include_response=True))
    assert payload["status"] == "success"
    response = payload["response"]
    assert response["headers"]["Content-Location"] == f"/signed/batch.json?{MASKED_QUERY}"
    # What the worker would judge is no longer what was sent: it fetches the response again.
    assert response["complete"] is False and response["content"] is None
    assert_no_signed_value(json.dumps(payload))
