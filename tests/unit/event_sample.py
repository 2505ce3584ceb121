"""A wait whose condition a test switches on and off, and a list a test appends items to, to test
the event base on its own."""

from __future__ import annotations

from typing import Any, ClassVar

from airflow_deferrable_kit._event_streams import Board
from airflow_deferrable_kit.errors import ConditionFailed, FatalError, TransientError
from airflow_deferrable_kit.payload import Found
from airflow_deferrable_kit.triggers.base import PollingTrigger
from airflow_deferrable_kit.triggers.events import EventTrigger

#: switch name -> "on" | "off" | "failed" | "transient" | "fatal"; checks counted per name.
SWITCHES: dict[str, str] = {}
CHECKS: dict[str, int] = {}


class SwitchTrigger(PollingTrigger):
    """Ready while its switch is on; a failure condition, or an error, on demand."""

    switch: str
    label: str = ""

    def validate(self) -> None:
        if not self.switch:
            raise ValueError("switch must be a non-empty name")

    async def check(self) -> Found | None:
        CHECKS[self.switch] = CHECKS.get(self.switch, 0) + 1
        state = SWITCHES.get(self.switch, "off")
        if state == "on":
            return Found({"switch": self.switch})
        if state == "failed":
            raise ConditionFailed("the switch reports failure")
        if state == "transient":
            raise TransientError("the switch is restarting")
        if state == "fatal":
            raise FatalError("access denied to the switch", error_type="authorization")
        return None


#: source name -> the items there so far (strings); looks counted per source.
ITEMS: dict[str, list[str]] = {}
LOOKS: dict[str, int] = {}


class NumberedItemsEventTrigger(EventTrigger):
    """An item watcher of a list a test appends to: each new entry is an item, the watermark is
    how many were seen."""

    source: str
    fires_items: ClassVar[bool] = True

    def validate(self) -> None:
        if not self.source:
            raise ValueError("source must be a non-empty name")

    async def poll(self, board: Board) -> Any:
        LOOKS[self.source] = LOOKS.get(self.source, 0) + 1
        return list(ITEMS.get(self.source, []))

    async def derive(self, data: Any, state: Any) -> tuple[list[dict[str, Any]], Any]:
        seen = len(data) if state is None and not self.backfill else int(state or 0)
        return [{"item": item, "event_id": f"{self.source}#{n}"} for n, item in enumerate(data) if n >= seen], len(data)
