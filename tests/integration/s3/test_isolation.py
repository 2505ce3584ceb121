"""A poisoned member of a shared S3 mechanism fails alone; the waits sharing with it do not notice.

Two hundred healthy waits share a folder's listings (exact keys) or a prefix's listing
(wildcards) on one connection, next to waits that are bad in every way a member can be: a key
the credentials may not read (the fault proxy answers its HEAD 403, as S3 does under an
``s3:GetObject`` deny whether the object exists or not), a bucket that does not exist, a prefix
whose listing is refused. Each bad wait ends with the error its request alone gets (the same
wait run on a connection of its own); every healthy wait goes on without an error and finds its
key at most one poll after it appeared.
"""

from __future__ import annotations

import asyncio
import uuid
from typing import Any

from aiohttp import web

from airflow_deferrable_kit.leases import held_keys
from airflow_deferrable_kit.testing import run_trigger_payload
from tests.integration.s3.conftest import put_many
from tests.integration.s3.fault_proxy import FaultProxy, is_listing, settle
from tests.integration.s3.test_shared_failures import Waiting, polls

N = 200
INTERVAL = 1.0  # 200 keys of one folder at 1 s: its polls are answered by listings


def wait(conn_id: str, **kwargs: Any) -> Waiting:
    return Waiting(aws_conn_id=conn_id, poll_interval=INTERVAL, max_backoff=INTERVAL, **kwargs)


async def outcomes_alone(make_conn: Any, proxy: FaultProxy, bad: list[dict[str, Any]]) -> list[Any]:
    """What each bad wait ends with on a connection of its own (nothing shared with anyone)."""
    alone = make_conn(proxy.url, conn_id="s3_alone")
    return [await run_trigger_payload(wait(alone, **kwargs), timeout=60) for kwargs in bad]


def same_error(payload: dict[str, Any], alone: dict[str, Any]) -> bool:
    return (
        payload["status"] == alone["status"] == "error"
        and {k: v for k, v in payload.items() if k != "message"} == {k: v for k, v in alone.items() if k != "message"}
        and payload["message"].replace("s3_test", "s3_alone") == alone["message"]
    )


async def healthy_go_on(admin: Any, bucket: str, healthy: list[Waiting], tasks: list[Any], keys: list[str]) -> None:
    """No healthy wait saw an error; each finds its key at most two polls after the put."""
    assert not any(task.done() for task in tasks)
    assert [t.__dict__.get("errors", 0) for t in healthy] == [0] * len(healthy)
    polls_at_put: dict[int, int] = {}

    async def put(i: int) -> None:
        await admin.put_object(Bucket=bucket, Key=keys[i], Body=b"x")
        polls_at_put[i] = healthy[i].__dict__["polls"]

    await asyncio.gather(*(put(i) for i in range(len(healthy))))
    payloads = await asyncio.gather(*tasks)
    assert [p["status"] for p in payloads] == ["success"] * len(healthy)
    assert [t.__dict__.get("errors", 0) for t in healthy] == [0] * len(healthy)
    assert max(healthy[i].__dict__["polls"] - polls_at_put[i] for i in range(len(healthy))) <= 2


async def test_poisoned_exact_key_waits_fail_alone_next_to_a_shared_folder(
    admin: Any, bucket: str, proxy: FaultProxy, proxy_conn: str, make_conn: Any
) -> None:
    other = f"adk-{uuid.uuid4().hex[:12]}"
    await admin.create_bucket(Bucket=other)
    await put_many(admin, bucket, ["run-9/secret.csv", *[f"run-9/other-{j}.txt" for j in range(20)]])
    forbidden = {f"/{bucket}/run-9/secret.csv", f"/{bucket}/run-9/secret-missing.csv"}

    def denied(request: web.Request) -> bool:  # s3:GetObject denied on two keys of the folder
        return request.method == "HEAD" and request.path in forbidden

    def unlistable(request: web.Request) -> bool:  # s3:ListBucket denied on the other bucket
        return is_listing(request) and request.path == f"/{other}"

    proxy.refuse(denied)
    proxy.refuse(unlistable)
    bad = [
        {"bucket_key": f"s3://{bucket}/run-9/secret.csv"},  # exists, may not be read
        {"bucket_key": f"s3://{bucket}/run-9/secret-missing.csv"},  # missing, may not be read
        {"bucket_key": f"s3://adk-missing-{uuid.uuid4().hex[:8]}/run-9/part-00000.csv"},  # no such bucket
        {"bucket_key": f"s3://{other}/run-9/*.csv", "wildcard_match": True},  # listing refused
    ]
    alone = await outcomes_alone(make_conn, proxy, bad)
    assert [p["error_type"] for p in alone] == ["authorization", "authorization", "not_found", "authorization"]

    keys = [f"run-9/part-{i:05d}.csv" for i in range(N)]
    healthy = [wait(proxy_conn, bucket_key=key, bucket_name=bucket) for key in keys]
    tasks = [asyncio.create_task(run_trigger_payload(t, timeout=120)) for t in healthy]
    await settle(lambda: polls(healthy) >= 2 * N, attempts=3000)  # the folder is answered by listings
    listed = len(proxy.listings())
    assert listed
    poisoned = [asyncio.create_task(run_trigger_payload(wait(proxy_conn, **kwargs), timeout=60)) for kwargs in bad]
    payloads = await asyncio.gather(*poisoned)

    assert all(same_error(p, a) for p, a in zip(payloads, alone, strict=True)), (payloads, alone)
    await settle(lambda: polls(healthy) >= 4 * N, attempts=3000)
    assert len(proxy.listings()) > listed  # the folder's listings went on
    await healthy_go_on(admin, bucket, healthy, tasks, keys)
    assert held_keys() == {}


async def test_a_bad_pattern_fails_alone_next_to_waits_sharing_a_prefix_listing(
    admin: Any, bucket: str, proxy: FaultProxy, proxy_conn: str, make_conn: Any
) -> None:
    await put_many(admin, bucket, [f"land/other-{j}.txt" for j in range(20)])

    def unlistable(request: web.Request) -> bool:  # s3:ListBucket denied under land/secret/
        return is_listing(request) and request.query.get("prefix") == "land/secret/"

    proxy.refuse(unlistable)
    missing_bucket = f"adk-missing-{uuid.uuid4().hex[:8]}"
    bad = [
        {"bucket_key": f"s3://{bucket}/land/secret/*.csv", "wildcard_match": True},
        # One pattern on the shared prefix, one in a bucket that does not exist.
        {
            "bucket_key": [f"s3://{bucket}/land/*-bad.csv", f"s3://{missing_bucket}/land/*.csv"],
            "wildcard_match": True,
        },
        {"bucket_key": f"s3://{bucket}/land/[*.csv", "wildcard_match": True, "min_size": 10**12},  # never matches
    ]
    await admin.put_object(Bucket=bucket, Key="land/x-bad.csv", Body=b"x")  # the bad wait's first pattern matches
    alone = await outcomes_alone(make_conn, proxy, bad[:2])
    await admin.delete_object(Bucket=bucket, Key="land/x-bad.csv")
    assert [p["error_type"] for p in alone] == ["authorization", "not_found"]

    keys = [f"land/k-{i:05d}.csv" for i in range(N)]
    healthy = [
        wait(proxy_conn, bucket_key=f"land/*-{i:05d}.csv", bucket_name=bucket, wildcard_match=True) for i in range(N)
    ]
    tasks = [asyncio.create_task(run_trigger_payload(t, timeout=120)) for t in healthy]
    await settle(lambda: polls(healthy) >= 2 * N, attempts=3000)
    never = asyncio.create_task(run_trigger_payload(wait(proxy_conn, **bad[2]), timeout=120))
    await admin.put_object(Bucket=bucket, Key="land/x-bad.csv", Body=b"x")
    payloads = await asyncio.gather(
        *(run_trigger_payload(wait(proxy_conn, **kwargs), timeout=60) for kwargs in bad[:2])
    )
    await admin.delete_object(Bucket=bucket, Key="land/x-bad.csv")

    assert all(same_error(p, a) for p, a in zip(payloads, alone, strict=True)), (payloads, alone)
    await settle(lambda: polls(healthy) >= 4 * N, attempts=3000)
    assert not never.done()  # a pattern that never matches only waits
    never.cancel()
    await healthy_go_on(admin, bucket, healthy, tasks, keys)
    assert held_keys() == {}
