"""A wait of the user's own for the burst test: ready while a flag file exists.

Its ``as_event_trigger()`` form is the generic edge watcher (``ConditionEventTrigger``); the test
puts this module on every Airflow component's path, as in-house code shipped with the DAGs.
"""

from __future__ import annotations

import os

from airflow_deferrable_kit.payload import Found
from airflow_deferrable_kit.triggers.base import PollingTrigger


class FlagFileTrigger(PollingTrigger):
    """Ready while the file at ``path`` exists."""

    path: str

    def validate(self) -> None:
        if not self.path:
            raise ValueError("path must be a file path")

    async def check(self) -> Found | None:
        return Found({"path": self.path}) if os.path.exists(self.path) else None  # noqa: ASYNC240 - a stat
