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

import pytest

from scripts import services


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
