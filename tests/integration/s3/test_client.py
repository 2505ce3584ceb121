"""The shared client: connections, credentials, one client per process, sockets, the event loop."""

from __future__ import annotations

import asyncio
import contextlib
import gc
import json
import sys
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import psutil
import pytest
from botocore.exceptions import (
    ClientError,
    EndpointConnectionError,
    NoCredentialsError,
    ReadTimeoutError,
    SSLError,
)

from airflow_deferrable_kit._s3 import client, poller
from airflow_deferrable_kit.errors import FatalError, TransientError
from airflow_deferrable_kit.leases import held_keys
from airflow_deferrable_kit.testing import run_trigger_payload
from airflow_deferrable_kit.triggers.s3 import S3KeyTrigger
from scripts import services
from scripts.services import free_port
from tests.integration.s3.conftest import SECRET, put_many
from tests.integration.s3.fault_proxy import FaultProxy, settle


def client_sockets(port: int) -> int:
    """Established TCP connections from this process to ``port``."""
    return sum(
        1
        for c in psutil.Process().net_connections(kind="tcp")
        if c.raddr and c.raddr.port == port and c.status == psutil.CONN_ESTABLISHED
    )


async def drive(trigger: S3KeyTrigger) -> Any:
    """Run a trigger the way the triggerer does: iterate run(), always call cleanup()."""
    try:
        async for event in trigger.run():
            return event.payload
    finally:
        await trigger.cleanup()


# ------------------------------------------------------------------- connection fields
def test_connection_fields_map_to_client_settings() -> None:
    settings = client.options_from_connection(
        "c",
        "AKIAX",
        SECRET,
        {
            "region_name": "eu-west-1",
            "endpoint_url": "http://general:1",
            "service_config": {"s3": {"endpoint_url": "http://s3-only:2"}},
            "aws_session_token": "tok",
            "profile_name": "p",
            "verify": "/etc/ca.pem",
            "config_kwargs": {"s3": {"addressing_style": "path"}},
        },
    )
    assert (settings.region_name, settings.endpoint_url) == ("eu-west-1", "http://s3-only:2")
    assert (settings.access_key_id, settings.secret_access_key, settings.session_token) == ("AKIAX", SECRET, "tok")
    assert (settings.profile_name, settings.verify) == ("p", "/etc/ca.pem")
    assert json.loads(settings.config_json) == {"s3": {"addressing_style": "path"}}
    assert SECRET not in repr(settings) and "tok" not in repr(settings)
    assert SECRET not in repr(settings.lease_key)

    from_extra = client.options_from_connection(
        "c", None, None, {"aws_access_key_id": "AKIAE", "aws_secret_access_key": "s"}
    )
    assert from_extra.explicit_keys and from_extra.access_key_id == "AKIAE"
    chain = client.options_from_connection("c", None, None, {"region_name": "us-east-2"})
    assert not chain.explicit_keys and chain.endpoint_url is None


def test_lease_key_is_per_connection_region_endpoint_and_changes_with_the_secret() -> None:
    def make(**extra: Any) -> Any:
        return client.options_from_connection("c", "AKIAX", extra.pop("secret", SECRET), extra)

    assert make(region_name="us-east-1").lease_key == make(region_name="us-east-1").lease_key
    assert make(region_name="us-east-1").lease_key != make(region_name="eu-west-1").lease_key
    assert make(endpoint_url="http://a").lease_key != make(endpoint_url="http://b").lease_key
    assert make(secret="rotated").lease_key != make().lease_key
    assert make().lease_key[:4] == ("s3", "c", None, None)


@pytest.mark.parametrize(
    ("login", "password", "extra", "error_type", "says"),
    [
        ("AKIAX", SECRET, {"role_arn": "arn:aws:iam::1:role/r"}, "bad_connection", "role assumption"),
        ("AKIAX", None, {}, "authentication", "the password (secret access key) is empty"),
        (None, SECRET, {}, "authentication", "the login (access key id) is empty"),
        ("AKIAX", SECRET, {"region_name": 5}, "bad_connection", "'region_name' must be a string"),
        ("AKIAX", SECRET, {"verify": 3}, "bad_connection", "'verify' must be"),
        ("AKIAX", SECRET, {"config_kwargs": "fast"}, "bad_connection", "'config_kwargs' must be an object"),
    ],
)
def test_unusable_connections_are_fatal(
    login: Any, password: Any, extra: dict[str, Any], error_type: str, says: str
) -> None:
    with pytest.raises(FatalError) as caught:
        client.options_from_connection("c", login, password, extra)
    assert caught.value.error_type == error_type
    assert says in caught.value.message
    assert "aws_conn_id='c'" in caught.value.message
    assert SECRET not in caught.value.message


def test_trigger_kwargs_round_trip_and_hold_no_secret() -> None:
    for trigger in (
        S3KeyTrigger(bucket_key="s3://bk1/k", aws_conn_id="c"),
        S3KeyTrigger(bucket_key=["a/*.csv", "s3://bk1/x"], bucket_name="bk1", wildcard_match=True, min_size=5),
        S3KeyTrigger(
            bucket_key="k", bucket_name="bk1", aws_conn_id=None, poll_interval=5.5, deadline="2030-01-01T00:00:00+00:00"
        ),
    ):
        classpath, kwargs = trigger.serialize()
        assert classpath == "airflow_deferrable_kit.triggers.s3.S3KeyTrigger"
        assert json.loads(json.dumps(kwargs)) == kwargs
        assert S3KeyTrigger(**kwargs) == trigger
        assert S3KeyTrigger(**kwargs).serialize() == (classpath, kwargs)
        assert not {"login", "password", "secret", "token"} & {k.lower() for k in kwargs}


@pytest.mark.parametrize(
    ("kwargs", "argument"),
    [
        ({"bucket_key": "k"}, "bucket_name is required"),
        ({"bucket_key": []}, "bucket_key"),
        ({"bucket_key": ["ok", 3], "bucket_name": "bkt"}, "bucket_key"),
        ({"bucket_key": "s3://only-bucket"}, "bucket_key"),
        ({"bucket_key": "gs://b/k"}, "bucket_key"),
        ({"bucket_key": "s3://bk1/k", "bucket_name": "bk2"}, "bucket_name"),
        ({"bucket_key": "k", "bucket_name": ""}, "bucket_name"),
        ({"bucket_key": "k", "bucket_name": "bkt", "wildcard_match": "yes"}, "wildcard_match"),
        ({"bucket_key": "k", "bucket_name": "bkt", "min_size": -1}, "min_size"),
        ({"bucket_key": "k", "bucket_name": "bkt", "min_size": True}, "min_size"),
        ({"bucket_key": "k", "bucket_name": "bkt", "aws_conn_id": ""}, "aws_conn_id"),
        ({"bucket_key": "k", "bucket_name": "bkt", "poll_interval": 0}, "poll_interval"),
    ],
)
def test_bad_arguments_are_named(kwargs: dict[str, Any], argument: str) -> None:
    with pytest.raises(ValueError, match=argument):
        S3KeyTrigger(**kwargs)


# ---------------------------------------------------------------- error classification
def client_error(code: str, status: int, op: str = "HeadObject", headers: dict[str, str] | None = None) -> ClientError:
    response: Any = {
        "Error": {"Code": code, "Message": "m"},
        "ResponseMetadata": {"HTTPStatusCode": status, "HTTPHeaders": headers or {}},
    }
    return ClientError(response, op)


@pytest.mark.parametrize(
    ("code", "status", "kind", "error_type", "says"),
    [
        ("SlowDown", 503, TransientError, "throttled", "throttled"),
        ("503", 503, TransientError, "throttled", "throttled"),
        ("ThrottlingException", 400, TransientError, "throttled", "throttled"),
        ("429", 429, TransientError, "throttled", "throttled"),
        ("InternalError", 500, TransientError, "unavailable", "server error"),
        ("502", 502, TransientError, "unavailable", "server error"),
        ("RequestTimeout", 400, TransientError, "unavailable", "server error"),
        ("NoSuchBucket", 404, FatalError, "not_found", "the bucket does not exist"),
        ("AccessDenied", 403, FatalError, "authorization", "access denied"),
        ("403", 403, FatalError, "authorization", "access denied or credentials rejected"),
        ("InvalidAccessKeyId", 403, FatalError, "authentication", "the credentials were rejected"),
        ("SignatureDoesNotMatch", 403, FatalError, "authentication", "the credentials were rejected"),
        ("ExpiredToken", 400, FatalError, "authentication", "the credentials were rejected"),
        ("InvalidArgument", 400, FatalError, "bad_request", "InvalidArgument (m) (HTTP 400)"),
    ],
)
def test_client_errors_are_classified(code: str, status: int, kind: type, error_type: str, says: str) -> None:
    error = client.classify_s3_error(client_error(code, status), what="HEAD s3://b/k", where="aws_conn_id='c'")
    assert type(error) is kind
    assert error.error_type == error_type
    assert "HEAD s3://b/k" in error.message and says in error.message


def test_retry_after_is_honoured() -> None:
    slow_down = client_error("SlowDown", 503, headers={"retry-after": "2"})
    error = client.classify_s3_error(slow_down, what="LIST s3://b/", where="aws_conn_id='c'")
    assert isinstance(error, TransientError) and error.retry_after == 2.0


def test_botocore_errors_are_classified() -> None:
    trigger = S3KeyTrigger(bucket_key="s3://bkt/k", aws_conn_id="c")
    transient = [EndpointConnectionError(endpoint_url="http://x"), ReadTimeoutError(endpoint_url="http://x")]
    assert all(isinstance(trigger.classify_error(e), TransientError) for e in transient)
    assert trigger.classify_error(NoCredentialsError()).error_type == "authentication"
    assert trigger.classify_error(SSLError(endpoint_url="http://x", error="bad cert")).error_type == "tls"
    assert trigger.classify_error(client_error("AccessDenied", 403)).error_type == "authorization"


def test_our_own_errors_and_other_exceptions_are_left_to_the_base_trigger() -> None:
    assert client.classify_s3_error(ValueError("not botocore's"), what="HEAD s3://b/k", where="c") is None
    ours = FatalError("s3://b: the bucket does not exist", error_type="not_found")
    assert S3KeyTrigger(bucket_key="s3://bkt/k", aws_conn_id="c").classify_error(ours) is ours


# ------------------------------------------------------------------ connections, live
async def test_unknown_connection_is_fatal() -> None:
    payload = await run_trigger_payload(S3KeyTrigger(bucket_key="s3://bkt/k", aws_conn_id="adk_missing_conn"))
    assert (payload["status"], payload["error_type"]) == ("error", "connection_not_found")
    assert "adk_missing_conn" in payload["message"]


async def test_waits_on_one_connection_keep_one_settings_and_a_changed_connection_gets_new_ones(
    make_conn: Any, s3_server: services.S3Server
) -> None:
    conn_id = make_conn(s3_server.endpoint_url)
    first, second = await client.load_options(conn_id), await client.load_options(conn_id)
    assert first is second  # equal reads share one instance (10,000 waits keep one, not 10,000)
    make_conn(s3_server.endpoint_url, password="rotated-secret")
    rotated = await client.load_options(conn_id)
    assert rotated is not first and rotated.secret_access_key == "rotated-secret"
    assert rotated.lease_key != first.lease_key  # so the rotated key gets a client of its own
    assert (await client.load_options(None)) is (await client.load_options(None))


async def test_role_arn_is_reported_as_unsupported(make_conn: Any, s3_server: services.S3Server) -> None:
    conn_id = make_conn(s3_server.endpoint_url, role_arn="arn:aws:iam::123456789012:role/r")
    payload = await run_trigger_payload(S3KeyTrigger(bucket_key="s3://bkt/k", aws_conn_id=conn_id))
    assert (payload["status"], payload["error_type"]) == ("error", "bad_connection")
    assert "role assumption (extra.role_arn) is not supported" in payload["message"]


async def test_service_endpoint_and_config_kwargs_are_used(
    admin: Any, bucket: str, make_conn: Any, s3_server: services.S3Server
) -> None:
    await admin.put_object(Bucket=bucket, Key="k", Body=b"1")
    conn_id = make_conn(
        f"http://127.0.0.1:{free_port()}",  # nothing listens here: the s3 endpoint must win
        service_config={"s3": {"endpoint_url": s3_server.endpoint_url}},
        config_kwargs={"s3": {"addressing_style": "path"}},
        aws_session_token="session-token-value",
    )
    payload = await run_trigger_payload(S3KeyTrigger(bucket_key=f"s3://{bucket}/k", aws_conn_id=conn_id))
    assert payload["status"] == "success"


async def test_invalid_config_kwargs_are_fatal(make_conn: Any, s3_server: services.S3Server) -> None:
    conn_id = make_conn(s3_server.endpoint_url, config_kwargs={"no_such_option": 1})
    payload = await run_trigger_payload(S3KeyTrigger(bucket_key="s3://bkt/k", aws_conn_id=conn_id))
    assert (payload["status"], payload["error_type"]) == ("error", "bad_connection")


def isolate_from_aws_config(monkeypatch: pytest.MonkeyPatch, tmp_path: Any) -> None:
    for name in (
        "AWS_ACCESS_KEY_ID",
        "AWS_SECRET_ACCESS_KEY",
        "AWS_SESSION_TOKEN",
        "AWS_PROFILE",
        "AWS_DEFAULT_PROFILE",
        "AWS_WEB_IDENTITY_TOKEN_FILE",
        "AWS_ROLE_ARN",
        "AWS_CONTAINER_CREDENTIALS_RELATIVE_URI",
        "AWS_CONTAINER_CREDENTIALS_FULL_URI",
    ):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "no-credentials"))
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "no-config"))
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")


async def test_connection_without_keys_uses_the_default_chain(
    admin: Any,
    bucket: str,
    make_conn: Any,
    s3_server: services.S3Server,
    iam_user: Any,
    moto_auth: Any,
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Any,
) -> None:
    await admin.put_object(Bucket=bucket, Key="k", Body=b"1")
    key_id, secret = await iam_user(
        policy={"Version": "2012-10-17", "Statement": [{"Effect": "Allow", "Action": "s3:*", "Resource": "*"}]}
    )
    isolate_from_aws_config(monkeypatch, tmp_path)
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", key_id)
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", secret)
    conn_id = make_conn(s3_server.endpoint_url, login=None, password=None)
    moto_auth()  # from here on only a real key pair works: the one in the environment

    payload = await run_trigger_payload(S3KeyTrigger(bucket_key=f"s3://{bucket}/k", aws_conn_id=conn_id))
    assert payload["status"] == "success"


async def test_no_credentials_anywhere_is_fatal(
    make_conn: Any, s3_server: services.S3Server, monkeypatch: pytest.MonkeyPatch, tmp_path: Any
) -> None:
    isolate_from_aws_config(monkeypatch, tmp_path)
    conn_id = make_conn(s3_server.endpoint_url, login=None, password=None)
    payload = await run_trigger_payload(S3KeyTrigger(bucket_key="s3://bkt/k", aws_conn_id=conn_id))
    assert (payload["status"], payload["error_type"]) == ("error", "authentication")
    assert "no AWS credentials found" in payload["message"]
    assert conn_id in payload["message"]


async def test_undefined_aws_default_falls_back_to_the_default_chain(
    admin: Any, bucket: str, s3_server: services.S3Server, monkeypatch: pytest.MonkeyPatch, tmp_path: Any
) -> None:
    await admin.put_object(Bucket=bucket, Key="k", Body=b"1")
    isolate_from_aws_config(monkeypatch, tmp_path)
    monkeypatch.delenv("AIRFLOW_CONN_AWS_DEFAULT", raising=False)
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "AKIAENV")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "env-secret")
    monkeypatch.setenv("AWS_DEFAULT_REGION", "us-east-1")
    monkeypatch.setenv("AWS_ENDPOINT_URL_S3", s3_server.endpoint_url)
    payload = await run_trigger_payload(S3KeyTrigger(bucket_key=f"s3://{bucket}/k", poll_interval=0.05))
    assert payload["status"] == "success"


# ------------------------------------------------------------- sharing, sockets, loop
async def test_many_triggers_share_one_client(
    admin: Any, bucket: str, proxy: FaultProxy, proxy_conn: str, make_conn: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    created: list[Any] = []
    real_create = poller.new_client

    async def counting_create(settings: Any) -> Any:
        made = await real_create(settings)
        created.append(settings.conn_id)
        return made

    monkeypatch.setattr(poller, "new_client", counting_create)
    other_conn = make_conn(proxy.url, conn_id="s3_test_other")
    n = 50
    triggers = [
        S3KeyTrigger(bucket_key=f"s3://{bucket}/shared/{i}.csv", aws_conn_id=proxy_conn, poll_interval=0.05)
        for i in range(n)
    ] + [S3KeyTrigger(bucket_key=f"s3://{bucket}/shared/0.csv", aws_conn_id=other_conn, poll_interval=0.05)]
    tasks = [asyncio.create_task(drive(t)) for t in triggers]

    await settle(lambda: sorted(held_keys().values()) == [1, n])
    await settle(lambda: proxy.count("HEAD") >= 3 * n)
    assert sorted(created) == sorted([proxy_conn, other_conn])  # one client per connection, not per trigger
    assert len(proxy.peers) <= 2 * client.DEFAULT_CONFIG["max_pool_connections"]

    await put_many(admin, bucket, [f"shared/{i}.csv" for i in range(n)])
    payloads = await asyncio.gather(*tasks)
    assert [p["status"] for p in payloads] == ["success"] * (n + 1)
    assert held_keys() == {}
    await settle(lambda: client_sockets(proxy.port) == 0)


async def test_cancellation_releases_the_client_and_its_sockets(
    bucket: str, proxy: FaultProxy, proxy_conn: str
) -> None:
    n = 20
    triggers = [
        S3KeyTrigger(bucket_key=f"s3://{bucket}/never/{i}", aws_conn_id=proxy_conn, poll_interval=0.05)
        for i in range(n)
    ]
    tasks = [asyncio.create_task(drive(t)) for t in triggers]
    await settle(lambda: proxy.count("HEAD") >= 2 * n)
    assert list(held_keys().values()) == [n]
    assert client_sockets(proxy.port) > 0  # keep-alive connections to the proxy are open

    for task in tasks:
        task.cancel()
    results = await asyncio.gather(*tasks, return_exceptions=True)
    assert all(isinstance(r, asyncio.CancelledError) for r in results)

    assert held_keys() == {}
    await settle(lambda: client_sockets(proxy.port) == 0 and proxy.open_connections == 0)


#: Audit events that mean synchronous disk, DNS, sleeping or process work.
BLOCKING_EVENTS = frozenset(
    {
        "open",
        "import",
        "os.listdir",
        "os.scandir",
        "socket.getaddrinfo",
        "socket.gethostbyname",
        "subprocess.Popen",
        "time.sleep",
        "socket.connect",
    }
)
_loop_io: dict[str, Any] = {"thread": None, "events": []}


def _audit(event: str, args: tuple[Any, ...]) -> None:
    if _loop_io["thread"] != threading.get_ident() or event not in BLOCKING_EVENTS:
        return
    if event == "open" and str(args[0]).endswith(".py"):
        return  # asyncio debug mode reading source lines for its own tracebacks
    if event == "socket.connect" and not args[0].getblocking():
        return  # the event loop's own non-blocking connect
    _loop_io["events"].append((event, str(args[0])[:120]))


@contextlib.contextmanager
def blocking_calls_on_this_thread() -> Iterator[list[tuple[str, str]]]:
    """Record file opens, imports, DNS lookups, sleeps, blocking connects and subprocesses made
    by the calling thread (deterministic: it counts calls, it does not time anything)."""
    if not _loop_io.get("installed"):
        sys.addaudithook(_audit)  # cannot be removed: it is inert unless a thread is armed
        _loop_io["installed"] = True
    _loop_io["events"] = events = []
    _loop_io["thread"] = threading.get_ident()
    try:
        yield events
    finally:
        _loop_io["thread"] = None


@contextlib.contextmanager
def loop_cpu_per_callback(
    threshold: float, clock: Callable[[], float] = time.thread_time
) -> Iterator[list[tuple[float, str]]]:
    """Record every event-loop callback that used more than ``threshold`` s of the loop thread's CPU
    (``clock=time.process_time``: of the whole process's, so that a thread holding the GIL while
    the callback waits for it counts too).

    CPU time, unlike wall time, does not count the moments the OS gives the core to another
    process, so a loaded 2-core host cannot make a cheap callback look like a blocking one.
    """
    heavy: list[tuple[float, str]] = []
    original = asyncio.events.Handle._run

    def timed_run(handle: asyncio.Handle) -> None:
        start = clock()
        original(handle)
        used = clock() - start
        if used > threshold:
            heavy.append((round(used, 3), repr(handle)[:200]))

    asyncio.events.Handle._run = timed_run  # type: ignore[method-assign]
    try:
        yield heavy
    finally:
        asyncio.events.Handle._run = original  # type: ignore[method-assign]


async def cold_start(count: int, connections: int, bucket: str, make_conn: Any, endpoint: str) -> list[S3KeyTrigger]:
    """Triggers over ``connections`` new connections, with the botocore models not yet parsed."""
    conn_ids = [make_conn(endpoint, conn_id=f"s3_cold_{i}") for i in range(connections)]
    # Airflow's own first connection lookup in a process imports its secrets machinery on the
    # loop; a running triggerer has done that long before. Do it here, outside the measurement.
    await client.load_options(conn_ids[0])
    return [
        S3KeyTrigger(bucket_key=f"s3://{bucket}/ready.csv", aws_conn_id=conn_ids[i % connections], poll_interval=0.05)
        for i in range(count)
    ]


@contextlib.contextmanager
def collector_paused() -> Iterator[None]:
    """A full collection of this process's heap (Airflow + pytest) holds the GIL for ~0.35 s here,
    whoever happens to allocate; pause it so a measurement is of our code, not of the collector."""
    gc.collect()
    gc.disable()
    try:
        yield
    finally:
        gc.enable()


async def test_two_hundred_triggers_start_without_blocking_the_loop(
    admin: Any, bucket: str, make_conn: Any, s3_server: services.S3Server, monkeypatch: pytest.MonkeyPatch
) -> None:
    await admin.put_object(Bucket=bucket, Key="ready.csv", Body=b"ok")
    # Cold start: forget the parsed botocore models so they are parsed again (in the builder
    # thread). aiobotocore itself is already imported by the admin fixture: this environment runs
    # with PYTHONDONTWRITEBYTECODE, so a first import compiles every module, which says nothing
    # about the trigger (with .pyc files the threaded import holds the loop for ~10 ms at most).
    monkeypatch.setattr(client, "_loaders", {})
    triggers = await cold_start(200, 4, bucket, make_conn, s3_server.endpoint_url)

    with collector_paused(), loop_cpu_per_callback(0.05) as heavy, blocking_calls_on_this_thread() as calls:
        payloads = await asyncio.gather(*(run_trigger_payload(t, timeout=60) for t in triggers))

    assert heavy == []  # no callback computed on the loop for more than 50 ms
    assert calls == []  # no file, import, DNS, sleep, blocking socket or subprocess on the loop
    assert [p["status"] for p in payloads] == ["success"] * 200
    assert held_keys() == {}


async def test_a_cold_client_build_never_holds_the_loop_with_the_gil(
    admin: Any, bucket: str, make_conn: Any, s3_server: services.S3Server, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The same cold start, counting the CPU of the whole process during each loop callback: the
    builder thread parsing botocore's models holds the GIL, and a loop callback that waits for
    it that long is held by the build even though the loop thread itself computes nothing.

    CPU, not wall time: on a loaded 2-core host the builder thread can lose its core while it
    holds the GIL, and a wall-clock view (``watch_blocking``) then reports the loop waiting for a
    thread that was not computing (seen at 0.061 s, with 0.000 s of CPU on the loop thread).
    """
    await admin.put_object(Bucket=bucket, Key="ready.csv", Body=b"ok")
    monkeypatch.setattr(client, "_loaders", {})
    triggers = await cold_start(20, 1, bucket, make_conn, s3_server.endpoint_url)

    with (
        collector_paused(),
        loop_cpu_per_callback(0.05, clock=time.process_time) as held,
        blocking_calls_on_this_thread() as calls,
    ):
        payloads = await asyncio.gather(*(run_trigger_payload(t, timeout=60) for t in triggers))

    assert held == []  # no callback held the loop while the process computed 50 ms, GIL holders included
    assert calls == []
    assert [p["status"] for p in payloads] == ["success"] * 20
