"""An importable predicate, for the one case acceptors cannot express (a comparison)."""

from __future__ import annotations

from typing import Any


def enough_rows(row: dict[str, Any]) -> bool:
    return int((row.get("meta") or {}).get("rows", 0)) >= 5


def explode(row: dict[str, Any]) -> bool:
    """A predicate with a bug: raises on every row."""
    raise RuntimeError(f"cannot judge row {row.get('id')}")
