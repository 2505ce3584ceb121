"""Where an event trigger keeps its watermark: the asset state store of every asset it feeds.

The triggerer gives each event trigger ``asset_state_store`` before ``run()``: per-asset
key/value state in the metadata database, kept across triggerer restarts. Identical watchers on
several assets are *one* trigger (Airflow identifies a watcher by classpath and kwargs), so a
trigger may feed several assets; its watermark is then written to each of them and read back
from whichever copy was written last. Each value is wrapped in an envelope with a write
counter so "last" does not depend on clocks.

Airflow's accessor object gives no public way to list its per-asset accessors, and its
``aget``/``aset`` refuse to guess when there are several: :func:`accessors` is the one place that
reads its private mapping (fenced, with a fallback to the object itself).
"""

from __future__ import annotations

import datetime as dt
import hashlib
import json
import logging
from collections.abc import Mapping
from typing import Any, Final, Protocol

log = logging.getLogger(__name__)

#: The envelope's version; a value of another shape is ignored (the watcher starts afresh).
ENVELOPE_VERSION: Final = 1
#: Every key this package writes starts with this, so users can tell our keys from theirs.
KEY_PREFIX: Final = "airflow_deferrable_kit"


class Accessor(Protocol):
    async def aget(self, key: str, default: Any = None) -> Any: ...

    async def aset(self, key: str, value: Any) -> None: ...


def accessors(store: Any) -> list[Accessor]:
    """The per-asset accessors behind Airflow's ``AssetStateStoreAccessors`` (or ``[store]``).

    Private-API use, fenced: ``airflow.sdk.execution_time.context.AssetStateStoreAccessors``
    keeps one ``AssetStateStoreAccessor`` per asset in ``_by_name`` / ``_by_uri`` (3.3.2). An
    object without them (a future Airflow, or a test's store) is used as the one accessor.
    """
    if store is None:
        return []
    by_name = getattr(store, "_by_name", None)
    by_uri = getattr(store, "_by_uri", None)
    if isinstance(by_name, Mapping) and isinstance(by_uri, Mapping):
        return [*by_name.values(), *by_uri.values()]
    return [store]


def watermark_key(kind: str, identity: Mapping[str, Any]) -> str:
    """A stable state-store key for one watched stream: ``airflow_deferrable_kit/<kind>/<digest>``.

    ``identity`` holds what names the stream (bucket and pattern, table and condition, ...), not
    how often it is polled, so changing a poll interval keeps the watermark and changing what is
    watched starts a new one.
    """
    text = json.dumps(identity, sort_keys=True, separators=(",", ":"), default=str)
    digest = hashlib.sha256(text.encode()).hexdigest()[:16]
    return f"{KEY_PREFIX}/{kind}/{digest}"


class WatermarkStore:
    """One watcher's watermark in its assets' state stores, or in memory when it has none."""

    def __init__(self, store: Any, key: str) -> None:
        self.key = key
        self._accessors = accessors(store)
        self._written = 0  # the highest write counter seen or written
        self._memory: Any = None

    @property
    def durable(self) -> bool:
        """Whether the watermark survives a restart (``False``: no asset state store was given)."""
        return bool(self._accessors)

    async def load(self) -> Any:
        """The watermark last saved, or ``None`` if this watcher never saved one."""
        if not self._accessors:
            return self._memory
        best: Mapping[str, Any] | None = None
        for accessor in self._accessors:
            value = await accessor.aget(self.key, None)
            if not _is_envelope(value):
                if value is not None:
                    log.warning("Ignoring state-store value of unknown shape under %s", self.key)
                continue
            if best is None or value["n"] > best["n"]:
                best = value
        if best is None:
            return None
        self._written = int(best["n"])
        return best["state"]

    async def save(self, state: Any) -> None:
        """Write ``state`` to every asset's store (raises what the store raises)."""
        if not self._accessors:
            self._memory = state
            return
        envelope = {
            "v": ENVELOPE_VERSION,
            "n": self._written + 1,
            "at": dt.datetime.now(dt.timezone.utc).isoformat(),
            "state": state,
        }
        for accessor in self._accessors:
            await accessor.aset(self.key, envelope)
        self._written += 1


def _is_envelope(value: Any) -> bool:
    return (
        isinstance(value, Mapping)
        and value.get("v") == ENVELOPE_VERSION
        and isinstance(value.get("n"), int)
        and "state" in value
    )


class MemoryStateStore:
    """An asset state store in memory with Airflow's ``aget``/``aset``, for tests and examples."""

    def __init__(self) -> None:
        self.values: dict[str, Any] = {}
        self.writes = 0

    async def aget(self, key: str, default: Any = None) -> Any:
        return json.loads(json.dumps(self.values[key])) if key in self.values else default

    async def aset(self, key: str, value: Any) -> None:
        if value is None:
            raise ValueError("a state-store value must not be None")
        self.values[key] = json.loads(json.dumps(value))  # JSON only, as the metadata DB stores it
        self.writes += 1


__all__ = ["KEY_PREFIX", "MemoryStateStore", "WatermarkStore", "accessors", "watermark_key"]
