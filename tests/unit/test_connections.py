"""Connection lookup in the triggerer: clear errors, merged lookups, no blocked loop."""

from __future__ import annotations

import asyncio
import json

import pytest

from airflow_deferrable_kit import connections
from airflow_deferrable_kit.errors import FatalError
from airflow_deferrable_kit.testing import watch_blocking
from tests.support.supervisor import install_supervisor


async def test_unknown_conn_id_is_a_fatal_error_naming_the_argument() -> None:
    with pytest.raises(FatalError, match="aws_conn_id='nowhere': no Airflow connection") as info:
        await connections.get_connection("nowhere", argument="aws_conn_id")
    assert info.value.error_type == "connection_not_found"


async def test_a_miss_within_the_grace_window_is_transient_then_fatal_when_it_closes(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Inside the triggerer "not found" can mean "could not ask": believe it only after the window.
    from airflow_deferrable_kit.errors import TransientError

    install_supervisor(monkeypatch, "unreachable")  # a triggerer restart, an API server outage
    now = [1_000.0]
    monkeypatch.setattr(connections, "NOT_FOUND_GRACE", 30.0)
    monkeypatch.setattr(connections, "_now", lambda: now[0])
    with pytest.raises(TransientError, match=r"postgres_conn_id='late'.*up to 30s") as first:
        await connections.get_connection("late", argument="postgres_conn_id")
    assert first.value.error_type == "unavailable"
    # The log line says why it waits and what happens then (the trade-off), and where to read more.
    assert (
        "Airflow found no connection with this id, but ExecutionAPISecretsBackend (the API server, through the "
        "triggerer's supervisor) could not be asked" in first.value.message
    )
    assert "before failing the wait" in first.value.message
    assert "docs/operations.md#connections" in first.value.message
    now[0] += 29.0
    with pytest.raises(TransientError):
        await connections.get_connection("late", argument="postgres_conn_id")
    now[0] += 1.5
    with pytest.raises(FatalError, match=r"postgres_conn_id='late': no Airflow connection.*30s after") as final:
        await connections.get_connection("late", argument="postgres_conn_id")
    assert final.value.error_type == "connection_not_found"


async def test_a_connection_that_appears_within_the_window_is_used_and_the_window_resets(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from airflow_deferrable_kit.errors import TransientError

    install_supervisor(monkeypatch, "unreachable")
    monkeypatch.setattr(connections, "NOT_FOUND_GRACE", 30.0)
    with pytest.raises(TransientError):
        await connections.get_connection("blip")
    monkeypatch.setenv("AIRFLOW_CONN_BLIP", json.dumps({"conn_type": "http", "host": "example.invalid"}))
    conn = await connections.get_connection("blip")
    assert conn.host == "example.invalid"
    assert "blip" not in connections._first_miss


async def test_a_miss_every_secrets_backend_answered_fails_at_once_within_the_grace_window(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Here the environment is Airflow's only secrets backend, and it answers: the connection cannot
    exist, so there is nothing for the window to wait for (it used to wait 30 s all the same)."""
    monkeypatch.setattr(connections, "NOT_FOUND_GRACE", 30.0)
    with pytest.raises(FatalError, match=r"aws_conn_id='aws_typo': no Airflow connection .*said so") as info:
        await connections.get_connection("aws_typo", argument="aws_conn_id")
    assert info.value.error_type == "connection_not_found"
    assert "aws_typo" not in connections._first_miss


async def test_a_miss_the_api_server_answered_through_the_supervisor_fails_at_once(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """In the triggerer the execution-API backend says "not found" for "could not ask" too; asked
    directly, the supervisor passes on the API server's own answer, which is believed."""
    supervisor = install_supervisor(monkeypatch, "not_found")
    monkeypatch.setattr(connections, "NOT_FOUND_GRACE", 30.0)
    with pytest.raises(FatalError, match=r"http_conn_id='api_typo': no Airflow connection") as info:
        await connections.get_connection("api_typo", argument="http_conn_id")
    assert info.value.error_type == "connection_not_found"
    assert supervisor.asked == ["api_typo", "api_typo"]  # Airflow's lookup, then the kit's question


async def test_a_thousand_concurrent_lookups_resolve_once_without_blocking(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(
        "AIRFLOW_CONN_SHARED_LOOKUP",
        json.dumps(
            {"conn_type": "http", "host": "example.invalid", "password": "s3cr3t", "extra": {"region": "eu-west-1"}}
        ),
    )
    from airflow.sdk import BaseHook

    calls = 0
    real = BaseHook.aget_connection.__func__  # type: ignore[attr-defined]

    async def counting(cls: type, conn_id: str) -> object:
        nonlocal calls
        calls += 1
        return await real(cls, conn_id)

    monkeypatch.setattr(BaseHook, "aget_connection", classmethod(counting))
    with watch_blocking(0.2) as blocked:  # the triggerer watchdog's threshold
        results = await asyncio.gather(*(connections.get_connection("shared_lookup") for _ in range(1000)))
    assert {c.host for c in results} == {"example.invalid"}
    assert calls == 1
    assert await connections.get_extra(results[0]) == {"region": "eu-west-1"}
    assert blocked == []


async def test_waits_of_one_connection_mask_its_extra_once_and_a_rotated_extra_again(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Each mask is a round trip through the triggerer's supervisor, one at a time for the whole
    # process: waits starting one after another (no lookup to merge) must not each send one.
    channel = install_supervisor(monkeypatch, "not_found")
    extra = {"endpoint_url": "http://s3.invalid", "aws_session_token": "tok-1", "config": {"retries": 3}}
    monkeypatch.setenv("AIRFLOW_CONN_MASKED_ONCE", json.dumps({"conn_type": "aws", "extra": extra}))
    # Airflow's lookup masks what it found itself; what is counted here is what reading the extra adds.
    looked_up = [await connections.get_connection("masked_once") for _ in range(50)]
    channel.sent.clear()
    read = [await connections.get_extra(conn) for conn in looked_up]
    assert read == [extra] * 50
    assert channel.masked() == [extra]
    read[0]["config"]["retries"] = 0  # one wait's copy is its own
    assert read[1]["config"] == {"retries": 3}

    rotated = {**extra, "aws_session_token": "tok-2"}
    monkeypatch.setenv("AIRFLOW_CONN_MASKED_ONCE", json.dumps({"conn_type": "aws", "extra": rotated}))
    conn = await connections.get_connection("masked_once")
    channel.sent.clear()
    assert await connections.get_extra(conn) == rotated
    assert channel.masked() == [rotated]


async def test_concurrent_first_reads_of_an_extra_share_one_mask(monkeypatch: pytest.MonkeyPatch) -> None:
    channel = install_supervisor(monkeypatch, "not_found")
    monkeypatch.setenv(
        "AIRFLOW_CONN_MASKED_TOGETHER", json.dumps({"conn_type": "http", "extra": {"X-Api-Key": "k-123"}})
    )
    conn = await connections.get_connection("masked_together")
    channel.sent.clear()
    extras = await asyncio.gather(*(connections.get_extra(conn) for _ in range(1000)))
    assert extras == [{"X-Api-Key": "k-123"}] * 1000
    assert channel.masked() == [{"X-Api-Key": "k-123"}]


async def test_a_failed_extra_read_is_not_kept(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AIRFLOW_CONN_FLAKY_EXTRA", json.dumps({"conn_type": "http", "extra": {"region": "r1"}}))
    conn = await connections.get_connection("flaky_extra")
    calls = 0

    def fail_once() -> None:
        nonlocal calls
        calls += 1
        if calls == 1:
            raise RuntimeError("channel closed")

    if hasattr(type(conn), "aextra_dejson"):  # Airflow 3.3
        real = type(conn).aextra_dejson

        async def read(self: object) -> dict[str, object]:
            fail_once()
            return await real(self)  # type: ignore[arg-type]

        monkeypatch.setattr(type(conn), "aextra_dejson", read)
    else:  # before 3.3: the synchronous property alone
        real_property = type(conn).extra_dejson

        def read_sync(self: object) -> dict[str, object]:
            fail_once()
            return real_property.fget(self)  # type: ignore[no-any-return]

        monkeypatch.setattr(type(conn), "extra_dejson", property(read_sync))
    with pytest.raises(RuntimeError, match="channel closed"):
        await connections.get_extra(conn)
    assert await connections.get_extra(conn) == {"region": "r1"}
    assert await connections.get_extra(conn) == {"region": "r1"}
    assert calls == 2


async def test_an_undecodable_extra_among_healthy_ones_reads_as_airflow_reads_it_and_alone(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Airflow reads an extra that is not JSON as {} (and logs why). Kept reads are keyed by the
    # extra's text, so the broken one's {} must reach none of the healthy connections' waits,
    # theirs must not reach it, and once it is mended the mended text is read.
    channel = install_supervisor(monkeypatch, "not_found")
    healthy = {f"healthy_{i}": {"region": f"r{i}", "token": f"t-{i}"} for i in range(3)}
    for conn_id, extra in healthy.items():
        monkeypatch.setenv(f"AIRFLOW_CONN_{conn_id.upper()}", json.dumps({"conn_type": "http", "extra": extra}))
    monkeypatch.setenv("AIRFLOW_CONN_BROKEN_EXTRA", json.dumps({"conn_type": "http", "extra": '{"region": "r9",'}))
    names = [*healthy, "broken_extra"]
    conns = {name: await connections.get_connection(name) for name in names}
    channel.sent.clear()
    order = [names[i % len(names)] for i in range(400)]  # interleaved, as waits of many DAGs start
    read = await asyncio.gather(*(connections.get_extra(conns[name]) for name in order))
    for name, extra in zip(order, read, strict=True):
        assert extra == healthy.get(name, {}), name
    assert sorted(channel.masked(), key=str) == sorted(healthy.values(), key=str)

    monkeypatch.setenv("AIRFLOW_CONN_BROKEN_EXTRA", json.dumps({"conn_type": "http", "extra": {"region": "r9"}}))
    mended = await connections.get_connection("broken_extra")
    assert await connections.get_extra(mended) == {"region": "r9"}
    assert await connections.get_extra(conns["healthy_0"]) == healthy["healthy_0"]


async def test_a_connection_of_another_type_is_fatal_naming_both(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AIRFLOW_CONN_WAREHOUSE", json.dumps({"conn_type": "postgres", "host": "db.invalid"}))
    with pytest.raises(
        FatalError, match=r"http_conn_id='warehouse' is a connection of type 'postgres'.*'http'"
    ) as info:
        await connections.get_connection("warehouse", argument="http_conn_id", conn_types=("http", "https"))
    assert info.value.error_type == "bad_connection"


async def test_a_generic_or_untyped_connection_is_accepted_as_any(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AIRFLOW_CONN_ANYTHING", json.dumps({"conn_type": "generic", "host": "h.invalid"}))
    conn = await connections.get_connection("anything", argument="http_conn_id", conn_types=("http",))
    assert conn.host == "h.invalid"
