"""The Waits plugin Airflow loads from the ``airflow.plugins`` entry point.

Every Airflow component that loads plugins imports this module, so it imports nothing but
Airflow's plugin base: the page's FastAPI app is built the first time Airflow iterates
``fastapi_apps``, which only the api-server does (``api_fastapi/app.py``, ``init_plugins``).
A scheduler, worker or triggerer never builds it, never imports FastAPI for it and never reads
a row for it. ``external_views`` adds the **Waits** entry to the UI's navigation; with
``url_route`` the UI renders the page in its iframe, same origin, so the page's requests carry
the UI's session cookie.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any, overload

from airflow.plugins_manager import AirflowPlugin

from airflow_deferrable_kit.plugins._paths import URL_PREFIX, URL_ROUTE, base_path

PLUGIN_NAME = "deferrable_kit_waits"


class _AppsOnDemand(Sequence[dict[str, Any]]):
    """``fastapi_apps`` that builds the app on first use: only the api-server iterates it."""

    def __init__(self) -> None:
        self._apps: list[dict[str, Any]] | None = None

    def _built(self) -> list[dict[str, Any]]:
        if self._apps is None:
            from airflow_deferrable_kit.plugins._app import create_app

            self._apps = [{"app": create_app(), "url_prefix": URL_PREFIX, "name": "Deferrable Kit: waits"}]
        return self._apps

    @property
    def built(self) -> bool:
        """Whether the app has been built in this process (a test's way to prove it was not)."""
        return self._apps is not None

    @overload
    def __getitem__(self, index: int) -> dict[str, Any]: ...
    @overload
    def __getitem__(self, index: slice) -> Sequence[dict[str, Any]]: ...
    def __getitem__(self, index: int | slice) -> dict[str, Any] | Sequence[dict[str, Any]]:
        return self._built()[index]

    def __len__(self) -> int:
        return len(self._built())

    def __iter__(self) -> Iterator[dict[str, Any]]:
        return iter(self._built())


class WaitsPlugin(AirflowPlugin):
    """The **Waits** page: what is deferred now, where, for how long, and what waiting costs."""

    name = PLUGIN_NAME
    fastapi_apps = _AppsOnDemand()  # type: ignore[assignment]
    external_views = [
        {
            "name": "Waits",
            "href": f"{base_path()}{URL_PREFIX}/waits",
            "url_route": URL_ROUTE,
            "destination": "nav",
            "category": "browse",
        }
    ]
