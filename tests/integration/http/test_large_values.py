"""Large or non-ASCII answers never turn a ready batch into an error, and unknown hosts end fast."""

from __future__ import annotations

from collections.abc import Callable

from airflow_deferrable_kit.payload import MAX_PAYLOAD_BYTES, json_size
from airflow_deferrable_kit.testing import FakeClock, run_trigger_payload
from airflow_deferrable_kit.triggers.base import deadline_after
from airflow_deferrable_kit.triggers.http import MAX_EXCERPT_CHARS, HttpBatchReadyTrigger
from tests.integration.http.conftest import Server, reply, script

Serve = Callable[..., Server]
Conn = Callable[..., str]


async def test_a_ready_batch_with_the_longest_non_ascii_excerpt_is_a_success_that_fits(
    serve: Serve, connection: Conn
) -> None:
    body = {"state": "ready", "note": "é" * 40_000}  # ~240 KB once JSON-escaped
    server = serve(script(lambda: reply(200, body)))
    conn = connection("large_http", host="127.0.0.1", port=server.port)
    trigger = HttpBatchReadyTrigger(
        http_conn_id=conn,
        endpoint="v1/status",
        acceptors=[{"state": "success", "matcher": "path", "argument": "state", "expected": "ready"}],
        select=["note"],
        excerpt_chars=MAX_EXCERPT_CHARS,
        poll_interval=0.05,
    )
    payload = await run_trigger_payload(trigger)
    assert payload["status"] == "success"  # was: error at 96,129 bytes
    assert json_size(payload) <= MAX_PAYLOAD_BYTES
    assert payload["decision"]["actual"] == "ready"


async def test_a_host_name_that_does_not_exist_ends_the_wait_after_three_attempts(connection: Conn) -> None:
    conn = connection("nowhere_http", host="batch-api.invalid", port=443, schema="https")
    clock = FakeClock()
    trigger = HttpBatchReadyTrigger(
        http_conn_id=conn, endpoint="v1/status", poll_interval=5, deadline=deadline_after(7 * 86400, clock=clock)
    )
    trigger.clock = clock  # type: ignore[misc]
    payload = await run_trigger_payload(trigger, timeout=60)
    assert payload["status"] == "error" and payload["error_type"] == "bad_connection"
    assert "never resolved (3 attempts" in payload["message"]
    assert len(clock.sleeps) == 2  # not retried for the 7 days the deadline allowed
