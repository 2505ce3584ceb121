"""Fail at DAG parse when a wait's optional client is not installed.

In the triggerer the same check ends that wait alone, from its ``run()`` (see
``triggers/base.py``): a triggerer host installed with fewer extras than the workers keeps
running every other wait.
"""

from __future__ import annotations

import importlib.util


class MissingExtraError(ImportError):
    """The optional dependency a wait needs is not installed."""


def require_extra(extra: str, *modules: str, needed_by: str) -> None:
    """Raise :class:`MissingExtraError` naming the pip command if any of ``modules`` is missing."""
    missing = [name for name in modules if not _importable(name)]
    if missing:
        raise MissingExtraError(
            f"{needed_by} needs {', '.join(missing)}, which is not installed. "
            f'Run: pip install "airflow-deferrable-kit[{extra}]"'
        )


def _importable(name: str) -> bool:
    """Whether ``name`` can be found; a finder that refuses it (raises) counts as missing."""
    try:
        return importlib.util.find_spec(name) is not None
    except (ImportError, ValueError):
        return False
