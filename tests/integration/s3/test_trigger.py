"""S3KeyTrigger against a real S3 API server (moto) over HTTP, with a fault proxy where needed."""

from __future__ import annotations

import asyncio
import datetime as dt
import json
import urllib.parse
from typing import Any

import pytest

from airflow_deferrable_kit.payload import MAX_PAYLOAD_BYTES, build_payload
from airflow_deferrable_kit.testing import run_trigger_payload
from airflow_deferrable_kit.triggers import s3 as s3_triggers
from airflow_deferrable_kit.triggers.base import deadline_after
from airflow_deferrable_kit.triggers.s3 import MAX_LISTED_KEYS, S3KeyTrigger, keys_payload
from tests.integration.s3.conftest import SECRET, put_many
from tests.integration.s3.fault_proxy import FaultProxy, settle


def s3_trigger(**kwargs: Any) -> S3KeyTrigger:
    kwargs.setdefault("poll_interval", 0.05)
    kwargs.setdefault("max_backoff", 0.2)
    return S3KeyTrigger(**kwargs)


class RecordingTrigger(S3KeyTrigger):
    """Records each backoff the base computes, so tests count attempts instead of timing them."""

    def backoff_delay(self, failures: int, retry_after: float | None = None) -> float:
        delay = super().backoff_delay(failures, retry_after)
        self.__dict__.setdefault("delays", []).append((failures, delay))
        return delay


# ------------------------------------------------------------------------------ success
async def test_single_key_payload_describes_the_object(admin: Any, bucket: str, moto_conn: str) -> None:
    await admin.put_object(Bucket=bucket, Key="data/one.csv", Body=b"hello")
    head = await admin.head_object(Bucket=bucket, Key="data/one.csv")

    payload = await run_trigger_payload(
        s3_trigger(bucket_key="data/one.csv", bucket_name=bucket, aws_conn_id=moto_conn)
    )

    assert payload == {
        "status": "success",
        "keys": [
            {
                "bucket": bucket,
                "key": "data/one.csv",
                "size": 5,
                "etag": head["ETag"].strip('"'),
                "last_modified": head["LastModified"].isoformat(),
            }
        ],
        "keys_not_listed": 0,
    }
    assert dt.datetime.fromisoformat(payload["keys"][0]["last_modified"]).utcoffset() == dt.timedelta(0)
    assert SECRET not in json.dumps(payload)


async def test_uri_key_needs_no_bucket_name(admin: Any, bucket: str, moto_conn: str) -> None:
    await admin.put_object(Bucket=bucket, Key="deep/er/file.parquet", Body=b"p")
    payload = await run_trigger_payload(
        s3_trigger(bucket_key=f"s3://{bucket}/deep/er/file.parquet", aws_conn_id=moto_conn)
    )
    assert [(k["bucket"], k["key"]) for k in payload["keys"]] == [(bucket, "deep/er/file.parquet")]


async def test_not_yet_then_success(admin: Any, bucket: str, proxy: FaultProxy, proxy_conn: str) -> None:
    task = asyncio.create_task(
        run_trigger_payload(s3_trigger(bucket_key=f"s3://{bucket}/later.json", aws_conn_id=proxy_conn))
    )
    await settle(lambda: proxy.count("HEAD") >= 4)
    assert not task.done()

    await admin.put_object(Bucket=bucket, Key="later.json", Body=b"{}")
    payload = await task

    assert payload["status"] == "success"
    assert payload["keys"][0]["key"] == "later.json"
    object_heads = [s for s in proxy.seen if s.path == f"/{bucket}/later.json"]
    assert [s.status for s in object_heads[:-1]] == [404] * (len(object_heads) - 1)
    assert object_heads[-1].status == 200
    # A 404 cannot tell a missing key from a missing bucket: the bucket is checked once, not per poll.
    assert [s.status for s in proxy.seen if s.path == f"/{bucket}"] == [200]


async def test_list_of_keys_waits_for_all_and_rechecks_the_missing_one_first(
    admin: Any, bucket: str, proxy: FaultProxy, proxy_conn: str
) -> None:
    keys = ["batch/a.csv", "batch/b.csv", "batch/c.csv"]
    await admin.put_object(Bucket=bucket, Key="batch/a.csv", Body=b"a")
    await admin.put_object(Bucket=bucket, Key="batch/c.csv", Body=b"cc")
    task = asyncio.create_task(
        run_trigger_payload(s3_trigger(bucket_key=keys, bucket_name=bucket, aws_conn_id=proxy_conn))
    )
    await settle(lambda: proxy.count("HEAD") >= 6)
    assert not task.done()

    await admin.put_object(Bucket=bucket, Key="batch/b.csv", Body=b"bbb")
    payload = await task

    assert [(k["key"], k["size"]) for k in payload["keys"]] == [
        ("batch/a.csv", 1),
        ("batch/b.csv", 3),
        ("batch/c.csv", 2),
    ]
    heads = {key: sum(1 for s in proxy.seen if s.path == f"/{bucket}/{key}") for key in keys}
    # Poll 1: a (found), b (missing, stop). Later polls start at b; the final one sees b, c, a.
    assert heads["batch/a.csv"] == 2
    assert heads["batch/c.csv"] == 1
    assert heads["batch/b.csv"] >= 3


async def test_wildcard_pages_through_more_than_1000_objects(
    admin: Any, bucket: str, proxy: FaultProxy, proxy_conn: str
) -> None:
    parts = [f"logs/part-{i:05d}.txt" for i in range(1001)]  # S3 pages hold 1,000 keys
    await put_many(admin, bucket, [*parts, "logs/zz/_SUCCESS"])

    marker = await run_trigger_payload(
        s3_trigger(bucket_key="logs/*/_SUCCESS", bucket_name=bucket, wildcard_match=True, aws_conn_id=proxy_conn)
    )
    assert [k["key"] for k in marker["keys"]] == ["logs/zz/_SUCCESS"]  # it sits on the second page
    lists = [s for s in proxy.seen if s.method == "GET"]
    assert len(lists) == 2

    many = await run_trigger_payload(
        s3_trigger(bucket_key=f"s3://{bucket}/logs/part-*.txt", wildcard_match=True, aws_conn_id=proxy_conn)
    )
    assert len(many["keys"]) == MAX_LISTED_KEYS
    assert many["keys"][0]["key"] == "logs/part-00000.txt"
    assert many["keys_not_listed"] == 1001 - MAX_LISTED_KEYS
    assert len(json.dumps(many)) < MAX_PAYLOAD_BYTES


async def test_wildcard_matches_nested_keys_from_the_literal_prefix(
    admin: Any, bucket: str, proxy: FaultProxy, proxy_conn: str
) -> None:
    await put_many(
        admin,
        bucket,
        ["nested/2024/01/02/data_1.json", "nested/2024/01/02/other.txt", "nested/data_0.json", "elsewhere/data_9.json"],
    )
    payload = await run_trigger_payload(
        s3_trigger(bucket_key="nested/*/data_*.json", bucket_name=bucket, wildcard_match=True, aws_conn_id=proxy_conn)
    )
    assert [k["key"] for k in payload["keys"]] == ["nested/2024/01/02/data_1.json"]
    (listing,) = [s for s in proxy.seen if s.method == "GET"]
    query = urllib.parse.parse_qs(urllib.parse.urlsplit(f"http://x{listing.path}").query) or {}
    assert listing.path.startswith(f"/{bucket}")
    assert "delimiter" not in query  # no delimiter: keys at any depth are listed


async def test_wildcard_list_needs_every_pattern_and_dedupes(
    admin: Any, bucket: str, proxy: FaultProxy, proxy_conn: str
) -> None:
    await put_many(admin, bucket, ["in/a.csv", "in/b.csv"])
    waiting = asyncio.create_task(
        run_trigger_payload(
            s3_trigger(
                bucket_key=["in/*.csv", "in/a.*", "out/*.done"],
                bucket_name=bucket,
                wildcard_match=True,
                aws_conn_id=proxy_conn,
            )
        )
    )
    await settle(lambda: proxy.count("GET") >= 6)  # two polls of three listings each
    assert not waiting.done()
    await admin.put_object(Bucket=bucket, Key="out/run.done", Body=b"")
    payload = await waiting
    assert [k["key"] for k in payload["keys"]] == ["in/a.csv", "in/b.csv", "out/run.done"]
    assert payload["keys_not_listed"] == 0


async def test_min_size_waits_for_a_big_enough_object(
    admin: Any, bucket: str, proxy: FaultProxy, proxy_conn: str
) -> None:
    await admin.put_object(Bucket=bucket, Key="sized/file.bin", Body=b"abc")
    task = asyncio.create_task(
        run_trigger_payload(
            s3_trigger(bucket_key="sized/file.bin", bucket_name=bucket, min_size=10, aws_conn_id=proxy_conn)
        )
    )
    await settle(lambda: proxy.count("HEAD") >= 3)
    assert not task.done()
    assert all(s.status == 200 for s in proxy.seen)  # it exists, it is just too small

    await admin.put_object(Bucket=bucket, Key="sized/file.bin", Body=b"x" * 20)
    payload = await task
    assert payload["keys"][0]["size"] == 20


async def test_min_size_filters_wildcard_matches(admin: Any, bucket: str, moto_conn: str) -> None:
    await admin.put_object(Bucket=bucket, Key="sized/small.bin", Body=b"abc")
    await admin.put_object(Bucket=bucket, Key="sized/big.bin", Body=b"x" * 20)
    payload = await run_trigger_payload(
        s3_trigger(
            bucket_key="sized/*.bin", bucket_name=bucket, wildcard_match=True, min_size=10, aws_conn_id=moto_conn
        )
    )
    assert [(k["key"], k["size"]) for k in payload["keys"]] == [("sized/big.bin", 20)]


async def test_explicit_key_list_payload_is_capped(
    admin: Any, bucket: str, moto_conn: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(s3_triggers, "MAX_LISTED_KEYS", 3)  # the real cap (100) is checked with the wildcard
    keys = [f"many/{i:03d}" for i in range(5)]
    await put_many(admin, bucket, keys)
    payload = await run_trigger_payload(s3_trigger(bucket_key=keys, bucket_name=bucket, aws_conn_id=moto_conn))
    assert [k["key"] for k in payload["keys"]] == keys[:3]
    assert payload["keys_not_listed"] == 2


def test_payload_stays_under_the_size_limit_with_long_keys() -> None:
    objects = [
        {
            "bucket": "b",
            "key": f"{i:04d}" + "k" * 1000,
            "size": 1,
            "etag": "e" * 32,
            "last_modified": "2024-01-01T00:00:00+00:00",
        }
        for i in range(150)
    ]
    data = keys_payload(objects, total=150)
    assert 0 < len(data["keys"]) < MAX_LISTED_KEYS
    assert data["keys_not_listed"] == 150 - len(data["keys"])
    assert len(json.dumps(build_payload("success", data))) <= MAX_PAYLOAD_BYTES


# ------------------------------------------------------------------------------- errors
async def test_missing_bucket_is_fatal_on_the_head_path(proxy: FaultProxy, proxy_conn: str) -> None:
    payload = await run_trigger_payload(s3_trigger(bucket_key="s3://adk-no-such-bucket/x.csv", aws_conn_id=proxy_conn))
    assert payload["status"] == "error"
    assert payload["error_type"] == "not_found"
    assert "adk-no-such-bucket" in payload["message"]
    assert [(s.method, s.status) for s in proxy.seen] == [("HEAD", 404), ("HEAD", 404)]  # key, then bucket


async def test_missing_bucket_is_fatal_on_the_list_path(proxy: FaultProxy, proxy_conn: str) -> None:
    payload = await run_trigger_payload(
        s3_trigger(bucket_key="s3://adk-no-such-bucket/x/*.csv", wildcard_match=True, aws_conn_id=proxy_conn)
    )
    assert (payload["status"], payload["error_type"]) == ("error", "not_found")
    assert "the bucket does not exist" in payload["message"]
    assert "NoSuchBucket" in payload["message"]
    assert len(proxy.seen) == 1


@pytest.mark.parametrize(
    ("status", "code", "wildcard"),
    [(503, "SlowDown", False), (503, "SlowDown", True), (500, "InternalError", True)],
)
async def test_burst_of_server_errors_backs_off_then_succeeds(
    admin: Any, bucket: str, proxy: FaultProxy, proxy_conn: str, status: int, code: str, wildcard: bool
) -> None:
    await admin.put_object(Bucket=bucket, Key="burst/ok.csv", Body=b"ok")
    proxy.fail_next(5, status=status, code=code)
    trigger = RecordingTrigger(
        bucket_key="burst/*.csv" if wildcard else "burst/ok.csv",
        bucket_name=bucket,
        wildcard_match=wildcard,
        aws_conn_id=proxy_conn,
        poll_interval=0.05,
        max_backoff=0.2,
    )
    payload = await run_trigger_payload(trigger)

    assert payload["status"] == "success"
    # One request per attempt: 5 injected errors + 1 success. botocore does not retry on its own.
    assert proxy.count(injected=True) == 5
    assert proxy.count(injected=False) == 1
    delays = trigger.__dict__["delays"]
    assert [failures for failures, _ in delays] == [1, 2, 3, 4, 5]
    for failures, delay in delays:
        assert 0.05 <= delay <= min(0.2, 0.05 * 2**failures)


async def test_connection_refused_is_transient_until_the_deadline(make_conn: Any) -> None:
    from scripts.services import free_port

    conn_id = make_conn(f"http://127.0.0.1:{free_port()}")
    trigger = RecordingTrigger(
        bucket_key="s3://some-bucket/k",
        aws_conn_id=conn_id,
        poll_interval=0.05,
        max_backoff=0.1,
        deadline=deadline_after(1.0),
    )
    payload = await run_trigger_payload(trigger)
    assert payload["status"] == "timeout"
    assert len(trigger.__dict__["delays"]) >= 2


async def test_access_denied_is_fatal_at_once(
    admin: Any, bucket: str, proxy: FaultProxy, make_conn: Any, iam_user: Any, moto_auth: Any
) -> None:
    await admin.put_object(Bucket=bucket, Key="secret.csv", Body=b"s")
    key_id, secret = await iam_user(policy=None)
    conn_id = make_conn(proxy.url, login=key_id, password=secret)
    moto_auth()

    head = await run_trigger_payload(s3_trigger(bucket_key=f"s3://{bucket}/secret.csv", aws_conn_id=conn_id))
    listing = await run_trigger_payload(
        s3_trigger(bucket_key=f"s3://{bucket}/*.csv", wildcard_match=True, aws_conn_id=conn_id)
    )

    for payload in (head, listing):
        assert (payload["status"], payload["error_type"]) == ("error", "authorization")
        assert "s3:ListBucket" in payload["message"]
        assert secret not in json.dumps(payload)
    assert "AccessDenied" in listing["message"]
    assert [(s.method, s.status) for s in proxy.seen] == [("HEAD", 403), ("GET", 403)]


async def test_rejected_credentials_are_fatal(bucket: str, proxy: FaultProxy, make_conn: Any, moto_auth: Any) -> None:
    conn_id = make_conn(proxy.url, login="AKIADOESNOTEXIST", password=SECRET)
    moto_auth()
    payload = await run_trigger_payload(
        s3_trigger(bucket_key=f"s3://{bucket}/*.csv", wildcard_match=True, aws_conn_id=conn_id)
    )
    assert (payload["status"], payload["error_type"]) == ("error", "authentication")
    assert "the credentials were rejected" in payload["message"]
    assert "InvalidAccessKeyId" in payload["message"]
    assert SECRET not in payload["message"]
    assert len(proxy.seen) == 1
