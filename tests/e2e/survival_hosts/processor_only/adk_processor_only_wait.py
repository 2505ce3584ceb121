"""A wait shipped to the DAG processor only (tests/e2e/test_triggerer_survives_e2e.py)."""

from __future__ import annotations

from airflow_deferrable_kit.payload import Found
from airflow_deferrable_kit.triggers.base import PollingTrigger


class AlwaysThere(PollingTrigger):
    """Always true: it would fire at once, if the triggerer could import it."""

    async def check(self) -> Found | None:
        return Found({"there": True})
