"""The trigger side of the example client package: it asks ``_files.client`` by its three verbs."""

from __future__ import annotations

from airflow_deferrable_kit.errors import WaitError
from airflow_deferrable_kit.triggers.base import Found, PollingTrigger
from tests.unit.contract._files.client import (
    classify_files_error,
    close_reader,
    load_options,
    open_reader,
)


class FileArrivedTrigger(PollingTrigger):
    """Fire when ``name`` is in ``folder`` of the connection's directory."""

    files_conn_id: str
    folder: str
    name: str
    poll_interval: float = 0.05

    def describe(self) -> str:
        return f"{self.name} in {self.folder}"

    async def check(self) -> Found | None:
        options = await load_options(self.files_conn_id)
        reader = await self.lease(options.lease_key, lambda: open_reader(options), close_reader)
        if self.name in await reader.names(self.folder):
            return Found({"folder": self.folder, "name": self.name})
        return None

    def classify_error(self, exc: Exception) -> WaitError:
        return classify_files_error(exc) or super().classify_error(exc)
