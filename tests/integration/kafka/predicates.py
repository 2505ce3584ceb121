"""Importable predicates for the Kafka wait's tests (a predicate crosses to the triggerer by name)."""

from __future__ import annotations

import asyncio
import json
import time
from typing import Any


def total_over_100(message: dict[str, Any]) -> bool:
    """Sync: the sum of the value's ``items`` exceeds 100."""
    return sum(message["value"].get("items", [])) > 100


async def async_status(message: dict[str, Any]) -> str:
    """Async: map the ``state`` field to success / failure / retry."""
    await asyncio.sleep(0)
    state = message["value"].get("state")
    return {"done": "success", "broken": "failure"}.get(state, "retry")


def explodes_on_odd(message: dict[str, Any]) -> bool:
    """Raises on odd ``n`` (which ends the wait with a predicate_error); true on ``n == 10``."""
    n = message["value"]["n"]
    if n % 2:
        raise RuntimeError(f"odd {n}")
    return n == 10


def slow_is_last(message: dict[str, Any]) -> bool:
    """A slow sync predicate (runs in a worker thread): true on ``last``."""
    time.sleep(0.002)
    return bool(message["value"].get("last"))


NOT_CALLABLE = 42


def official_style_at_least(threshold: int, message: Any, *, field: str) -> Any:
    """An official ``apply_function``: bound args before the message, kwargs after, confluent methods.

    Returns what it saw (truthy) once ``field`` of the JSON value reaches ``threshold``.
    """
    assert message.error() is None and len(message) == len(message.value())
    assert isinstance(message.key(), bytes) and message.timestamp()[0] == 1
    value = json.loads(message.value())
    if value[field] >= threshold:
        return {"topic": message.topic(), "partition": message.partition(), "offset": message.offset(), **value}
    return None


def official_order(message: Any) -> dict[str, Any] | None:
    """An official-style ``apply_function`` (confluent ``Message``): the order it finds, as data,
    or ``None`` (no event) for anything else. The official trigger fires the answer itself."""
    value = json.loads(message.value())
    return {"order": value["n"], "topic": message.topic()} if value.get("kind") == "order" else None
