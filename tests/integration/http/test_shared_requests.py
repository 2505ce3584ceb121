"""Waits sending the identical request share one response; each judges it by its own conditions.

The real aiohttp server counts the requests it receives (and can hold them unanswered), so the
tests compare requests with polls and never time anything.
"""

from __future__ import annotations

import asyncio
import json
import threading
import time
from collections.abc import Callable
from typing import Any

import pytest

from airflow_deferrable_kit._http import responses
from airflow_deferrable_kit._http.responses import shared_responses
from airflow_deferrable_kit._shared_polls import REUSE_MAX, SharedAnswers, reuse_window
from airflow_deferrable_kit.leases import held_keys
from airflow_deferrable_kit.testing import run_trigger_payload
from airflow_deferrable_kit.triggers.base import Found, deadline_after
from airflow_deferrable_kit.triggers.http import HttpBatchReadyTrigger
from tests.integration.http.conftest import Seen, Server, reply
from tests.integration.s3.fault_proxy import settle

Serve = Callable[..., Server]
Conn = Callable[..., str]


class Board:
    """What the server answers, switchable from the test, and a gate that holds requests unanswered."""

    def __init__(self, answer: Callable[[Seen], Any]) -> None:
        self.answer = answer
        self.open = threading.Event()
        self.open.set()
        self.held = 0

    def hold(self) -> None:
        self.open.clear()

    async def __call__(self, seen: Seen) -> Any:
        self.held += 1
        try:
            while not self.open.is_set():  # noqa: ASYNC110 - opened from the test's thread, not this loop
                await asyncio.sleep(0.01)
        finally:
            self.held -= 1
        return self.answer(seen)


def success(state: str) -> dict[str, Any]:
    from airflow_deferrable_kit.conditions import build_acceptors
    from airflow_deferrable_kit.triggers.http import MATCHERS

    return build_acceptors(matchers=MATCHERS, success=[{"path": "state", "equals": state}])[0]


class CountingTrigger(HttpBatchReadyTrigger):
    """Counts its polls and records each backoff, so a test compares requests with polls."""

    async def check(self) -> Found | None:
        self.__dict__["polls"] = self.__dict__.get("polls", 0) + 1
        return await super().check()

    def backoff_delay(self, failures: int, retry_after: float | None = None) -> float:
        delay = super().backoff_delay(failures, retry_after)
        self.__dict__.setdefault("failures", []).append(failures)
        return delay


def polls(triggers: list[Any]) -> int:
    return sum(t.__dict__.get("polls", 0) for t in triggers)


def wait(conn: str, **kwargs: Any) -> CountingTrigger:
    kwargs.setdefault("endpoint", "v1/batches/1/status")
    kwargs.setdefault("acceptors", [success("ready")])
    kwargs.setdefault("poll_interval", 1.0)
    kwargs.setdefault("max_backoff", 0.5)
    return CountingTrigger(http_conn_id=conn, **kwargs)


def start(triggers: list[Any]) -> list[asyncio.Task[Any]]:
    return [asyncio.create_task(run_trigger_payload(t, timeout=60)) for t in triggers]


# -------------------------------------------------------------------- one URL, many waits
async def test_many_waits_on_one_url_share_responses_and_each_decides_on_its_own(
    serve: Serve, connection: Conn
) -> None:
    board = Board(lambda seen: reply(200, {"state": "pending", "rows": 7}))
    server = serve(board)
    conn = connection("batch_api", host="127.0.0.1", port=server.port)
    n = 100
    board.hold()
    # Half wait for "ready", half for "done": the same request, different conditions.
    triggers = [wait(conn, acceptors=[success("ready" if i % 2 else "done")], select=["rows"]) for i in range(n)]
    tasks = start(triggers)

    await settle(lambda: polls(triggers) == n and board.held == 1)  # every wait deferred at once has polled ...
    await asyncio.sleep(0.2)  # (room for a wrong second request to show up: it must not)
    assert len(server.requests) == 1  # ... and the first round is one request
    board.open.set()

    await settle(lambda: polls(triggers) >= 3 * n, attempts=1500)  # three rounds of polls
    requests, polled = len(server.requests), polls(triggers)
    # Polls are spread over the interval, so a round costs about interval / window requests.
    rounds = polled / n
    assert requests <= rounds * (1.0 / reuse_window(1.0) + 2)
    assert requests * 5 <= polled
    assert not any(task.done() for task in tasks)

    board.answer = lambda seen: reply(200, {"state": "ready", "rows": 9})
    await settle(lambda: sum(task.done() for task in tasks) == n // 2, attempts=1500)
    ready = [task.result() for task in tasks if task.done()]
    assert all(p["status"] == "success" and p["fields"] == {"rows": 9} for p in ready)
    finished = [t.acceptors[0]["expected"] for t, task in zip(triggers, tasks, strict=True) if task.done()]
    assert finished == ["ready"] * 50

    board.answer = lambda seen: reply(200, {"state": "done", "rows": 11})
    payloads = await asyncio.gather(*tasks)
    assert all(p["decision"]["actual"] == ("ready" if i % 2 else "done") for i, p in enumerate(payloads))
    assert len(server.requests) * 5 <= polls(triggers)
    assert held_keys() == {}


async def test_requests_that_differ_in_anything_sent_are_not_shared(serve: Serve, connection: Conn) -> None:
    board = Board(lambda seen: reply(200, {"state": "ready", "team": seen.headers.get("X-Team")}))
    server = serve(board)
    team_a = connection("team_a", host="127.0.0.1", port=server.port, extra={"X-Team": "a"})
    team_b = connection("team_b", host="127.0.0.1", port=server.port, extra={"X-Team": "b"})
    same_as_a = connection("also_a", host="127.0.0.1", port=server.port, extra={"X-Team": "a"})
    board.hold()
    kinds = [
        {"http_conn_id": team_a},
        {"http_conn_id": same_as_a},  # a different connection id sending the very same request: shared
        {"http_conn_id": team_b},  # another header value
        {"http_conn_id": team_a, "json_body": {"day": 1}, "method": "POST"},
        {"http_conn_id": team_a, "json_body": {"day": 2}, "method": "POST"},  # another body
        {"http_conn_id": team_a, "query": {"day": "1"}},  # another URL
        {"http_conn_id": team_a, "method": "PUT"},  # another method
        {"http_conn_id": team_a, "request_timeout": 5.0},  # read differently
    ]
    triggers = [
        HttpBatchReadyTrigger(endpoint="status", poll_interval=5.0, select=["team"], **kind)
        for kind in kinds
        for _ in range(10)
    ]
    tasks = start(triggers)
    await settle(lambda: board.held == len(kinds) - 1)
    await asyncio.sleep(0.2)
    assert board.held == len(kinds) - 1  # 80 waits, 7 distinct requests
    board.open.set()
    payloads = await asyncio.gather(*tasks)
    assert len(server.requests) == len(kinds) - 1
    assert [p["fields"]["team"] for p in payloads[::10]] == ["a", "a", "b", "a", "a", "a", "a", "a"]
    bodies = sorted(seen.body for seen in server.requests if seen.method == "POST")
    assert bodies == [b'{"day": 1}', b'{"day": 2}']


async def test_credentials_are_part_of_the_request_and_each_payload_is_redacted(serve: Serve, connection: Conn) -> None:
    board = Board(lambda seen: reply(200, {"state": "ready", "echo": seen.headers.get("Authorization")}))
    server = serve(board)
    tokens = ["tok-alpha-4b1d5e8f0", "tok-bravo-9c2e6f1a3"]
    conns = [
        connection(f"api_{i}", host="127.0.0.1", port=server.port, extra={"bearer_token": token})
        for i, token in enumerate(tokens)
    ]
    board.hold()
    triggers = [HttpBatchReadyTrigger(http_conn_id=c, endpoint="s", poll_interval=5) for c in conns for _ in range(5)]
    tasks = start(triggers)
    await settle(lambda: board.held == 2)  # one request per credential, never one for both
    board.open.set()
    payloads = await asyncio.gather(*tasks)
    assert sorted(seen.headers["Authorization"] for seen in server.requests) == [f"Bearer {t}" for t in tokens]
    for payload in payloads:
        text = json.dumps(payload)
        assert not any(token in text for token in tokens)
        assert json.loads(payload["body_excerpt"])["echo"] in ("***", "Bearer ***")  # masked, for each wait


# -------------------------------------------------------------------- errors and cancelling
async def test_a_failed_shared_request_reaches_every_wait_and_is_not_reused(serve: Serve, connection: Conn) -> None:
    answers = iter([reply(503, "busy")])
    board = Board(lambda seen: next(answers, None) or reply(200, {"state": "ready"}))
    server = serve(board)
    conn = connection("batch_api", host="127.0.0.1", port=server.port)
    board.hold()
    triggers = [wait(conn, poll_interval=0.5, max_backoff=0.5) for _ in range(20)]
    tasks = start(triggers)
    await settle(lambda: board.held == 1)
    board.open.set()
    payloads = await asyncio.gather(*tasks)
    assert [p["status"] for p in payloads] == ["success"] * 20
    # Every wait got the shared 503 once and backed off on its own; the next polls asked again.
    assert [t.__dict__["failures"] for t in triggers] == [[1]] * 20
    assert [seen.index for seen in server.requests][:2] == [0, 1]
    assert 2 <= len(server.requests) <= 1 + 20


async def test_a_503_burst_draws_no_more_requests_than_healthy_polling(serve: Serve, connection: Conn) -> None:
    """200 waits on one URL: while it answers 503 the server gets no more requests per second than
    while it answered 200 (a 503 is an answer, shared in its window like any other, and each wait
    backs off on its own). Rates, so the phases take a few real seconds; only counts are compared."""
    state = {"answer": lambda: reply(200, {"state": "pending"})}
    server = serve(lambda seen: state["answer"]())
    conn = connection("batch_api", host="127.0.0.1", port=server.port)
    n, phase = 200, 4.0
    triggers = [wait(conn, poll_interval=1.0, max_backoff=1.0) for _ in range(n)]
    tasks = start(triggers)
    await settle(lambda: polls(triggers) >= 2 * n, attempts=3000)

    healthy_from = time.monotonic()
    await asyncio.sleep(phase)
    state["answer"] = lambda: reply(503, "busy")
    burst_from = time.monotonic()
    await asyncio.sleep(phase)
    state["answer"] = lambda: reply(200, {"state": "ready"})
    burst_to = time.monotonic()

    def rate(start: float, end: float) -> float:
        return sum(1 for seen in server.requests if start <= seen.at < end) / (end - start)

    healthy, burst = rate(healthy_from, burst_from), rate(burst_from, burst_to)
    print(f"\nshared HTTP answer: {healthy:.1f} requests/s healthy, {burst:.1f} requests/s during a 503 burst")
    assert burst <= healthy
    assert all(t.__dict__.get("failures") for t in triggers)  # every wait saw the 503s
    payloads = await asyncio.gather(*tasks)
    assert [p["status"] for p in payloads] == ["success"] * n


async def test_a_fatal_shared_answer_ends_each_wait_with_its_own_error(serve: Serve, connection: Conn) -> None:
    server = serve(lambda seen: reply(403, "forbidden"))
    conn = connection("batch_api", host="127.0.0.1", port=server.port)
    triggers = [wait(conn, excerpt_chars=5 + 4 * i) for i in range(10)]
    payloads = await asyncio.gather(*start(triggers))
    assert {p["error_type"] for p in payloads} == {"authorization"}
    assert [p["body_excerpt"] for p in payloads][:2] == ["forbi... [4 more characters]", "forbidden"]
    assert len(server.requests) == 1


async def test_cancelling_one_wait_leaves_the_shared_request_to_the_others(serve: Serve, connection: Conn) -> None:
    board = Board(lambda seen: reply(200, {"state": "ready"}))
    server = serve(board)
    conn = connection("batch_api", host="127.0.0.1", port=server.port)
    board.hold()
    triggers = [wait(conn) for _ in range(20)]
    tasks = start(triggers)
    await settle(lambda: board.held == 1)
    for task in tasks[:19]:
        task.cancel()
    await asyncio.gather(*tasks[:19], return_exceptions=True)
    assert board.held == 1 and len(shared_responses()) == 1  # still in flight for the last wait
    board.open.set()
    payload = await tasks[19]
    assert payload["status"] == "success"
    assert len(server.requests) == 1


async def test_cancelling_every_wait_cancels_their_shared_request(serve: Serve, connection: Conn) -> None:
    board = Board(lambda seen: reply(200, {"state": "ready"}))
    server = serve(board)
    conn = connection("batch_api", host="127.0.0.1", port=server.port)
    board.hold()
    tasks = start([wait(conn) for _ in range(20)])
    await settle(lambda: board.held == 1)

    def request_tasks() -> list[asyncio.Task[Any]]:
        coros = ((t, t.get_coro()) for t in asyncio.all_tasks())
        return [t for t, c in coros if getattr(c, "cr_code", None) is responses.send.__code__]

    assert len(request_tasks()) == 1
    for task in tasks:
        task.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)
    await settle(lambda: request_tasks() == [])
    await settle(lambda: board.held == 0)  # the server saw the request go away
    assert len(shared_responses()) == 0
    assert held_keys() == {}
    board.open.set()
    assert len(server.requests) == 1


# ------------------------------------------------------------------------------- the window
async def test_an_answer_serves_only_polls_within_its_window_and_never_the_same_caller_twice() -> None:
    answers = SharedAnswers()
    sent: list[int] = []

    async def fetch() -> dict[str, int]:
        sent.append(len(sent))
        return {"n": len(sent)}

    first = await answers.share("q", fetch, max_age=30)
    assert await answers.share("q", fetch, max_age=30) is first and sent == [0]
    again = await answers.share("q", fetch, max_age=30, seen=id(first))  # this caller judged it already
    assert again is not first and sent == [0, 1]
    assert (await answers.share("q", fetch, max_age=0)) is not again  # started before this poll: too old
    assert sent == [0, 1, 2]
    await settle(lambda: len(answers) == 0, attempts=int(REUSE_MAX / 0.02) * 3)  # dropped after its window
    answers.close()


def test_the_reuse_window_is_a_tenth_of_the_poll_interval_up_to_a_second() -> None:
    assert reuse_window(0.05) == pytest.approx(0.005)
    assert reuse_window(5) == pytest.approx(0.5)
    assert reuse_window(30) == REUSE_MAX == 1.0
    assert reuse_window(3600) == 1.0


# -------------------------------------------------------------------- one bad endpoint among many
@pytest.mark.parametrize("fault", ["500", "hang"])
async def test_one_failing_or_hanging_endpoint_among_forty_healthy_ones_delays_none_of_them(
    serve: Serve, connection: Conn, fault: str
) -> None:
    """40 waits on 40 URLs of one server (the one session, the one host's socket pool) and 5 waits
    on a URL that answers 500, or holds every request past its ``request_timeout``.

    The healthy waits see no error and each finds its batch ready within one poll interval (plus
    the sharing window) of the server saying so; the bad waits retry the transient error with
    backoff until their deadline and end with a timeout naming it, as docs/sensors/http.md says.
    """
    poll, request_timeout, bad_deadline = 1.0, 0.5, 6.0
    ready = threading.Event()

    async def answer(seen: Seen) -> Any:
        if seen.path.startswith("/bad"):
            if fault == "hang":
                await asyncio.sleep(60)  # cancelled when the client gives up (handler_cancellation)
            return reply(500, "internal error")
        return reply(200, {"state": "ready" if ready.is_set() else "pending"})

    server = serve(answer)
    conn = connection("batch_api", host="127.0.0.1", port=server.port)
    common = {"poll_interval": poll, "max_backoff": 2.0, "request_timeout": request_timeout}
    healthy = [wait(conn, endpoint=f"v1/batches/{i}/status", **common) for i in range(40)]
    bad = [wait(conn, endpoint="bad/status", deadline=deadline_after(bad_deadline), **common) for _ in range(5)]
    arrived: dict[int, float] = {}

    async def run(trigger: CountingTrigger) -> dict[str, Any]:
        payload = await run_trigger_payload(trigger, timeout=60)
        arrived[id(trigger)] = time.monotonic()
        return payload

    tasks = [asyncio.create_task(run(t)) for t in [*healthy, *bad]]
    # Pending for a while, the bad URL failing (or hanging) beside them all along.
    await settle(lambda: all(t.__dict__.get("failures") for t in bad) and polls(healthy) >= 3 * len(healthy))
    assert not any(task.done() for task in tasks)
    before = {id(t): t.__dict__["polls"] for t in healthy}
    ready.set()
    flipped = time.monotonic()
    payloads = await asyncio.gather(*tasks[: len(healthy)])
    bad_payloads = await asyncio.gather(*tasks[len(healthy) :])

    assert [p["status"] for p in payloads] == ["success"] * len(healthy)
    assert all(p["status_code"] == 200 for p in payloads)
    assert all("failures" not in t.__dict__ for t in healthy)  # no healthy wait saw an error
    # Within one poll of ready: at most the poll that shared an answer begun just before, then one.
    latest = max(arrived[id(t)] - flipped for t in healthy)
    print(f"\n{fault}: 40 healthy waits found ready within {latest * 1000:.0f} ms (poll interval {poll} s)")
    assert latest <= poll + reuse_window(poll) + 1.0
    assert max(t.__dict__["polls"] - before[id(t)] for t in healthy) <= 2
    # The bad waits: transient until the deadline, then a timeout naming the last error.
    error_type = "network" if fault == "hang" else "unavailable"
    for payload in bad_payloads:
        assert payload["status"] == "timeout", payload
        assert f"last transient error ({error_type})" in payload["message"], payload["message"]
    assert all(len(t.__dict__["failures"]) >= 2 for t in bad)  # retried, with backoff between
    bad_requests = [seen for seen in server.requests if seen.path.startswith("/bad")]
    assert len(bad_requests) <= polls(bad)  # shared or not, never more requests than polls
    assert held_keys() == {}
