"""Helpers shared by the Postgres wait's tests."""

from __future__ import annotations

import asyncio
import json
import uuid
from collections.abc import Callable
from typing import Any

import asyncpg
import pytest

from scripts import services

ConnSetter = Callable[..., str]


def unique(prefix: str) -> str:
    return f"{prefix}_{uuid.uuid4().hex[:10]}"


def define_connection(
    monkeypatch: pytest.MonkeyPatch,
    server: services.Postgres,
    *,
    conn_id: str | None = None,
    login: str = "postgres",
    password: str | None = None,
    schema: str = "postgres",
    extra: dict[str, Any] | None = None,
) -> str:
    """Define an Airflow connection to ``server``; ``application_name`` defaults to the id."""
    conn_id = conn_id or unique("pg")
    document: dict[str, Any] = {
        "conn_type": "postgres",
        "host": "127.0.0.1",
        "port": server.port,
        "login": login,
        "schema": schema,
        "extra": {"application_name": conn_id, **(extra or {})},
    }
    if password is not None:
        document["password"] = password
    monkeypatch.setenv(f"AIRFLOW_CONN_{conn_id.upper()}", json.dumps(document))
    return conn_id


async def backends(admin: asyncpg.Connection, application_name: str) -> list[asyncpg.Record]:
    """Server sessions opened under ``application_name`` (pid, state, query)."""
    return await admin.fetch(
        "SELECT pid, state, query FROM pg_stat_activity WHERE application_name = $1", application_name
    )


async def until(condition: Callable[[], bool], *, timeout: float = 20.0, step: float = 0.02) -> None:
    """Wait for ``condition()`` to hold (fails the test after ``timeout`` seconds)."""
    for _ in range(int(timeout / step)):
        if condition():
            return
        await asyncio.sleep(step)
    raise AssertionError(f"condition not reached within {timeout}s")
