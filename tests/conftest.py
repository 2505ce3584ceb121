"""What every tier shares: an isolated AIRFLOW_HOME, and the real services, started once per
test process (with pytest-xdist, once per worker) and only when a test asks for one.

A service that cannot start fails the tests that need it with the reason; nothing is skipped.
The unit and release tiers refuse these fixtures (their own ``conftest.py``).
"""

from __future__ import annotations

import atexit
import functools
import os
import shutil
import tempfile

# Airflow reads its configuration on import: isolate it before anything imports airflow. The
# home is this process's own and goes with it.
if "AIRFLOW_HOME" not in os.environ:
    os.environ["AIRFLOW_HOME"] = tempfile.mkdtemp(prefix="adk-airflow-home-")
    atexit.register(functools.partial(shutil.rmtree, os.environ["AIRFLOW_HOME"], ignore_errors=True))
os.environ.setdefault("AIRFLOW__CORE__LOAD_EXAMPLES", "False")

from collections.abc import Iterator

import pytest

from scripts import services

#: The fixtures that start a real service: integration/ and e2e/ only.
SERVICE_FIXTURES = ("postgres_server", "s3_server", "kafka_broker")


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


@pytest.fixture(autouse=True)
def _connection_misses_are_final(monkeypatch: pytest.MonkeyPatch) -> None:
    """A missing connection is believed at once in tests (the grace window has tests of its own)."""
    from airflow_deferrable_kit import connections

    monkeypatch.setattr(connections, "NOT_FOUND_GRACE", 0.0)
    monkeypatch.setattr(connections, "_first_miss", {})
