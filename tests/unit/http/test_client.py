"""The aiohttp side of the HTTP wait: connection rules, Retry-After, error mapping, lazy imports.

The end-to-end behaviour of these pieces (auth reaching a real server, TLS, proxies, sharing one
session) is tested through the trigger in ``test_trigger_http.py``.
"""

from __future__ import annotations

import base64
import email.utils
from typing import Any

import aiohttp
import pytest
from airflow.sdk import Connection
from multidict import CIMultiDict, CIMultiDictProxy

from airflow_deferrable_kit import _redact
from airflow_deferrable_kit._http.client import (
    base_url,
    classify_aiohttp_error,
    connection_headers,
    is_transient_status,
    proxy_for,
)
from airflow_deferrable_kit._http.responses import MAX_RETRY_AFTER, parse_retry_after
from airflow_deferrable_kit.errors import FatalError, TransientError


# ------------------------------------------------------------------------ connections
def conn(**fields: Any) -> Connection:
    return Connection(conn_id="c", conn_type="http", **fields)


@pytest.mark.parametrize(
    ("fields", "expected"),
    [
        ({"host": "api.example.com"}, "http://api.example.com"),
        ({"host": "api.example.com", "schema": "https"}, "https://api.example.com"),
        ({"host": "api.example.com", "port": 8443, "schema": "https"}, "https://api.example.com:8443"),
        ({"host": "https://api.example.com/v1/", "schema": "ignored"}, "https://api.example.com/v1/"),
        ({"host": "https://api.example.com:9000/v1", "port": 1234}, "https://api.example.com:9000/v1"),
        ({"host": "https://user:pw@api.example.com/v1"}, "https://api.example.com/v1"),
    ],
)
def test_base_url_rules(fields: dict[str, Any], expected: str) -> None:
    assert str(base_url(conn(**fields))) == expected


@pytest.mark.parametrize(
    ("fields", "message"),
    [({}, "has no host"), ({"host": "ftp://files.example.com"}, "http\\(s\\) host")],
)
def test_base_url_errors_are_fatal_config_errors(fields: dict[str, Any], message: str) -> None:
    with pytest.raises(FatalError, match=message) as info:
        base_url(conn(**fields))
    assert info.value.error_type == "bad_connection"


def basic(login: str, password: str) -> str:
    return "Basic " + base64.b64encode(f"{login}:{password}".encode()).decode()


@pytest.mark.parametrize(
    ("extra", "login", "password", "expected"),
    [
        ({}, None, None, {}),
        ({}, "u", "p", {"Authorization": basic("u", "p")}),
        ({"auth_type": "basic"}, None, "p", {"Authorization": basic("", "p")}),
        ({"auth_type": "none"}, "u", "p", {}),
        ({"auth_type": "requests.auth.HTTPBasicAuth"}, "u", "p", {"Authorization": basic("u", "p")}),
        ({"bearer_token": "t"}, "u", "p", {"Authorization": "Bearer t"}),
        ({"auth_type": "bearer"}, None, "pw-token", {"Authorization": "Bearer pw-token"}),
        ({"authorization": "Token x"}, None, None, {"authorization": "Token x"}),
        ({"authorization": "Token x"}, "u", "p", {"Authorization": basic("u", "p")}),
        (
            {"X-A": "1", "headers": {"X-B": 2, "X-C": True}, "verify": False, "timeout": 3, "proxies": {}},
            None,
            None,
            {"X-A": "1", "X-B": "2", "X-C": "true"},
        ),
    ],
)
def test_connection_header_rules(
    extra: dict[str, Any], login: str | None, password: str | None, expected: dict[str, str]
) -> None:
    assert connection_headers(extra, login=login, password=password) == expected


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        ({"auth_type": "kerberos"}, "'auth_type' 'kerberos' is not supported"),
        ({"auth_type": "bearer"}, "needs a token"),
        ({"bearer_token": ""}, "bearer_token' must be a non-empty string"),
        ({"headers": ["X-A"]}, "'headers' must be an object"),
        ({"X-Nested": {"a": 1}}, "'X-Nested' is sent as a header"),
    ],
)
def test_bad_connection_extras_are_fatal(extra: dict[str, Any], message: str) -> None:
    with pytest.raises(FatalError, match=message) as info:
        connection_headers(extra, login=None, password=None)
    assert info.value.error_type == "bad_connection"


# ------------------------------------------------------------------------- Retry-After
NOW = 1_700_000_000.0


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        (None, None),
        ("", None),
        ("120", 120.0),
        (" 0 ", 0.0),
        ("1.5", 1.5),
        ("-5", 0.0),
        ("99999999", MAX_RETRY_AFTER),
        (email.utils.formatdate(NOW + 90, usegmt=True), 90.0),
        (email.utils.formatdate(NOW - 90, usegmt=True), 0.0),
        ("Wed, 21 Oct 2015 07:28:00", 0.0),  # a date without zone is read as UTC (and is past)
        ("soon", None),
        ("nan", None),
    ],
)
def test_parse_retry_after(value: str | None, expected: float | None) -> None:
    assert parse_retry_after(value, now=NOW) == expected


def test_proxy_rules() -> None:
    assert proxy_for({"proxy": "http://p:3128"}, "https") == "http://p:3128"
    assert proxy_for({"proxies": {"https": "http://s:1", "http": "http://h:1"}}, "http") == "http://h:1"
    assert proxy_for({"proxies": {"https": "http://s:1"}}, "http") is None
    assert proxy_for({}, "http") is None
    with pytest.raises(FatalError, match="proxy must be an http"):
        proxy_for({"proxy": "socks5://p:1080"}, "http")


# ------------------------------------------------------------------------------- errors
@pytest.mark.parametrize(
    ("status", "transient"),
    [(408, True), (429, True), (500, True), (503, True), (599, True)]
    + [(status, False) for status in (301, 400, 401, 403, 404, 409, 410, 422)],
)
def test_408_429_and_5xx_are_transient_other_statuses_fatal(status: int, transient: bool) -> None:
    assert is_transient_status(status) is transient


def test_aiohttp_errors_map_to_transient_or_fatal() -> None:
    invalid = classify_aiohttp_error(aiohttp.InvalidURL("nope://"))
    assert isinstance(invalid, FatalError) and invalid.error_type == "bad_connection"
    refused = classify_aiohttp_error(aiohttp.ClientConnectionError("refused"))
    assert isinstance(refused, TransientError) and refused.error_type == "network"
    assert refused.message == "ClientConnectionError: refused"
    assert isinstance(classify_aiohttp_error(aiohttp.ServerDisconnectedError()), TransientError)
    # Not aiohttp's: left to the base trigger's mapping (plain socket errors and timeouts).
    assert classify_aiohttp_error(ConnectionResetError("reset")) is None
    assert classify_aiohttp_error(TimeoutError()) is None
    assert classify_aiohttp_error(ValueError("x")) is None


SIGNED = "https://b.s3.example/k.csv?X-Amz-Signature=5f1e0c9a7b3d&X-Amz-Credential=AKIA0042%2Fs3&part=1"


def test_aiohttp_messages_quoting_a_url_mask_its_secret_query_values() -> None:
    # A connect timeout and a malformed answer quote the URL asked: after a redirect, the server's.
    from yarl import URL

    info = aiohttp.RequestInfo(URL(SIGNED), "GET", CIMultiDictProxy(CIMultiDict()), URL(SIGNED))
    for exc in (
        aiohttp.ConnectionTimeoutError(f"Connection timeout to host {SIGNED}"),
        aiohttp.ClientResponseError(info, (), status=400, message="Invalid header value char"),
    ):
        error = classify_aiohttp_error(exc)
        assert isinstance(error, TransientError) and error.error_type == "network"
        assert "X-Amz-Signature=***&X-Amz-Credential=***&part=1" in error.message, error.message
        assert "5f1e0c9a7b3d" not in error.message and "AKIA0042" not in error.message


@pytest.mark.parametrize(
    ("url", "expected"),
    [
        # S3, GCS, Azure SAS and OAuth parameters: names kept, values masked, case-insensitively
        (
            "/d?X-Amz-Security-Token=t0k3n&X-Amz-Expires=300&x-amz-date=1",
            "/d?X-Amz-Security-Token=***&X-Amz-Expires=***&x-amz-date=***",
        ),
        ("/d?X-Goog-Credential=svc%40p&X-Goog-Signature=ab12cd", "/d?X-Goog-Credential=***&X-Goog-Signature=***"),
        ("/d?sv=2022-11-02&se=2030&sp=r&sig=Az%2Bs&sr=b", "/d?sv=2022-11-02&se=***&sp=***&sig=***&sr=b"),
        ("/cb#access_token=ya29.x&token_type=bearer&state=s1", "/cb#access_token=***&token_type=***&state=s1"),
        (
            "/d?apiKey=k1&PASSWORD=p1&client_secret=c1&SessionId=s1&auth=a1",
            "/d?apiKey=***&PASSWORD=***&client_secret=***&SessionId=***&auth=***",
        ),
        ("/d?code=oauth-code&status_code=200&page=2&user=bob", "/d?code=***&status_code=200&page=2&user=bob"),
        ("https://bob:hunter22@h/x?part=1", "https://bob:***@h/x?part=1"),
        ("/d?token=&sig", "/d?token=&sig"),  # nothing to mask
        ("redirect to '/d?X-Amz-Signature=abc' not followed", "redirect to '/d?X-Amz-Signature=***' not followed"),
    ],
)
def test_secret_looking_query_values_of_a_url_are_masked_by_name(url: str, expected: str) -> None:
    assert _redact.redact_url(url) == expected
    assert _redact.redact_url(expected) == expected  # idempotent


# ----------------------------------------------------------------------------- imports
def test_the_sensor_module_does_not_import_aiohttp_and_the_session_imports_it_off_the_loop() -> None:
    code = """
import asyncio, sys, threading
import airflow_deferrable_kit.sensors.http
import airflow_deferrable_kit.triggers.http
import airflow_deferrable_kit._http.client as http
assert "aiohttp" not in sys.modules, "importing the sensor imported aiohttp"
from yarl import URL
options = http.HttpOptions(base=URL("http://localhost"), headers={}, ssl=True)
imports = []
def hook(event, args):
    if event == "open" and "/aiohttp/" in str(args[0]):
        imports.append(threading.get_ident())
sys.addaudithook(hook)
async def main():
    session = await http.open_session(options)
    await http.close_session(session)
asyncio.run(main())
assert imports and threading.get_ident() not in imports, imports
print("ok")
"""
    import subprocess
    import sys

    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=False)
    assert result.returncode == 0, result.stderr[-2000:]
    assert result.stdout.strip().endswith("ok")
