"""A wait whose condition a test switches on and off, to test the event base on its own."""

from __future__ import annotations

from airflow_deferrable_kit.errors import ConditionFailed, FatalError, TransientError
from airflow_deferrable_kit.payload import Found
from airflow_deferrable_kit.triggers.base import PollingTrigger

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
