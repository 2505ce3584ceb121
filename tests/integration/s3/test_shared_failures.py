"""A failure of a shared S3 request is shared too: a throttled or failing bucket sees fewer requests.

Two hundred waits share one listing of a prefix (wildcard waits), one listing of a folder
(exact-key waits) or one bucket check. While the fault proxy answers those requests 500 or
SlowDown, every poll that would have shared the answer gets the shared error instead, and the
request is sent again only after one backoff of its own (``failure_hold``): the proxy counts the
requests, and during the burst they come no faster than while the bucket was healthy, never one
per waiting poll. The phases last a few seconds of the real clock because a rate is what is
compared; what is asserted is counts and the least spacing the hold guarantees.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import time
from typing import Any

from aiohttp import web

from airflow_deferrable_kit._shared_polls import HOLD_DOUBLINGS, REUSE_MAX, SharedAnswers, failure_hold, reuse_window
from airflow_deferrable_kit.errors import TransientError
from airflow_deferrable_kit.leases import held_keys
from airflow_deferrable_kit.testing import run_trigger_payload
from airflow_deferrable_kit.triggers.base import Found
from airflow_deferrable_kit.triggers.s3 import S3KeyTrigger
from tests.integration.s3.conftest import put_many
from tests.integration.s3.fault_proxy import FaultProxy, Seen, is_listing, settle

N = 200
INTERVAL = 1.0  # a 0.1 s window: 200 waits poll 200 times a second, 20 in a window
#: 200 keys of a folder at 2 s: 20 polls expected in a 0.2 s window, above the 16 that make it
#: list, and a key stops counting only when its wait is 4 s late (so a busy machine keeps listing).
FOLDER_INTERVAL = 2.0
PHASE = 4.0  # seconds of healthy polling measured, then seconds of the burst


class Waiting(S3KeyTrigger):
    """Counts its polls and its transient errors, so a test reads what each wait went through."""

    async def check(self) -> Found | None:
        self.__dict__["polls"] = self.__dict__.get("polls", 0) + 1
        return await super().check()

    def backoff_delay(self, failures: int, retry_after: float | None = None) -> float:
        self.__dict__["errors"] = self.__dict__.get("errors", 0) + 1
        return super().backoff_delay(failures, retry_after)


def polls(triggers: list[Waiting]) -> int:
    return sum(t.__dict__.get("polls", 0) for t in triggers)


def per_second(seen: list[Seen], start: float, end: float) -> float:
    return sum(1 for s in seen if start <= s.at < end) / (end - start)


def least_gap(seen: list[Seen]) -> float:
    times = sorted(s.at for s in seen)
    return min((b - a for a, b in itertools.pairwise(times)), default=float("inf"))


async def healthy_then_burst(
    proxy: FaultProxy, triggers: list[Waiting], match: Any, status: int, code: str
) -> tuple[float, float, list[Seen]]:
    """Requests ``match`` accepts per second while healthy, then while the proxy fails them."""
    await settle(lambda: polls(triggers) >= 2 * N, attempts=3000)  # past the first rounds
    healthy_from = time.monotonic()
    await asyncio.sleep(PHASE)
    stop = proxy.refuse(match, status=status, code=code, message="Please reduce your request rate.")
    burst_from = time.monotonic()
    await asyncio.sleep(PHASE)
    stop()
    burst_to = time.monotonic()
    during = [s for s in proxy.seen if s.injected and burst_from <= s.at < burst_to]
    healthy = [s for s in proxy.seen if not s.injected and s.at < burst_from and s.method == during[0].method]
    return per_second(healthy, healthy_from, burst_from), per_second(during, burst_from, burst_to), during


async def test_a_throttled_prefix_listing_is_asked_no_more_often_than_a_healthy_one(
    admin: Any, bucket: str, proxy: FaultProxy, proxy_conn: str
) -> None:
    await put_many(admin, bucket, [f"burst/other-{j}.txt" for j in range(20)])
    triggers = [
        Waiting(
            bucket_key=f"burst/*-{i:05d}.csv",
            bucket_name=bucket,
            wildcard_match=True,
            aws_conn_id=proxy_conn,
            poll_interval=INTERVAL,
            max_backoff=INTERVAL,
        )
        for i in range(N)
    ]
    tasks = [asyncio.create_task(run_trigger_payload(t, timeout=120)) for t in triggers]

    healthy, burst, during = await healthy_then_burst(proxy, triggers, is_listing, 503, "SlowDown")
    print(f"\nprefix listing, SlowDown: {healthy:.1f} LIST/s healthy, {burst:.1f} LIST/s during the burst")

    assert during and burst <= healthy
    # After a failure the listing waits one hold of its own, at least a window, before it is asked again.
    assert least_gap(during) >= 0.9 * reuse_window(INTERVAL)
    assert sum(t.__dict__.get("errors", 0) for t in triggers) > len(during)  # the errors were shared
    assert not any(task.done() for task in tasks)

    await put_many(admin, bucket, [f"burst/k-{i:05d}.csv" for i in range(N)])
    payloads = await asyncio.gather(*tasks)
    assert [[k["key"] for k in p["keys"]] for p in payloads] == [[f"burst/k-{i:05d}.csv"] for i in range(N)]
    assert held_keys() == {}


async def test_a_failing_folder_listing_is_asked_no_more_often_than_a_healthy_one(
    admin: Any, bucket: str, proxy: FaultProxy, proxy_conn: str
) -> None:
    await put_many(admin, bucket, [f"run-7/other-{j}.txt" for j in range(20)])
    triggers = [
        Waiting(
            bucket_key=f"run-7/part-{i:05d}.csv",
            bucket_name=bucket,
            aws_conn_id=proxy_conn,
            poll_interval=FOLDER_INTERVAL,
            max_backoff=FOLDER_INTERVAL,
        )
        for i in range(N)
    ]
    tasks = [asyncio.create_task(run_trigger_payload(t, timeout=120)) for t in triggers]

    healthy, burst, during = await healthy_then_burst(proxy, triggers, is_listing, 500, "InternalError")
    print(f"\nfolder listing, 500: {healthy:.1f} LIST/s healthy, {burst:.1f} LIST/s during the burst")

    assert proxy.listings() and during and burst <= healthy
    assert least_gap(during) >= 0.9 * reuse_window(FOLDER_INTERVAL)
    assert not any(task.done() for task in tasks)

    await put_many(admin, bucket, [f"run-7/part-{i:05d}.csv" for i in range(N)])
    payloads = await asyncio.gather(*tasks)
    assert [p["status"] for p in payloads] == ["success"] * N
    assert held_keys() == {}


async def test_a_failing_bucket_check_is_asked_once_per_hold_not_once_per_wait(
    bucket: str, proxy: FaultProxy, proxy_conn: str
) -> None:
    def bucket_check(request: web.Request) -> bool:
        return request.method == "HEAD" and request.path == f"/{bucket}"

    stop = proxy.refuse(bucket_check, status=503, code="SlowDown")  # from the start: every wait asks
    triggers = [
        Waiting(
            bucket_key=f"s3://{bucket}/missing/{i}.csv",
            aws_conn_id=proxy_conn,
            poll_interval=INTERVAL,
            max_backoff=INTERVAL,
        )
        for i in range(N)
    ]
    tasks = [asyncio.create_task(run_trigger_payload(t, timeout=120)) for t in triggers]
    started = time.monotonic()
    await settle(lambda: sum(t.__dict__.get("errors", 0) for t in triggers) >= 3 * N, attempts=3000)
    stop()
    lasted = time.monotonic() - started
    failed = [s for s in proxy.seen if s.injected]
    print(f"\nbucket check, 503: {len(failed)} HEAD bucket in {lasted:.1f} s for {N} waits and {3 * N} errors")

    # One request per hold (a second, doubling), for every wait: never one per failed poll.
    assert len(failed) <= lasted / REUSE_MAX + 1
    assert least_gap(failed) >= 0.9 * REUSE_MAX

    def checks() -> list[int]:
        return [s.status for s in proxy.seen if s.method == "HEAD" and s.path == f"/{bucket}" and not s.injected]

    await settle(lambda: bool(checks()), attempts=3000)
    polled = polls(triggers)
    await settle(lambda: polls(triggers) >= polled + 2 * N, attempts=3000)  # two more rounds of polls
    assert checks() == [200]  # once it answers, it answers every wait
    assert not any(task.done() for task in tasks)
    for task in tasks:
        task.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)


# --------------------------------------------------------------------------------- the rule
async def test_a_failure_answers_its_question_for_a_doubling_hold() -> None:
    answers = SharedAnswers()
    sent: list[float] = []
    failing = True

    async def fetch() -> str:
        sent.append(asyncio.get_running_loop().time())
        if failing:
            raise TransientError("throttled", retry_after=None, error_type="throttled")
        return "answer"

    window = 0.05
    errors = []
    for _ in range(3):  # three polls in the hold of one failure: one request
        try:
            await answers.share("q", fetch, max_age=window)
        except TransientError as exc:
            errors.append(exc)
    assert len(sent) == 1 and len(errors) == 3 and len({id(e) for e in errors}) == 1
    loop = asyncio.get_running_loop()

    def hold_over() -> bool:
        return loop.time() >= answers._shared["q"].held_until

    holds = [answers._shared["q"].held_until - sent[-1]]
    for _ in range(HOLD_DOUBLINGS + 1):  # each next failure in a row holds twice as long, to a cap
        await settle(hold_over, attempts=500)
        with contextlib.suppress(TransientError):
            await answers.share("q", fetch, max_age=window)
        holds.append(answers._shared["q"].held_until - sent[-1])
    assert len(sent) == HOLD_DOUBLINGS + 2  # one request per hold
    expected = [window * 2**k for k in (0, 1, 2, 3, 3)]
    # From when the request failed (it fails at once): the hold, and the turn its callback took.
    assert all(want <= got < want + window for got, want in zip(holds, expected, strict=True)), holds
    failing = False
    await settle(hold_over, attempts=500)
    assert await answers.share("q", fetch, max_age=window) == "answer"
    assert answers._shared["q"].streak == HOLD_DOUBLINGS + 2  # it ended a streak of that many failures
    answers.close()


def test_a_hold_is_at_least_a_window_and_honours_retry_after_up_to_its_cap() -> None:
    assert failure_hold(0.1, 1) == 0.1
    assert failure_hold(0.1, 2) == 0.2
    assert failure_hold(0.1, 50) == 0.1 * 2**HOLD_DOUBLINGS
    assert failure_hold(0.1, 1, retry_after=0.5) == 0.5
    assert failure_hold(0.1, 1, retry_after=30.0) == 0.1 * 2**HOLD_DOUBLINGS  # each wait honours the rest
