"""Fixtures for the S3 wait: a bucket on the real S3 API server, connections, the fault proxy."""

from __future__ import annotations

import json
import urllib.request
import uuid
from collections.abc import AsyncIterator, Callable, Iterator
from typing import Any

import pytest

from airflow_deferrable_kit._s3.client import S3Options, new_client
from scripts import services
from tests.integration.s3.fault_proxy import FaultProxy

SECRET = "s3-test-secret-DO-NOT-LEAK-7f3a"
CONN_ID = "s3_test"


def admin_settings(endpoint_url: str, key: str = "test", secret: str = "test") -> S3Options:
    return S3Options(
        conn_id="admin", region_name="us-east-1", endpoint_url=endpoint_url, access_key_id=key, secret_access_key=secret
    )


@pytest.fixture
async def admin(s3_server: services.S3Server) -> AsyncIterator[Any]:
    """A plain client to set the stage (create buckets, put objects) on the real server."""
    client = await new_client(admin_settings(s3_server.endpoint_url))
    try:
        yield client
    finally:
        await client.close()


@pytest.fixture
async def bucket(admin: Any) -> str:
    name = f"adk-{uuid.uuid4().hex[:12]}"
    await admin.create_bucket(Bucket=name)
    return name


@pytest.fixture
def make_conn(monkeypatch: pytest.MonkeyPatch) -> Callable[..., str]:
    """Define an Airflow ``aws`` connection in the environment; returns its id."""

    def make(
        endpoint_url: str | None,
        *,
        conn_id: str = CONN_ID,
        login: str | None = "AKIATESTKEY",
        password: str | None = SECRET,
        **extra: Any,
    ) -> str:
        if endpoint_url is not None:
            extra.setdefault("endpoint_url", endpoint_url)
        extra.setdefault("region_name", "us-east-1")
        conn = {"conn_type": "aws", "login": login, "password": password, "extra": extra}
        monkeypatch.setenv(f"AIRFLOW_CONN_{conn_id.upper()}", json.dumps(conn))
        return conn_id

    return make


@pytest.fixture
def moto_conn(make_conn: Callable[..., str], s3_server: services.S3Server) -> str:
    return make_conn(s3_server.endpoint_url)


@pytest.fixture
async def proxy(s3_server: services.S3Server) -> AsyncIterator[FaultProxy]:
    server = FaultProxy(s3_server.endpoint_url)
    await server.start()
    try:
        yield server
    finally:
        await server.stop()


@pytest.fixture
def proxy_conn(make_conn: Callable[..., str], proxy: FaultProxy) -> str:
    return make_conn(proxy.url)


def _moto_auth(endpoint_url: str, value: str) -> None:
    request = urllib.request.Request(
        f"{endpoint_url}/moto-api/reset-auth",
        data=value.encode(),
        method="POST",
        headers={"Content-Type": "text/plain"},
    )
    with urllib.request.urlopen(request, timeout=10) as response:
        assert response.status == 200


@pytest.fixture
def moto_auth(s3_server: services.S3Server) -> Iterator[Callable[[], None]]:
    """Call the yielded function to make the server check credentials and IAM policies.

    Authorization stays off for everyone else: it is switched back off after the test.
    """
    try:
        yield lambda: _moto_auth(s3_server.endpoint_url, "0")
    finally:
        _moto_auth(s3_server.endpoint_url, "inf")


async def put_many(admin: Any, bucket: str, keys: list[str], body: bytes = b"x", concurrency: int = 32) -> None:
    """Put many small objects concurrently."""
    import asyncio

    gate = asyncio.Semaphore(concurrency)

    async def put(key: str) -> None:
        async with gate:
            await admin.put_object(Bucket=bucket, Key=key, Body=body)

    await asyncio.gather(*(put(key) for key in keys))


@pytest.fixture
async def iam_user(s3_server: services.S3Server) -> Callable[..., Any]:
    """Make an IAM user on the server (before auth is switched on); returns its key pair."""
    from aiobotocore.session import get_session

    async def make(policy: dict[str, Any] | None) -> tuple[str, str]:
        name = f"adk-{uuid.uuid4().hex[:8]}"
        async with get_session().create_client(
            "iam",
            endpoint_url=s3_server.endpoint_url,
            region_name="us-east-1",
            aws_access_key_id="test",
            aws_secret_access_key="test",
        ) as iam:
            await iam.create_user(UserName=name)
            if policy is not None:
                await iam.put_user_policy(UserName=name, PolicyName="p", PolicyDocument=json.dumps(policy))
            key = (await iam.create_access_key(UserName=name))["AccessKey"]
        return key["AccessKeyId"], key["SecretAccessKey"]

    return make
