"""botocore and aiobotocore at DEBUG: no credential of the connection in any line they write.

botocore logs the canonical request and the headers it signs at DEBUG (``botocore.auth``,
``botocore.endpoint``), which hold the session token, and the endpoint it resolved
(``aiobotocore.regions``), which held an ``endpoint_url``'s ``user:password``; an operator
debugging S3 turns exactly these loggers on. Every record of every logger is read, on the HEAD,
listing and bucket-check paths, and every guarded logger is shown to mask a registered secret.
"""

from __future__ import annotations

import logging
import urllib.parse
from typing import Any

import pytest

from airflow_deferrable_kit._s3.client import CREDENTIAL_LOGGERS, client_endpoint
from airflow_deferrable_kit.testing import run_trigger_payload
from airflow_deferrable_kit.triggers.base import deadline_after
from tests.integration.s3.conftest import SECRET
from tests.integration.s3.test_trigger import s3_trigger

TOKEN = "IQoJb3JpZ2luX2VjEXAMPLE-session-token-value"
URL_PASSWORD = "url-pass-DO-NOT-LEAK-91c2"


def _boto_loggers() -> list[str]:
    """Every botocore/aiobotocore logger that exists now, and every one the kit guards."""
    existing = [name for name in logging.Logger.manager.loggerDict if name.split(".")[0] in ("botocore", "aiobotocore")]
    return sorted({"botocore", "aiobotocore", *existing, *CREDENTIAL_LOGGERS})


@pytest.mark.parametrize("path", ["head", "listing", "bucket-check"])
async def test_no_credential_reaches_botocores_debug_log(
    admin: Any, bucket: str, make_conn: Any, s3_server: Any, caplog: pytest.LogCaptureFixture, path: str
) -> None:
    await admin.put_object(Bucket=bucket, Key="debug/a.csv", Body=b"a")
    url = urllib.parse.urlsplit(s3_server.endpoint_url)
    endpoint = url._replace(netloc=f"debug-user:{URL_PASSWORD}@{url.netloc}").geturl()
    conn_id = make_conn(endpoint, conn_id="s3_debugging", aws_session_token=TOKEN)
    key = {"head": "debug/a.csv", "listing": "debug/*.csv", "bucket-check": "debug/missing.csv"}[path]
    # A missing key: HEAD 404, then the bucket check (botocore's own path), then the deadline.
    deadline = deadline_after(0.5) if path == "bucket-check" else None
    trigger = s3_trigger(
        bucket_key=f"s3://{bucket}/{key}", wildcard_match=path == "listing", aws_conn_id=conn_id, deadline=deadline
    )

    caplog.set_level(logging.DEBUG)
    for name in ("aiohttp", *_boto_loggers()):
        caplog.set_level(logging.DEBUG, logger=name)
    payload = await run_trigger_payload(trigger)
    for name in _boto_loggers():  # loggers first created during the run: set too, and run again
        caplog.set_level(logging.DEBUG, logger=name)
    kwargs = {**trigger.serialize()[1], "deadline": deadline_after(0.5) if deadline else None}
    again = await run_trigger_payload(s3_trigger(**kwargs))

    expected = "timeout" if path == "bucket-check" else "success"
    assert (payload["status"], again["status"]) == (expected, expected), (payload, again)
    from_boto = [r for r in caplog.records if r.name.split(".")[0] in ("botocore", "aiobotocore")]
    assert from_boto, "botocore wrote nothing at DEBUG: the test would prove nothing"
    # The endpoint was logged, by the logger that used to write its password (now never given it).
    assert any(r.name == "aiobotocore.regions" and url.netloc in r.getMessage() for r in from_boto)
    leaked = [
        (r.name, r.getMessage()[:200])
        for r in caplog.records
        if any(secret in r.getMessage() for secret in (TOKEN, SECRET, URL_PASSWORD))
    ]
    assert leaked == [], leaked[:3]
    signed = [
        r.getMessage() for r in from_boto if r.name == "botocore.auth" and "x-amz-security-token:" in r.getMessage()
    ]
    assert signed and all("x-amz-security-token:***" in line for line in signed), signed[:1]


def test_every_guarded_logger_masks_a_registered_secret(caplog: pytest.LogCaptureFixture) -> None:
    from airflow_deferrable_kit._redact import guard_loggers, register

    secret = "guarded-logger-secret-5d1e"
    register(secret)
    guard_loggers(CREDENTIAL_LOGGERS)
    caplog.set_level(logging.DEBUG)
    for name in CREDENTIAL_LOGGERS:
        caplog.set_level(logging.DEBUG, logger=name)
        logging.getLogger(name).debug("Endpoint provider result: %s", f"https://user:{secret}@s3.example")
    lines = {r.name: r.getMessage() for r in caplog.records}
    assert set(lines) == set(CREDENTIAL_LOGGERS)
    assert all(line == "Endpoint provider result: https://user:***@s3.example" for line in lines.values()), lines


def test_an_endpoint_s_user_and_password_never_reach_botocore() -> None:
    assert client_endpoint("http://u:p%40ss@127.0.0.1:9000/base") == "http://127.0.0.1:9000/base"
    assert client_endpoint("https://only-user@s3.example") == "https://s3.example"
    assert client_endpoint("https://s3.example/a@b") == "https://s3.example/a@b"
    assert client_endpoint(None) is None
