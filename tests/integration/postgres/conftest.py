"""Fixtures for the Postgres wait: connections as AIRFLOW_CONN_* variables, a superuser session,
a fresh marker table per test, and a spy on error classification."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import asyncpg
import pytest

from airflow_deferrable_kit.errors import WaitError
from airflow_deferrable_kit.triggers.postgres import PostgresBatchMarkerTrigger
from scripts import services

from .helpers import ConnSetter, define_connection, unique


@pytest.fixture
def connect(monkeypatch: pytest.MonkeyPatch, postgres_server: services.Postgres) -> ConnSetter:
    """``connect(login=..., extra=...)`` defines a fresh connection id to the shared server."""

    def make(**kwargs: Any) -> str:
        return define_connection(monkeypatch, postgres_server, **kwargs)

    return make


@pytest.fixture
def conn_id(connect: ConnSetter) -> str:
    return connect()


@pytest.fixture
async def admin(postgres_server: services.Postgres) -> AsyncIterator[asyncpg.Connection]:
    """A superuser session on the shared server for setting up and inspecting state."""
    conn = await asyncpg.connect(postgres_server.dsn)
    try:
        yield conn
    finally:
        await conn.close()


@pytest.fixture
async def markers(admin: asyncpg.Connection) -> AsyncIterator[str]:
    """A fresh batch-marker table: one row per batch attempt."""
    name = unique("markers")
    await admin.execute(
        f"""CREATE TABLE {name} (
            id serial PRIMARY KEY,
            batch_id text NOT NULL,
            batch_date date,
            status text,
            meta jsonb,
            created_at timestamptz NOT NULL DEFAULT now()
        )"""
    )
    try:
        yield name
    finally:
        await admin.execute(f"DROP TABLE IF EXISTS {name}")


@pytest.fixture
def classified(monkeypatch: pytest.MonkeyPatch) -> list[WaitError]:
    """Every error the trigger classified, in order (proves retries happened, or did not)."""
    seen: list[WaitError] = []
    original = PostgresBatchMarkerTrigger.classify_error

    def spy(self: PostgresBatchMarkerTrigger, exc: Exception) -> WaitError:
        error = original(self, exc)
        seen.append(error)
        return error

    monkeypatch.setattr(PostgresBatchMarkerTrigger, "classify_error", spy)
    return seen
