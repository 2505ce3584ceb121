"""The end-to-end tier: a real Airflow (api-server, scheduler, triggerer, dag-processor)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from scripts import services
from scripts.airflow_local import LocalAirflow
from tests.e2e.event_deployment import EventDeployment, event_deployment

if TYPE_CHECKING:
    from scripts.demo import Showcase

HERE = Path(__file__).parent


@pytest.fixture(scope="session")
def showcase(
    postgres_server: services.Postgres, s3_server: services.S3Server, kafka_broker: services.Kafka
) -> Iterator[Showcase]:
    """One real Airflow for most end-to-end tests: the showcase DAG plus the tests' own DAGs."""
    from scripts.demo import showcase as start_showcase

    extra = [HERE / "dags", HERE / "audit_dags"]
    with start_showcase(extra, postgres=postgres_server, s3=s3_server, kafka=kafka_broker) as show:
        yield show


@pytest.fixture(scope="session")
def airflow(showcase: Showcase) -> LocalAirflow:
    return showcase.airflow


#: A deployment starts inside a test's setup, and a run it watches can take minutes.
E2E_TIMEOUT = 900


@pytest.hookimpl(tryfirst=True)  # before -m reads the markers added here
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Every test here is an e2e test, with the tier's own timeout (the 120 s default is too
    short), marked with the deployment it runs on: ``event_deployment`` and ``ha_deployment``
    for the tests of those two, none for the showcase deployment's. scripts/test-tier.sh runs
    the three sets in three processes side by side, each process's tests one after another in
    file order, so each deployment starts once."""
    for item in items:
        if HERE not in Path(str(item.path)).parents:
            continue
        item.add_marker(pytest.mark.e2e)
        if item.get_closest_marker("timeout") is None:
            item.add_marker(pytest.mark.timeout(E2E_TIMEOUT))
        fixtures = getattr(item, "fixturenames", ())
        if "event_airflow" in fixtures:
            item.add_marker(pytest.mark.event_deployment)
        if "ha_deployment" in fixtures:
            item.add_marker(pytest.mark.ha_deployment)


@pytest.fixture(scope="session")
def event_airflow(
    postgres_server: services.Postgres, s3_server: services.S3Server, kafka_broker: services.Kafka
) -> Iterator[EventDeployment]:
    """The Airflow of the event-driven tests and the bursts (tests/e2e/event_deployment.py)."""
    with event_deployment(postgres_server, s3_server, kafka_broker) as deployment:
        yield deployment


@pytest.fixture(scope="session")
def ha_deployment(
    postgres_server: services.Postgres, s3_server: services.S3Server, kafka_broker: services.Kafka
) -> Iterator[EventDeployment]:
    """A second deployment of the same shape, for the tests that kill triggerers or run them on
    an uneven host: HA, failover, survival. Its DAG processor also has a wait module no
    triggerer has (``survival_hosts/processor_only``), as in-house code shipped to the DAG
    processor alone would be."""
    with event_deployment(
        postgres_server, s3_server, kafka_broker, processor_path=HERE / "survival_hosts" / "processor_only"
    ) as deployment:
        yield deployment


#: Where each deployment's logs stood when a test's call began.
LOG_OFFSETS = pytest.StashKey[dict[int, dict[str, int]]]()


def deployments_of(item: pytest.Item) -> list[LocalAirflow]:
    """The Airflows a test used: its fixtures that are one, or hold one as ``.airflow``."""
    found: dict[int, LocalAirflow] = {}
    for value in getattr(item, "funcargs", {}).values():
        for candidate in (value, getattr(value, "airflow", None)):
            if isinstance(candidate, LocalAirflow):
                found[id(candidate)] = candidate
    return list(found.values())


@pytest.hookimpl(wrapper=True)
def pytest_runtest_call(item: pytest.Item) -> Iterator[None]:
    item.stash[LOG_OFFSETS] = {id(airflow): airflow.log_offsets() for airflow in deployments_of(item)}
    return (yield)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Iterator[None]:
    """A failed test's report carries what its Airflow logged meanwhile: a task that Airflow
    ended (a scheduler's state mismatch, a trigger that raised) is explained there, and the
    logs go with the deployment."""
    report = yield
    if call.when == "call" and report.failed:  # type: ignore[attr-defined]
        offsets = item.stash.get(LOG_OFFSETS, {})
        for airflow in deployments_of(item):
            problems = airflow.problems_since(offsets.get(id(airflow)))
            if problems:
                report.sections.append((f"Airflow at {airflow.base_url}: warnings and errors", problems))  # type: ignore[attr-defined]
    return report
