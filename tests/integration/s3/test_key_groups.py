"""Exact-key waits of one folder, or of sibling folders under one prefix, answered by shared,
bounded listings instead of one HEAD each.

Requests are counted by the fault proxy in front of the real S3 API server, which also injects
the refused listing (a 403 on ``ListObjectsV2`` while HEADs go through) that moto cannot be
told to give on its own. The rule itself (when to list, the bound) is tested without a server.
"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from airflow_deferrable_kit._s3.client import new_client
from airflow_deferrable_kit._s3.key_groups import (
    HEAD_ONLY_SECONDS,
    MAX_LISTING_PAGES,
    POLLS_PER_LISTING_PAGE,
    KeyGroup,
    KeyGroups,
    folder_of,
    prefixes_of,
)
from airflow_deferrable_kit._s3.poller import Listing, S3Poller, listing_reuse_window
from airflow_deferrable_kit.errors import TransientError
from airflow_deferrable_kit.leases import held_keys
from airflow_deferrable_kit.testing import run_trigger_payload
from tests.integration.s3.conftest import admin_settings, put_many
from tests.integration.s3.fault_proxy import FaultProxy, settle
from tests.integration.s3.test_polling import CountingTrigger, polls
from tests.integration.s3.test_trigger import s3_trigger

N = 200  # at a 2 s interval: 100 polls/s, 20 in a 0.2 s window, above the 16 a one-page listing needs
INTERVAL = 2.0


def key(i: int) -> str:
    return f"run-42/part-{i:05d}.csv"


def waits(bucket: str, conn_id: str, n: int = N, **kwargs: Any) -> list[CountingTrigger]:
    return [
        CountingTrigger(bucket_key=key(i), bucket_name=bucket, aws_conn_id=conn_id, poll_interval=INTERVAL, **kwargs)
        for i in range(n)
    ]


def object_heads(proxy: FaultProxy, bucket: str) -> int:
    return sum(1 for s in proxy.seen if s.method == "HEAD" and s.path != f"/{bucket}")


# ------------------------------------------------------------------ shared listings
async def test_keys_of_one_folder_are_polled_by_few_listings_and_found_within_an_interval(
    admin: Any, bucket: str, proxy: FaultProxy, proxy_conn: str, make_conn: Any, s3_server: Any
) -> None:
    await put_many(admin, bucket, [f"run-42/other-{j}.txt" for j in range(50)])
    triggers = waits(bucket, proxy_conn)
    tasks = [asyncio.create_task(run_trigger_payload(t, timeout=120)) for t in triggers]

    await settle(lambda: polls(triggers) >= 4 * N, attempts=3000)  # four rounds of polls
    ramp_heads = object_heads(proxy, bucket)
    listings, polled = len(proxy.listings()), polls(triggers)
    # Each key's first poll is a HEAD (it proves the key may be read); then listings, each answering many.
    assert ramp_heads <= 2 * N
    assert listings * 8 <= polled
    assert {s.query for s in proxy.listings()} == {"list-type=2&prefix=run-42/&encoding-type=url"}
    assert not any(task.done() for task in tasks)

    # Each key appears while its wait polls: found at the latest by its second poll after the put.
    polls_at_put: dict[int, int] = {}

    async def put(i: int) -> None:
        await admin.put_object(Bucket=bucket, Key=key(i), Body=b"a,b\n" * (i + 1))
        polls_at_put[i] = triggers[i].__dict__["polls"]

    await asyncio.gather(*(put(i) for i in range(N)))
    payloads = await asyncio.gather(*tasks)

    assert [p["status"] for p in payloads] == ["success"] * N
    assert [[k["key"] for k in p["keys"]] for p in payloads] == [[key(i)] for i in range(N)]
    assert max(triggers[i].__dict__["polls"] - polls_at_put[i] for i in range(N)) <= 2
    # A found key is HEADed once; a not-yet poll costs no HEAD.
    assert object_heads(proxy, bucket) - ramp_heads <= N
    assert len(proxy.listings()) * 8 <= polls(triggers)
    # The same payload as a wait that HEADs (a single wait on another connection: nothing to share).
    direct = make_conn(s3_server.endpoint_url, conn_id="s3_direct")
    for i in (0, 7, N - 1):
        alone = await run_trigger_payload(s3_trigger(bucket_key=key(i), bucket_name=bucket, aws_conn_id=direct))
        assert alone == payloads[i]
    assert held_keys() == {}


async def test_min_size_decides_as_with_head(admin: Any, bucket: str, proxy: FaultProxy, proxy_conn: str) -> None:
    await put_many(admin, bucket, [key(i) for i in range(N)], body=b"small")
    triggers = waits(bucket, proxy_conn, min_size=10)
    tasks = [asyncio.create_task(run_trigger_payload(t, timeout=120)) for t in triggers]
    await settle(lambda: polls(triggers) >= 3 * N, attempts=3000)
    assert not any(task.done() for task in tasks)  # present in the listing, but smaller than min_size
    assert proxy.listings()

    await put_many(admin, bucket, [key(i) for i in range(N)], body=b"big enough now")
    payloads = await asyncio.gather(*tasks)
    assert [(p["status"], p["keys"][0]["size"]) for p in payloads] == [("success", 14)] * N


# ------------------------------------------------------------------------ the bound
async def test_a_folder_listing_past_the_page_bound_puts_the_folder_on_head(
    admin: Any, bucket: str, proxy: FaultProxy, proxy_conn: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr("airflow_deferrable_kit._s3.poller.MAX_LISTING_PAGES", 1)
    await put_many(admin, bucket, [f"run-42/other-{j:04d}.txt" for j in range(1001)])  # two pages
    triggers = waits(bucket, proxy_conn)
    tasks = [asyncio.create_task(run_trigger_payload(t, timeout=120)) for t in triggers]

    await settle(lambda: polls(triggers) >= 4 * N, attempts=3000)
    # One listing of the folder at a time: the first stopped at the bound (after one page), then
    # HEADs only, for HEAD_ONLY_SECONDS.
    listed = len(proxy.listings())
    assert listed == 1
    assert "continuation-token" not in " ".join(s.query for s in proxy.listings())
    heads_before = object_heads(proxy, bucket)
    await settle(lambda: polls(triggers) >= 6 * N, attempts=3000)
    assert object_heads(proxy, bucket) - heads_before >= N  # two rounds of polls, answered by HEADs
    assert len(proxy.listings()) == listed

    await put_many(admin, bucket, [key(i) for i in range(N)])
    payloads = await asyncio.gather(*tasks)
    assert [p["status"] for p in payloads] == ["success"] * N


async def test_a_refused_listing_falls_back_to_head_and_fails_no_wait(
    admin: Any, bucket: str, proxy: FaultProxy, proxy_conn: str
) -> None:
    # s3:ListBucket denied, s3:GetObject allowed: S3 answers the listing 403 AccessDenied.
    proxy.fail_next(1000, status=403, code="AccessDenied", message="Access Denied", listings_only=True)
    triggers = waits(bucket, proxy_conn)
    tasks = [asyncio.create_task(run_trigger_payload(t, timeout=120)) for t in triggers]

    await settle(lambda: polls(triggers) >= 4 * N, attempts=3000)
    refused = proxy.listings()
    assert refused and all(s.status == 403 and s.injected for s in refused)
    # One listing of the folder at a time: the first refusal puts the folder on HEAD.
    assert len(refused) == 1
    await settle(lambda: polls(triggers) >= 6 * N, attempts=3000)
    assert len(proxy.listings()) == len(refused)
    assert not any(task.done() for task in tasks)

    await put_many(admin, bucket, [key(i) for i in range(N)])
    payloads = await asyncio.gather(*tasks)
    assert [p["status"] for p in payloads] == ["success"] * N
    assert len(proxy.listings()) == len(refused)


async def test_a_throttled_listing_is_the_transient_error_a_throttled_head_is(
    admin: Any, bucket: str, proxy: FaultProxy
) -> None:
    poller = S3Poller(await new_client(admin_settings(proxy.url)), where="aws_conn_id='x'")
    try:
        group = poller._groups.groups[bucket, "run-42/"] = KeyGroup("run-42/")
        now = asyncio.get_running_loop().time()
        for i in range(N):  # N waits on the folder have polled, and HEAD said 404 for each key
            group.note_poll(key(i), INTERVAL, now)
            group.headed(key(i))
        proxy.fail_next(1, status=503, code="SlowDown", listings_only=True)
        with pytest.raises(TransientError) as throttled:
            await poller.find_object(bucket, key(0), poll_interval=INTERVAL)
        assert throttled.value.error_type == "throttled"
        assert "LIST s3://" in throttled.value.message and "SlowDown" in throttled.value.message
        # Shared for one hold: the next poll of any key of the folder gets it without a request ...
        with pytest.raises(TransientError) as again:
            await poller.find_object(bucket, key(1), poll_interval=INTERVAL)
        assert again.value is throttled.value
        assert len(proxy.listings()) == 1
        # ... and, not a refusal, the first poll after the hold lists again (the key missing: no HEAD).
        await asyncio.sleep(2 * listing_reuse_window(INTERVAL))
        assert await poller.find_object(bucket, key(0), poll_interval=INTERVAL) is None
        assert [s.status for s in proxy.listings()] == [503, 200]
        assert proxy.count("HEAD") == 0
    finally:
        await poller.close()


# ------------------------------------------------- sibling folders under one prefix
RUN = "runs/r-7/"


def run_key(i: int) -> str:
    """One folder per key under one run prefix, the layout of partitioned outputs."""
    return f"{RUN}part={i:05d}/data.csv"


def run_waits(bucket: str, conn_id: str, n: int = N, **kwargs: Any) -> list[CountingTrigger]:
    return [
        CountingTrigger(
            bucket_key=run_key(i), bucket_name=bucket, aws_conn_id=conn_id, poll_interval=INTERVAL, **kwargs
        )
        for i in range(n)
    ]


async def test_keys_in_sibling_folders_are_polled_by_few_listings_of_their_run_prefix(
    admin: Any, bucket: str, proxy: FaultProxy, proxy_conn: str, make_conn: Any, s3_server: Any
) -> None:
    # Unrelated objects under the run prefix, sorting before and after the waited keys.
    await put_many(admin, bucket, [f"{RUN}_logs/{j}.txt" for j in range(30)] + [f"{RUN}zz/{j}" for j in range(20)])
    triggers = run_waits(bucket, proxy_conn)
    tasks = [asyncio.create_task(run_trigger_payload(t, timeout=120)) for t in triggers]

    await settle(lambda: polls(triggers) >= 4 * N, attempts=3000)
    # Each key's first poll is a HEAD (it proves the key may be read); then listings of the run prefix.
    ramp_heads = object_heads(proxy, bucket)
    assert ramp_heads <= 2 * N
    steady_listings, steady_polls = len(proxy.listings()), polls(triggers)
    await settle(lambda: polls(triggers) >= steady_polls + 2 * N, attempts=3000)  # two more rounds
    rounds = (polls(triggers) - steady_polls) / N
    assert object_heads(proxy, bucket) == ramp_heads  # no HEAD while the keys are missing
    assert len(proxy.listings()) - steady_listings <= 15 * rounds  # a handful of listings per round of 200 polls
    assert {s.query for s in proxy.listings()} == {f"list-type=2&prefix={RUN}&encoding-type=url"}
    assert not any(task.done() for task in tasks)

    # (d) Each key appears while its wait polls: found at the latest by its second poll after the put.
    polls_at_put: dict[int, int] = {}

    async def put(i: int) -> None:
        await admin.put_object(Bucket=bucket, Key=run_key(i), Body=b"a,b\n" * (i + 1))
        polls_at_put[i] = triggers[i].__dict__["polls"]

    await asyncio.gather(*(put(i) for i in range(N)))
    payloads = await asyncio.gather(*tasks)

    assert [p["status"] for p in payloads] == ["success"] * N
    assert [[k["key"] for k in p["keys"]] for p in payloads] == [[run_key(i)] for i in range(N)]
    assert [p["keys"][0]["size"] for p in payloads] == [4 * (i + 1) for i in range(N)]
    assert max(triggers[i].__dict__["polls"] - polls_at_put[i] for i in range(N)) <= 2
    assert object_heads(proxy, bucket) - ramp_heads <= N  # a found key is HEADed once
    # The same payload as a wait that HEADs (a single wait on another connection: nothing to share).
    direct = make_conn(s3_server.endpoint_url, conn_id="s3_direct")
    for i in (0, 7, N - 1):
        alone = await run_trigger_payload(s3_trigger(bucket_key=run_key(i), bucket_name=bucket, aws_conn_id=direct))
        assert alone == payloads[i]
    assert held_keys() == {}


async def test_min_size_decides_as_with_head_for_a_run_prefix(
    admin: Any, bucket: str, proxy: FaultProxy, proxy_conn: str
) -> None:
    await put_many(admin, bucket, [run_key(i) for i in range(N)], body=b"small")
    triggers = run_waits(bucket, proxy_conn, min_size=10)
    tasks = [asyncio.create_task(run_trigger_payload(t, timeout=120)) for t in triggers]
    await settle(lambda: polls(triggers) >= 3 * N, attempts=3000)
    assert not any(task.done() for task in tasks)  # present in the listing, but smaller than min_size
    assert proxy.listings()

    await put_many(admin, bucket, [run_key(i) for i in range(N)], body=b"big enough now")
    payloads = await asyncio.gather(*tasks)
    assert [(p["status"], p["keys"][0]["size"]) for p in payloads] == [("success", 14)] * N


async def test_a_run_prefix_holding_more_than_the_bound_falls_back_to_head(
    admin: Any, bucket: str, proxy: FaultProxy, proxy_conn: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr("airflow_deferrable_kit._s3.poller.MAX_LISTING_PAGES", 1)
    # Two pages of unrelated objects, all sorting before the waited keys: the one page the
    # listing stops at says nothing of them, so it must answer none.
    await put_many(admin, bucket, [f"{RUN}_logs/{j:04d}.txt" for j in range(1001)])
    triggers = run_waits(bucket, proxy_conn)
    tasks = [asyncio.create_task(run_trigger_payload(t, timeout=120)) for t in triggers]

    await settle(lambda: polls(triggers) >= 4 * N, attempts=3000)
    # One listing of the run prefix, stopped at the bound; then HEADs only, and the folders
    # enclosing it (``runs/``, at least as large) are never listed.
    assert [s.query for s in proxy.listings()] == [f"list-type=2&prefix={RUN}&encoding-type=url"]
    heads_before = object_heads(proxy, bucket)
    await settle(lambda: polls(triggers) >= 6 * N, attempts=3000)
    assert object_heads(proxy, bucket) - heads_before >= N  # two rounds of polls, answered by HEADs
    assert len(proxy.listings()) == 1
    assert not any(task.done() for task in tasks)

    await put_many(admin, bucket, [run_key(i) for i in range(N)])
    payloads = await asyncio.gather(*tasks)
    assert [p["status"] for p in payloads] == ["success"] * N
    assert [[k["key"] for k in p["keys"]] for p in payloads] == [[run_key(i)] for i in range(N)]


async def test_keys_that_share_no_folder_are_headed_as_before(
    admin: Any, bucket: str, proxy: FaultProxy, proxy_conn: str
) -> None:
    # Only the bucket's root is common to them, and the root groups only the keys that live in it.
    triggers = [
        CountingTrigger(
            bucket_key=f"k-{i:05d}/data.csv", bucket_name=bucket, aws_conn_id=proxy_conn, poll_interval=INTERVAL
        )
        for i in range(N)
    ]
    tasks = [asyncio.create_task(run_trigger_payload(t, timeout=120)) for t in triggers]
    await settle(lambda: polls(triggers) >= 3 * N, attempts=3000)
    assert not any(task.done() for task in tasks)

    await put_many(admin, bucket, [f"k-{i:05d}/data.csv" for i in range(N)])
    payloads = await asyncio.gather(*tasks)
    assert [p["status"] for p in payloads] == ["success"] * N
    assert proxy.listings() == []
    assert object_heads(proxy, bucket) == polls(triggers)  # one HEAD per poll


async def test_a_key_that_appears_later_is_found_by_the_next_round_of_a_run_prefix(
    admin: Any, bucket: str, proxy: FaultProxy
) -> None:
    poller = S3Poller(await new_client(admin_settings(proxy.url)), where="aws_conn_id='x'")
    # A long interval (a 1 s window, 20 expected polls in it): a slow round on a busy machine
    # leaves no key stale before the next one.
    interval = 10.0
    window = listing_reuse_window(interval)
    try:

        async def round_of_polls() -> list[Any]:
            return list(
                await asyncio.gather(
                    *(poller.find_object(bucket, run_key(i), poll_interval=interval) for i in range(N))
                )
            )

        assert await round_of_polls() == [None] * N  # first polls: a HEAD each
        assert object_heads(proxy, bucket) == N and proxy.listings() == []
        await asyncio.sleep(2 * window)
        assert await round_of_polls() == [None] * N  # answered by one listing of the run prefix
        assert object_heads(proxy, bucket) == N and len(proxy.listings()) == 1

        await admin.put_object(Bucket=bucket, Key=run_key(5), Body=b"a,b\n")
        await asyncio.sleep(2 * window)
        answers = await round_of_polls()
        assert [i for i, found in enumerate(answers) if found is not None] == [5]
        assert answers[5]["ContentLength"] == 4 and answers[5]["ETag"]
        assert answers[5] == await poller.head_object(bucket, run_key(5))  # what HEAD says
        assert object_heads(proxy, bucket) == N + 2 and len(proxy.listings()) == 2
    finally:
        await poller.close()


# ---------------------------------------------------------------------------- the rule
def test_a_key_s_group_is_its_folder() -> None:
    assert folder_of("run-42/part-7.csv") == "run-42/"
    assert folder_of("a/b/c") == "a/b/"
    assert folder_of("a/b/") == "a/b/"
    assert folder_of("top.csv") == ""


def test_a_folder_lists_when_the_polls_of_a_window_outnumber_its_pages_sixteen_to_one() -> None:
    interval, window = 5.0, listing_reuse_window(5.0)  # 0.5 s: each key adds 0.1 expected poll
    group = KeyGroup("run/")
    keys = [f"run/{i}" for i in range(POLLS_PER_LISTING_PAGE * 10)]
    for k in keys[:-1]:
        group.note_poll(k, interval, 0.0)
    assert not group.lists(window, 0.0)
    group.note_poll(keys[-1], interval, 0.0)
    assert group.lists(window, 0.0)
    group.listed(pages=2)  # twice the pages: twice the polls needed
    assert not group.lists(window, 0.0)
    for i in range(len(keys), 2 * len(keys)):
        group.note_poll(f"run/{i}", interval, 0.0)
    assert group.lists(window, 0.0)
    group.note_poll(keys[0], interval, 0.0)  # the same key again is not another wait
    assert group.expected_polls(window) == pytest.approx(POLLS_PER_LISTING_PAGE * 2)


def test_keys_no_longer_polled_stop_counting() -> None:
    group = KeyGroup("run/")
    for i in range(200):
        group.note_poll(f"run/{i}", 5.0, 0.0)
    assert group.lists(0.5, 0.0)
    group.note_poll("run/0", 5.0, 10.5)  # the other waits ended more than two intervals ago
    assert group.polled.keys() == {"run/0"} and group.rate == pytest.approx(0.2)
    assert not group.lists(0.5, 10.5)
    assert not group.idle(20.5) and group.idle(20.6)  # then the last wait ended too: dropped


def test_a_refused_or_oversized_folder_uses_head_for_a_while_then_lists_again() -> None:
    group = KeyGroup("run/")
    for i in range(200):
        group.note_poll(f"run/{i}", 5.0, 0.0)
    assert group.head_only(1.0, f"it holds more than {MAX_LISTING_PAGES} pages of objects")
    assert not group.head_only(2.0, "again")  # reported once
    assert not group.lists(0.5, 1.0 + HEAD_ONLY_SECONDS - 0.1)
    assert group.lists(0.5, 1.0 + HEAD_ONLY_SECONDS)


def test_a_key_s_prefixes_are_its_folder_then_up_to_three_enclosing_folders_never_the_root() -> None:
    assert prefixes_of("runs/r-7/part=00001/data.csv") == ("runs/r-7/part=00001/", "runs/r-7/", "runs/")
    assert prefixes_of("a/b/c/d/e/f.csv") == ("a/b/c/d/e/", "a/b/c/d/", "a/b/c/", "a/b/")
    assert prefixes_of("run-42/part-7.csv") == ("run-42/",)
    assert prefixes_of("top.csv") == ("",)  # the root groups only the keys that live in it


def headed_groups(groups: KeyGroups, bucket: str, keys: list[str], interval: float, window: float) -> None:
    """Every key polled once and HEADed (as its first poll is)."""
    for k in keys:
        groups.route(bucket, k, interval, 0.0, window).headed(k)


def test_keys_in_sibling_folders_list_their_shared_prefix_once_enough_of_them_wait() -> None:
    interval, window = 5.0, listing_reuse_window(5.0)  # each key adds 0.1 expected poll
    groups = KeyGroups()
    enough = POLLS_PER_LISTING_PAGE * 10
    keys = [f"runs/r-7/part={i:05d}/data.csv" for i in range(enough)]
    headed_groups(groups, "b", keys[:-1], interval, window)
    assert groups.route("b", keys[0], interval, 0.0, window).listing is None  # one short: HEAD
    headed_groups(groups, "b", keys[-1:], interval, window)
    route = groups.route("b", keys[0], interval, 0.0, window)
    assert route.listing is not None and route.listing.prefix == "runs/r-7/"
    assert [g.prefix for g in route.counted] == [folder_of(keys[0]), "runs/r-7/"]  # not counted in runs/
    # A key not yet HEADed is counted, but its first poll is a HEAD.
    assert groups.route("b", "runs/r-7/part=new/data.csv", interval, 0.0, window).listing is None


def test_a_folder_that_lists_keeps_its_keys_out_of_the_prefix_enclosing_it() -> None:
    interval, window = 5.0, listing_reuse_window(5.0)
    groups = KeyGroups()
    many = [f"runs/r-7/a/{i:05d}.csv" for i in range(200)]
    few = [f"runs/r-7/x-{i}/data.csv" for i in range(10)]
    headed_groups(groups, "b", many + few, interval, window)  # the first round counts everyone everywhere
    later = interval * 3
    for now in (
        interval,
        2 * interval,
        later,
    ):  # later rounds: the folder lists for its own keys, which leave runs/r-7/
        for k in many + few:
            groups.route("b", k, interval, now, window)
    folder = groups.route("b", many[0], interval, later, window).listing
    assert folder is not None and folder.prefix == "runs/r-7/a/"
    assert groups.groups["b", "runs/r-7/"].polled.keys() == set(few)
    assert groups.route("b", few[0], interval, later, window).listing is None  # 10 keys: HEAD


def test_a_prefix_on_head_ends_the_walk_and_enclosing_prefixes_weigh_the_pages_inside_them() -> None:
    interval, window = 5.0, listing_reuse_window(5.0)
    groups = KeyGroups()
    keys = [f"runs/r-7/part={i:05d}/data.csv" for i in range(400)]
    headed_groups(groups, "b", keys, interval, window)
    run = groups.groups["b", "runs/r-7/"]
    assert groups.route("b", keys[0], interval, 0.0, window).listing is run
    # Listed in three pages: 400 keys (40 expected polls) are too few; runs/ holds those pages
    # too, so it is not listed either.
    run.listed(pages=3)
    route = groups.route("b", keys[0], interval, 0.0, window)
    assert route.listing is None and [g.prefix for g in route.counted] == [folder_of(keys[0]), RUN, "runs/"]
    # Past the bound: HEAD, and the walk stops there (runs/ is at least as large).
    run.listed(pages=1)
    assert run.head_only(0.0, "too large")
    route = groups.route("b", keys[1], interval, 0.0, window)
    assert route.listing is None and [g.prefix for g in route.counted] == [folder_of(keys[1]), RUN]


def test_keys_of_two_buckets_never_share_a_prefix_group() -> None:
    interval, window = 5.0, listing_reuse_window(5.0)
    groups = KeyGroups()
    keys = [f"runs/r-7/part={i:05d}/data.csv" for i in range(POLLS_PER_LISTING_PAGE * 10)]
    half = len(keys) // 2
    headed_groups(groups, "bucket-a", keys[:half], interval, window)
    headed_groups(groups, "bucket-b", keys[half:], interval, window)
    assert groups.route("bucket-a", keys[0], interval, 0.0, window).listing is None
    assert groups.route("bucket-b", keys[-1], interval, 0.0, window).listing is None
    headed_groups(groups, "bucket-a", keys[half:], interval, window)  # the same keys in bucket-a: enough
    assert groups.route("bucket-a", keys[0], interval, 0.0, window).listing is groups.groups["bucket-a", RUN]


def test_a_listing_stopped_at_its_bound_says_nothing_of_keys_past_its_last_page() -> None:
    details = ((1, '"e"', None),) * 2
    stopped = Listing(("runs/r-7/_logs/1", "runs/r-7/_logs/2"), details, complete=False)
    assert stopped.covers("runs/r-7/_logs/0") and stopped.covers("runs/r-7/_logs/2")
    assert not stopped.covers("runs/r-7/part=00001/data.csv")
    assert not Listing((), (), complete=False).covers("a")
    complete = Listing(("runs/r-7/_logs/1", "runs/r-7/_logs/2"), details)
    assert complete.covers("runs/r-7/part=00001/data.csv") and "runs/r-7/part=00001/data.csv" not in complete
    # S3's order is UTF-8 byte order, which is Python's str order.
    assert sorted(["é", "z", "€", "a"]) == sorted(["é", "z", "€", "a"], key=lambda k: k.encode())
