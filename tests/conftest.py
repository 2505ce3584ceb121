"""Shared fixtures: an isolated AIRFLOW_HOME and the real services, started once per session.

A service that cannot start fails the tests that need it with the reason; nothing is skipped.
"""

from __future__ import annotations

import os
import tempfile

# Airflow reads its configuration on import: isolate it before anything imports airflow.
os.environ.setdefault("AIRFLOW_HOME", tempfile.mkdtemp(prefix="adk-airflow-home-"))
os.environ.setdefault("AIRFLOW__CORE__LOAD_EXAMPLES", "False")

from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from scripts import services

if TYPE_CHECKING:
    from scripts.airflow_local import LocalAirflow
    from scripts.demo import Showcase

TESTS = Path(__file__).parent


@pytest.fixture(scope="session")
def postgres_server() -> Iterator[services.Postgres]:
    with services.postgres() as server:
        yield server


@pytest.fixture(scope="session")
def s3_server() -> Iterator[services.S3Server]:
    with services.s3_server() as server:
        yield server


@pytest.fixture(scope="session")
def kafka_broker() -> Iterator[services.Kafka]:
    with services.kafka() as broker:
        yield broker


@pytest.fixture(scope="session")
def showcase(
    postgres_server: services.Postgres, s3_server: services.S3Server, kafka_broker: services.Kafka
) -> Iterator[Showcase]:
    """One real Airflow for every end-to-end test: the showcase DAG plus the tests' own DAGs."""
    from scripts.demo import showcase as start_showcase

    extra = [TESTS / "e2e" / "dags", TESTS / "audit" / "dags"]
    with start_showcase(extra, postgres=postgres_server, s3=s3_server, kafka=kafka_broker) as show:
        yield show


@pytest.fixture(scope="session")
def airflow(showcase: Showcase) -> LocalAirflow:
    return showcase.airflow


@pytest.fixture(autouse=True)
def _connection_misses_are_final(monkeypatch: pytest.MonkeyPatch) -> None:
    """A missing connection is believed at once in tests (the grace window has tests of its own)."""
    from airflow_deferrable_kit import connections

    monkeypatch.setattr(connections, "NOT_FOUND_GRACE", 0.0)
    monkeypatch.setattr(connections, "_first_miss", {})


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Run the end-to-end tests last: their Airflow keeps the machine busy once started, which
    would disturb the event-loop blocking checks of the tests that measure it."""
    items.sort(key=lambda item: item.get_closest_marker("e2e") is not None)
