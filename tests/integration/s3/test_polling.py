"""How the S3 waits poll through the one poller of their connection: listings shared by the waits
on one prefix, one bucket check for many waits, and patterns matched against a shared listing.
Requests are counted by the fault proxy in front of the real S3 API server. The direct requests
themselves are tested in test_signed.py."""

from __future__ import annotations

import asyncio
import fnmatch
import string
import urllib.parse
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from airflow_deferrable_kit._s3.client import new_client
from airflow_deferrable_kit._s3.poller import LISTING_REUSE_MAX, Listing, S3Poller, listing_reuse_window
from airflow_deferrable_kit.leases import held_keys
from airflow_deferrable_kit.testing import run_trigger_payload
from airflow_deferrable_kit.triggers.base import Found
from airflow_deferrable_kit.triggers.s3 import KeyPattern, S3KeyTrigger
from tests.integration.s3.conftest import admin_settings, put_many
from tests.integration.s3.fault_proxy import FaultProxy, settle
from tests.integration.s3.test_trigger import RecordingTrigger, s3_trigger


class CountingTrigger(S3KeyTrigger):
    """Counts its polls, so a test compares requests with polls instead of timing anything."""

    async def check(self) -> Found | None:
        self.__dict__["polls"] = self.__dict__.get("polls", 0) + 1
        return await super().check()


def polls(triggers: list[Any]) -> int:
    return sum(t.__dict__.get("polls", 0) for t in triggers)


# ------------------------------------------------------------------ shared listings
async def test_waits_on_one_prefix_share_listings_and_each_names_its_own_key(
    admin: Any, bucket: str, proxy: FaultProxy, proxy_conn: str
) -> None:
    n = 200
    await put_many(admin, bucket, [f"shared/other-{j}.txt" for j in range(50)])
    triggers = [
        CountingTrigger(
            bucket_key=f"shared/*-{i:05d}.csv",
            bucket_name=bucket,
            wildcard_match=True,
            aws_conn_id=proxy_conn,
            poll_interval=2.0,
        )
        for i in range(n)
    ]
    tasks = [asyncio.create_task(run_trigger_payload(t, timeout=60)) for t in triggers]

    await settle(lambda: polls(triggers) >= 3 * n, attempts=3000)  # three rounds of polls
    listings, polled = proxy.count("GET"), polls(triggers)
    assert listings * 8 <= polled  # one listing answered many polls (without sharing: one each)
    assert not any(task.done() for task in tasks)

    await put_many(admin, bucket, [f"shared/k-{i:05d}.csv" for i in range(n)])
    payloads = await asyncio.gather(*tasks)

    for i, payload in enumerate(payloads):
        assert payload["status"] == "success"
        assert [k["key"] for k in payload["keys"]] == [f"shared/k-{i:05d}.csv"]  # its own key, only
        assert payload["keys_not_listed"] == 0
    assert proxy.count("GET") * 8 <= polls(triggers)
    assert {s.path for s in proxy.seen} == {f"/{bucket}"}  # listings of the bucket, nothing else
    assert all(urllib.parse.parse_qs(s.query)["prefix"] == ["shared/"] for s in proxy.seen)
    assert held_keys() == {}


async def test_one_listing_in_flight_serves_every_wait_and_each_gets_its_error_once(
    admin: Any, bucket: str, proxy: FaultProxy, proxy_conn: str
) -> None:
    await put_many(admin, bucket, [f"in/k-{i:02d}.csv" for i in range(20)])
    gate = proxy.hold_requests()
    triggers = [
        RecordingTrigger(
            bucket_key=f"in/*-{i:02d}.csv",
            bucket_name=bucket,
            wildcard_match=True,
            aws_conn_id=proxy_conn,
            poll_interval=0.5,
            max_backoff=0.5,
        )
        for i in range(20)
    ]
    tasks = [asyncio.create_task(run_trigger_payload(t, timeout=60)) for t in triggers]
    await settle(lambda: proxy.held == 1)
    await asyncio.sleep(0.2)  # room for a wrong second listing to show up (it must not)
    assert proxy.held == 1  # twenty waits, one listing in flight

    proxy.fail_next(1, status=503, code="SlowDown")
    gate.set()
    payloads = await asyncio.gather(*tasks)

    assert [p["status"] for p in payloads] == ["success"] * 20
    assert [[k["key"] for k in p["keys"]] for p in payloads] == [[f"in/k-{i:02d}.csv"] for i in range(20)]
    assert proxy.count(injected=True) == 1
    # Every wait got the shared listing's SlowDown once and backed off; after its hold, the next polls listed again.
    assert [[failures for failures, _ in t.__dict__["delays"]] for t in triggers] == [[1]] * 20
    assert proxy.count(injected=False) >= 1


async def test_cancelling_every_wait_cancels_their_shared_listing(
    bucket: str, proxy: FaultProxy, proxy_conn: str
) -> None:
    proxy.hold_requests()  # the listing never gets an answer
    triggers = [
        s3_trigger(bucket_key=f"never/*-{i}.csv", bucket_name=bucket, wildcard_match=True, aws_conn_id=proxy_conn)
        for i in range(20)
    ]
    tasks = [asyncio.create_task(run_trigger_payload(t, timeout=60)) for t in triggers]
    await settle(lambda: proxy.held == 1)

    def listing_tasks() -> list[asyncio.Task[Any]]:
        return [t for t in asyncio.all_tasks() if "S3Poller._list" in repr(t.get_coro())]

    assert len(listing_tasks()) == 1
    for task in tasks:
        task.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)

    assert listing_tasks() == []
    assert held_keys() == {}
    await settle(lambda: proxy.open_connections == 0)


async def test_a_listing_answers_only_polls_within_its_window(admin: Any, bucket: str, proxy: FaultProxy) -> None:
    await put_many(admin, bucket, ["win/a.csv", "win/b.csv"])
    poller = S3Poller(await new_client(admin_settings(proxy.url)))
    try:
        first = await poller.list_prefix_within(bucket, "win/", max_age=30)
        again = await poller.list_prefix_within(bucket, "win/", max_age=30)
        assert again is first and proxy.count("GET") == 1

        await admin.put_object(Bucket=bucket, Key="win/c.csv", Body=b"c")
        fresh = await poller.list_prefix_within(bucket, "win/", max_age=0)  # started before this poll: too old
        assert fresh.keys == ("win/a.csv", "win/b.csv", "win/c.csv")
        assert proxy.count("GET") == 2
        # Kept at most LISTING_REUSE_MAX seconds after it started, then dropped.
        await settle(lambda: not len(poller._answers), attempts=int(LISTING_REUSE_MAX / 0.02) * 3)
    finally:
        await poller.close()


def test_the_reuse_window_is_a_tenth_of_the_poll_interval_up_to_a_second() -> None:
    assert listing_reuse_window(0.05) == pytest.approx(0.005)
    assert listing_reuse_window(5) == pytest.approx(0.5)
    assert listing_reuse_window(30) == LISTING_REUSE_MAX == 1.0
    assert listing_reuse_window(3600) == 1.0


async def test_one_bucket_check_for_many_waits_on_one_bucket(bucket: str, proxy: FaultProxy, proxy_conn: str) -> None:
    triggers = [s3_trigger(bucket_key=f"s3://{bucket}/missing/{i}", aws_conn_id=proxy_conn) for i in range(30)]
    tasks = [asyncio.create_task(run_trigger_payload(t, timeout=60)) for t in triggers]
    await settle(lambda: proxy.count("HEAD") >= 3 * 30)
    for task in tasks:
        task.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)
    # A HEAD 404 cannot tell a missing key from a missing bucket: asked once for all thirty waits.
    assert [s.status for s in proxy.seen if s.path == f"/{bucket}"] == [200]


# ---------------------------------------------------------------------- matching
def test_patterns_know_their_literal_prefix_and_tail() -> None:
    cases = {
        "shared/*-00001.csv": ("shared/", "-00001.csv"),
        "logs/*/_SUCCESS": ("logs/", "/_SUCCESS"),
        "data/[ab]*.parquet": ("data/", ".parquet"),
        "logs/part-0000?.gz": ("logs/part-0000", ".gz"),
        "x/*": ("x/", ""),
        "x/[a]": ("x/", ""),
        "no-wildcard.csv": ("no-wildcard.csv", "no-wildcard.csv"),
    }
    for pattern, (prefix, tail) in cases.items():
        compiled = KeyPattern.compile("b", pattern)
        assert (compiled.prefix, compiled.tail) == (prefix, tail), pattern


@settings(max_examples=300, deadline=None)
@given(
    pattern=st.text(alphabet="ab/.*?[]!-", min_size=0, max_size=8),
    keys=st.lists(st.text(alphabet="ab/.[]!-", min_size=0, max_size=8), max_size=30, unique=True),
)
def test_matching_through_the_tail_index_is_fnmatch(pattern: str, keys: list[str]) -> None:
    listing = Listing(tuple(sorted(keys)), tuple((1, None, None) for _ in keys))
    compiled = KeyPattern.compile("b", pattern)
    expected = [i for i, key in enumerate(listing.keys) if fnmatch.fnmatchcase(key, pattern)]
    assert compiled.matches(listing) == expected
    assert compiled.matches(listing) == expected  # the index, once built, answers the same


def test_tail_index_is_built_once_per_tail_length() -> None:
    keys = tuple(f"shared/k-{i:05d}.csv" for i in range(100)) + tuple(string.ascii_lowercase)
    listing = Listing(keys, tuple((1, None, None) for _ in keys))
    for i in range(100):
        assert KeyPattern.compile("b", f"shared/*-{i:05d}.csv").matches(listing) == [i]
    assert list(listing._by_tail) == [len("-00000.csv")]
