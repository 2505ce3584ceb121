"""One real Airflow for the end-to-end tests, started once per session on 127.0.0.1."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from scripts.airflow_local import LocalAirflow, local_airflow

DAGS = Path(__file__).parent / "dags"


@pytest.fixture(scope="session")
def airflow() -> Iterator[LocalAirflow]:
    with local_airflow(DAGS) as instance:
        yield instance
