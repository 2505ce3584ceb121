"""Connection lookup in the triggerer: clear errors, merged lookups, no blocked loop."""

from __future__ import annotations

import asyncio
import json

import pytest

from airflow_deferrable_kit import connections
from airflow_deferrable_kit.payload import FatalError
from airflow_deferrable_kit.testing import watch_blocking


async def test_unknown_conn_id_is_a_fatal_error_naming_the_argument() -> None:
    with pytest.raises(FatalError, match="aws_conn_id='nowhere': no Airflow connection") as info:
        await connections.get_connection("nowhere", argument="aws_conn_id")
    assert info.value.error_type == "connection_not_found"


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
