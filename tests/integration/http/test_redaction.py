"""Known secrets are redacted from payloads, messages and log lines, even when a server echoes them.

Servers here are real aiohttp servers that quote the request's credentials back in 401, 403 and
500 bodies: the bearer token, the basic-auth header, an API-key header from the connection.
"""

from __future__ import annotations

import base64
import json
from collections.abc import Callable
from typing import Any
from urllib.parse import quote

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
