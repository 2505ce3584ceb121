"""An importable predicate, for the one case acceptors cannot express (a comparison)."""

from __future__ import annotations

from typing import Any


def enough_rows(row: dict[str, Any]) -> bool:
    return int((row.get("meta") or {}).get("rows", 0)) >= 5


def explode(row: dict[str, Any]) -> bool:
    """A predicate with a bug: raises on every row."""
    raise RuntimeError(f"cannot judge row {row.get('id')}")


#: Whether :func:`broken_from_five` still has its bug (a test flips it to deploy the fix).
BROKEN = {"on": True}


def broken_from_five(row: dict[str, Any]) -> bool:
    """A predicate that cannot judge rows from id 5 on until its bug is fixed; then accepts all."""
    if BROKEN["on"] and int(row["id"]) >= 5:
        raise RuntimeError(f"cannot judge row {row['id']} yet")
    return True
