"""Small triggers and sensors built on the base classes, used to test the bases themselves.

They are real subclasses written the way a platform team would write its own wait; their
behaviour is scripted so each base-class rule can be exercised on its own.
"""

from __future__ import annotations

import asyncio
import dataclasses
import socket
from collections import deque
from typing import Any, ClassVar

from airflow_deferrable_kit.errors import FatalError, TransientError
from airflow_deferrable_kit.payload import Found
from airflow_deferrable_kit.sensors.base import DeferrableSensor
from airflow_deferrable_kit.triggers.base import PollingTrigger

# Scripts are keyed by name because trigger kwargs must stay JSON: a test registers a script of
# outcomes, the trigger pops one per check. "found", "none", "transient", "transient:<after>",
# "fatal", "boom" (an unexpected exception), "hang" (never returns), "bad-payload", "nxdomain"
# (the resolver says the host does not exist).
SCRIPTS: dict[str, deque[str]] = {}
CHECKS: dict[str, int] = {}


class ScriptedTrigger(PollingTrigger):
    """Plays back a scripted list of check outcomes; repeats the last one when it runs out."""

    script: str
    note: str = ""
    tags: list[str] = dataclasses.field(default_factory=list)

    def validate(self) -> None:
        if not self.script:
            raise ValueError("script must be a non-empty name")

    async def check(self) -> Found | None:
        CHECKS[self.script] = CHECKS.get(self.script, 0) + 1
        queue = SCRIPTS[self.script]
        step = queue.popleft() if len(queue) > 1 else queue[0]
        if step == "found":
            return Found({"script": self.script, "checks": CHECKS[self.script]})
        if step == "none":
            return None
        if step.startswith("transient"):
            _, _, after = step.partition(":")
            raise TransientError("server said 503", retry_after=float(after) if after else None)
        if step == "fatal":
            raise FatalError("access denied to the thing", error_type="authorization")
        if step == "boom":
            raise KeyError("surprise")
        if step == "nxdomain":  # the resolver says the name does not exist, wrapped as a client would
            try:
                raise socket.gaierror(socket.EAI_NONAME, "Name or service not known")
            except socket.gaierror as exc:
                raise ConnectionError("Cannot connect to host batch-api.invalid:443") from exc
        if step == "hang":
            await asyncio.Event().wait()
        if step == "bad-payload":
            return Found({"when": object()})
        if step == "reserved":
            return Found({"status": "mine"})
        raise AssertionError(f"unknown step {step}")


class LeasingTrigger(PollingTrigger):
    """Leases a shared client, then waits forever: for cancellation and cleanup tests."""

    key: str
    opened: ClassVar[list[str]] = []
    closed: ClassVar[list[str]] = []

    async def check(self) -> Found | None:
        await self.lease(("sample", self.key), self._open, self._close)
        return None

    async def _open(self) -> str:
        await asyncio.sleep(0.01)
        self.opened.append(self.key)
        return f"client-{self.key}"

    async def _close(self, client: str) -> None:
        self.closed.append(client)


class NeedsMissingExtraTrigger(PollingTrigger):
    extra = "imaginary"
    extra_modules = ("adk_module_that_is_not_installed",)

    async def check(self) -> Found | None:
        return None


class ScriptedSensor(DeferrableSensor):
    trigger_class = ScriptedTrigger
    template_fields = ("note",)


class NeedsMissingExtraSensor(DeferrableSensor):
    trigger_class = NeedsMissingExtraTrigger


def script(name: str, *steps: str) -> str:
    SCRIPTS[name] = deque(steps)
    CHECKS[name] = 0
    return name


def payload_of(event: Any) -> dict[str, Any]:
    return dict(event.payload)
