"""The direct path of an S3 poll: HEADs and listing pages as botocore would send them, signed so
the server accepts them, and handed to botocore where only its full path knows what to do.
Requests are counted and compared by the fault proxy in front of the real S3 API server."""

from __future__ import annotations

import asyncio
import dataclasses
import json
import urllib.parse
from typing import Any

import pytest

from airflow_deferrable_kit._s3 import signed
from airflow_deferrable_kit._s3.client import new_client
from airflow_deferrable_kit._s3.poller import S3Poller
from airflow_deferrable_kit.testing import run_trigger_payload
from tests.integration.s3.conftest import admin_settings, put_many
from tests.integration.s3.fault_proxy import FaultProxy
from tests.integration.s3.test_trigger import RecordingTrigger, s3_trigger

#: Keys whose encoding differs between naive quoting and what S3 (and botocore) expect.
ODD_KEYS = [
    "odd/a b+c.csv",
    "odd/ünï©ødé.csv",
    "odd/100%.csv",
    "odd/tilde~eq=amp&hash#q?.csv",
    "odd/semi;colon,comma'quote(paren)*star.csv",
]


def from_botocore(proxy: FaultProxy) -> list[bool]:
    """For each request the proxy saw: was it sent by botocore's full path (which adds its SDK headers)?"""
    return ["amz-sdk-invocation-id" in s.headers for s in proxy.seen]


async def test_heads_of_unusual_keys_go_where_botocore_sends_them(
    admin: Any, bucket: str, proxy: FaultProxy, proxy_conn: str
) -> None:
    await put_many(admin, bucket, ODD_KEYS)
    payload = await run_trigger_payload(s3_trigger(bucket_key=ODD_KEYS, bucket_name=bucket, aws_conn_id=proxy_conn))
    assert [k["key"] for k in payload["keys"]] == ODD_KEYS
    ours = [s.raw_path for s in proxy.seen if s.method == "HEAD" and s.path != f"/{bucket}"]
    assert not any(from_botocore(proxy))

    reference = await new_client(admin_settings(proxy.url))
    try:
        for key in ODD_KEYS:
            await reference.head_object(Bucket=bucket, Key=key)
    finally:
        await reference.close()
    theirs = [s.raw_path for s in proxy.seen[-len(ODD_KEYS) :]]
    assert ours == theirs


async def test_listings_of_unusual_keys_match_botocore(
    admin: Any, bucket: str, proxy: FaultProxy, proxy_conn: str
) -> None:
    await put_many(admin, bucket, [*ODD_KEYS, "odd/zz.txt"])
    poller = S3Poller(await new_client(admin_settings(proxy.url)))
    try:
        listing = await poller.list_prefix_within(bucket, "odd/", max_age=0)
        reference = await poller.client.list_objects_v2(Bucket=bucket, Prefix="odd/")
    finally:
        await poller.close()
    ours, theirs = proxy.seen
    assert not from_botocore(proxy)[0] and from_botocore(proxy)[1]
    assert urllib.parse.parse_qs(ours.query) == urllib.parse.parse_qs(theirs.query)
    assert listing.keys == tuple(item["Key"] for item in reference["Contents"])
    assert [listing.detail(i) for i in range(len(listing.keys))] == [
        (item["Size"], item["ETag"], item["LastModified"]) for item in reference["Contents"]
    ]

    payload = await run_trigger_payload(
        s3_trigger(bucket_key=f"s3://{bucket}/odd/*.csv", wildcard_match=True, aws_conn_id=proxy_conn)
    )
    assert [k["key"] for k in payload["keys"]] == sorted(ODD_KEYS)


async def test_the_server_verifies_our_signatures(
    admin: Any, bucket: str, proxy: FaultProxy, make_conn: Any, iam_user: Any, moto_auth: Any
) -> None:
    await admin.put_object(Bucket=bucket, Key="signed/a.csv", Body=b"a")
    # AWS authorises a HEAD as s3:GetObject and a ListObjectsV2 as s3:ListBucket, and so did moto
    # up to 5.2.5; moto 5.2.6 checks the operation names instead (s3:HeadObject, s3:ListObjectsV2:
    # `BaseResponse._get_action` no longer reads S3's action map) and denied both with AccessDenied
    # while still verifying the signature. The policy allows both names, so the test proves the
    # signing on either version (docs/development.md, "The lock").
    actions = ["s3:GetObject", "s3:ListBucket", "s3:HeadObject", "s3:ListObjectsV2"]
    policy = {"Version": "2012-10-17", "Statement": [{"Effect": "Allow", "Action": actions, "Resource": "*"}]}
    key_id, secret = await iam_user(policy=policy)
    good = make_conn(proxy.url, conn_id="s3_signed", login=key_id, password=secret)
    bad = make_conn(proxy.url, conn_id="s3_missigned", login=key_id, password=secret + "x")
    moto_auth()

    head = await run_trigger_payload(s3_trigger(bucket_key=f"s3://{bucket}/signed/a.csv", aws_conn_id=good))
    listing = await run_trigger_payload(
        s3_trigger(bucket_key=f"s3://{bucket}/signed/*.csv", wildcard_match=True, aws_conn_id=good)
    )
    assert head["status"] == listing["status"] == "success"
    assert [(s.method, s.status) for s in proxy.seen] == [("HEAD", 200), ("GET", 200)]
    assert not any(from_botocore(proxy))

    bad_listing = await run_trigger_payload(
        s3_trigger(bucket_key=f"s3://{bucket}/signed/*.csv", wildcard_match=True, aws_conn_id=bad)
    )
    assert (bad_listing["status"], bad_listing["error_type"]) == ("error", "authentication")
    assert "SignatureDoesNotMatch" in bad_listing["message"]
    bad_head = await run_trigger_payload(s3_trigger(bucket_key=f"s3://{bucket}/signed/a.csv", aws_conn_id=bad))
    assert (bad_head["status"], bad_head["error_type"]) == ("error", "authorization")  # a HEAD 403 has no code
    assert "access denied or credentials rejected" in bad_head["message"]


async def test_session_tokens_are_sent_and_signed(admin: Any, bucket: str, proxy: FaultProxy, make_conn: Any) -> None:
    await admin.put_object(Bucket=bucket, Key="temp/a.csv", Body=b"a")
    conn_id = make_conn(proxy.url, conn_id="s3_temporary", aws_session_token="FQoGZXIvYXdzE-session-token")
    await run_trigger_payload(s3_trigger(bucket_key=f"s3://{bucket}/temp/a.csv", aws_conn_id=conn_id))
    await run_trigger_payload(s3_trigger(bucket_key=f"s3://{bucket}/temp/*", wildcard_match=True, aws_conn_id=conn_id))
    assert [s.method for s in proxy.seen] == ["HEAD", "GET"]
    for seen in proxy.seen:
        assert seen.headers["x-amz-security-token"] == "FQoGZXIvYXdzE-session-token"
        assert "x-amz-security-token" in seen.headers["authorization"].split("SignedHeaders=")[1].split(",")[0]


@pytest.mark.parametrize("wildcard", [False, True])
async def test_retry_after_and_slowdown_are_read_from_our_requests(
    admin: Any, bucket: str, proxy: FaultProxy, proxy_conn: str, wildcard: bool
) -> None:
    await admin.put_object(Bucket=bucket, Key="slow/a.csv", Body=b"a")
    proxy.fail_next(1, status=503, code="SlowDown", retry_after=0.4)
    trigger = RecordingTrigger(
        bucket_key=f"s3://{bucket}/slow/{'*' if wildcard else 'a'}.csv",
        wildcard_match=wildcard,
        aws_conn_id=proxy_conn,
        poll_interval=0.05,
        max_backoff=0.1,
    )
    payload = await run_trigger_payload(trigger)
    assert payload["status"] == "success"
    ((failures, delay),) = trigger.__dict__["delays"]
    assert failures == 1 and delay >= 0.4  # above max_backoff: the server's Retry-After wins
    assert not any(from_botocore(proxy))


@pytest.mark.parametrize(("status", "code"), [(400, "AuthorizationHeaderMalformed"), (301, "PermanentRedirect")])
@pytest.mark.parametrize("wildcard", [False, True])
async def test_redirect_statuses_are_handed_to_botocore(
    admin: Any, bucket: str, proxy: FaultProxy, proxy_conn: str, status: int, code: str, wildcard: bool
) -> None:
    """A bucket in another region answers a redirect or a bare 400: botocore's region redirector
    follows those, so the request is sent again through botocore's full path."""
    await admin.put_object(Bucket=bucket, Key="moved/a.csv", Body=b"a")
    proxy.fail_next(1, status=status, code=code)
    key = "moved/*.csv" if wildcard else "moved/a.csv"
    payload = await run_trigger_payload(
        s3_trigger(bucket_key=f"s3://{bucket}/{key}", wildcard_match=wildcard, aws_conn_id=proxy_conn)
    )
    assert payload["status"] == "success"
    assert [(s.status, s.injected) for s in proxy.seen] == [(status, True), (200, False)]
    assert from_botocore(proxy) == [False, True]


async def test_a_connection_that_sets_a_signature_version_goes_through_botocore(
    admin: Any, bucket: str, proxy: FaultProxy, make_conn: Any
) -> None:
    await admin.put_object(Bucket=bucket, Key="v2/a.csv", Body=b"a")
    conn_id = make_conn(proxy.url, conn_id="s3_sigv2", config_kwargs={"signature_version": "s3"})
    payload = await run_trigger_payload(s3_trigger(bucket_key=f"s3://{bucket}/v2/a.csv", aws_conn_id=conn_id))
    assert payload["status"] == "success"
    assert from_botocore(proxy) == [True]
    assert proxy.seen[0].headers["authorization"].startswith("AWS ")  # botocore's SigV2, as configured


async def test_a_request_is_signed_only_when_a_pool_connection_is_free(
    admin: Any, bucket: str, proxy: FaultProxy, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A server slower than the polls: the polls beyond the pool queue unsigned, and all answer."""
    sent_signed = 0
    real_send_signed = signed.send_signed

    async def counting(*args: Any, **kwargs: Any) -> Any:
        nonlocal sent_signed
        sent_signed += 1
        return await real_send_signed(*args, **kwargs)

    monkeypatch.setattr(signed, "send_signed", counting)
    await admin.put_object(Bucket=bucket, Key="queue/7.csv", Body=b"a")
    settings = dataclasses.replace(admin_settings(proxy.url), config_json=json.dumps({"max_pool_connections": 4}))
    poller = S3Poller(await new_client(settings))
    try:
        await poller.head_object(bucket, "queue/warm.csv")  # the route, resolved once
        gate = proxy.hold_requests()
        sent_signed = 0
        polls = [asyncio.create_task(poller.head_object(bucket, f"queue/{i}.csv")) for i in range(40)]
        for _ in range(100):
            await asyncio.sleep(0.02)
            if proxy.held == 4:
                break
        await asyncio.sleep(0.2)  # anything more that would be signed, is
        assert (sent_signed, proxy.held) == (4, 4)
        gate.set()
        answers = await asyncio.gather(*polls)
    finally:
        await poller.close()
    assert sent_signed == 40
    assert [i for i, found in enumerate(answers) if found is not None] == [7]


async def test_a_request_hanging_on_the_server_holds_one_connection_and_no_other_poll(
    admin: Any, bucket: str, proxy: FaultProxy
) -> None:
    """The poisoned member of the shared pool: one key's HEAD hangs on the server.

    It holds one of the pool's connections (a signing slot) until the client's read timeout, as
    it would on botocore's own path; the other polls of the connection share the rest and all
    answer while it hangs. Once it times out its slot serves the others again.
    """
    await admin.put_object(Bucket=bucket, Key="many/7.csv", Body=b"a")
    config = {"max_pool_connections": 2, "read_timeout": 3, "retries": {"max_attempts": 1, "mode": "standard"}}
    settings = dataclasses.replace(admin_settings(proxy.url), config_json=json.dumps(config))
    poller = S3Poller(await new_client(settings))
    try:
        await poller.head_object(bucket, "many/warm.csv")  # the route, resolved once
        stalled = proxy.hold_matching(lambda request: request.path.endswith("/hung.csv"))
        hung = asyncio.create_task(poller.head_object(bucket, "many/hung.csv"))
        for _ in range(100):
            await asyncio.sleep(0.02)
            if proxy.held == 1:
                break
        assert proxy.held == 1
        answers = await asyncio.gather(*(poller.head_object(bucket, f"many/{i}.csv") for i in range(40)))
        assert [i for i, found in enumerate(answers) if found is not None] == [7]
        assert not hung.done()  # every healthy poll answered while it hangs
        with pytest.raises(Exception) as raised:
            await hung
        assert type(raised.value).__name__ == "ReadTimeoutError", raised.value
        stalled.set()
        assert await poller.head_object(bucket, "many/hung.csv") is None  # the key itself answers again
        # Its slot is free again: with the server stalled for everyone, two requests are in flight.
        gate = proxy.hold_requests()
        polls = [asyncio.create_task(poller.head_object(bucket, f"many/{i}.csv")) for i in range(5)]
        for _ in range(100):
            await asyncio.sleep(0.02)
            if proxy.held == 3:
                break
        await asyncio.sleep(0.2)  # anything more that would be sent, is
        assert proxy.held == 1 + 2
        gate.set()
        assert [found is not None for found in await asyncio.gather(*polls)] == [False] * 5
    finally:
        await poller.close()
