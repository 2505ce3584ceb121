"""botocore and aiobotocore at DEBUG: no credential of the connection in any line they write.

botocore logs the canonical request and the headers it signs at DEBUG (``botocore.auth``,
``botocore.endpoint``), which hold the session token; an operator debugging S3 turns exactly
these loggers on. Every record of every logger is read, HEAD and listing paths both.
"""

from __future__ import annotations

import logging
from typing import Any

import pytest

from airflow_deferrable_kit.testing import run_trigger_payload
from tests.s3.conftest import SECRET
from tests.s3.test_trigger import s3_trigger

TOKEN = "IQoJb3JpZ2luX2VjEXAMPLE-session-token-value"


@pytest.mark.parametrize("wildcard", [False, True], ids=["head", "listing"])
async def test_no_credential_reaches_botocores_debug_log(
    admin: Any, bucket: str, make_conn: Any, s3_server: Any, caplog: pytest.LogCaptureFixture, wildcard: bool
) -> None:
    await admin.put_object(Bucket=bucket, Key="debug/a.csv", Body=b"a")
    conn_id = make_conn(s3_server.endpoint_url, conn_id="s3_debugging", aws_session_token=TOKEN)
    key = f"s3://{bucket}/debug/{'*' if wildcard else 'a'}.csv"
    caplog.set_level(logging.DEBUG)
    for name in ("botocore", "aiobotocore", "aiohttp"):
        caplog.set_level(logging.DEBUG, logger=name)
    payload = await run_trigger_payload(s3_trigger(bucket_key=key, wildcard_match=wildcard, aws_conn_id=conn_id))
    assert payload["status"] == "success", payload
    from_boto = [r for r in caplog.records if r.name.split(".")[0] in ("botocore", "aiobotocore")]
    assert from_boto, "botocore wrote nothing at DEBUG: the test would prove nothing"
    lines = [r.getMessage() for r in caplog.records]
    leaked = [line for line in lines if TOKEN in line or SECRET in line]
    assert leaked == [], leaked[:3]
    signed = [
        r.getMessage() for r in from_boto if r.name == "botocore.auth" and "x-amz-security-token:" in r.getMessage()
    ]
    assert signed and all("x-amz-security-token:***" in line for line in signed), signed[:1]
