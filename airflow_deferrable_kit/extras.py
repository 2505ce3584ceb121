"""Fail at DAG parse, not in the triggerer, when a wait's optional client is not installed."""

from __future__ import annotations

import importlib.util


class MissingExtraError(ImportError):
    """The optional dependency a wait needs is not installed."""


def require_extra(extra: str, *modules: str, needed_by: str) -> None:
    """Raise :class:`MissingExtraError` naming the pip command if any of ``modules`` is missing."""
    missing = [name for name in modules if importlib.util.find_spec(name) is None]
    if missing:
        raise MissingExtraError(
            f"{needed_by} needs {', '.join(missing)}, which is not installed. "
            f'Run: pip install "airflow-deferrable-kit[{extra}]"'
        )
