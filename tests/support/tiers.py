"""The rule of the tiers that run nothing: a test there that asks for a service fails by name."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from tests.conftest import SERVICE_FIXTURES


def refusing(tier: str) -> dict[str, Callable[..., Any]]:
    """Fixtures named like the services that fail the test, saying which tier runs services."""

    def refuse(name: str) -> Callable[..., Any]:
        @pytest.fixture(name=name, scope="session")
        def fixture() -> Any:
            pytest.fail(
                f"{tier}/ runs nothing: a test that needs the {name} fixture (a real service) belongs in "
                "tests/integration/<lib>/, or in tests/e2e/ if it needs a real Airflow",
                pytrace=False,
            )

        return fixture

    return {f"_refuse_{name}": refuse(name) for name in SERVICE_FIXTURES}
