"""The Waits page's FastAPI app, mounted by the api-server under ``/deferrable-kit``.

Every route needs Airflow's ``TRIGGERS`` view (``requires_access_view``), so a user without it
gets Airflow's own 403, and shows only DAGs the auth manager lets the user read. Every route is
a GET that reads: nothing here can change state. Authentication is Airflow's: a bearer token, or
the UI's session cookie, which the page in the UI's iframe carries (same origin).

No ``from __future__ import annotations`` here: FastAPI reads each route's parameters from its
annotations, and the ``Annotated`` dependencies below are local to :func:`create_app` (Airflow's
security module is imported only when the app is built), which a string annotation could not
resolve: FastAPI would take them for query parameters.
"""

import datetime as dt
import math
from collections.abc import Collection, Iterator
from typing import Annotated, Any

import sqlalchemy as sa
from fastapi import Depends, FastAPI, HTTPException, Query, Request
from fastapi.responses import HTMLResponse, RedirectResponse

from airflow_deferrable_kit.audit import AuditError, run_audit
from airflow_deferrable_kit.plugins import _page, _read
from airflow_deferrable_kit.plugins._describe import KIND_CHOICES
from airflow_deferrable_kit.plugins._paths import URL_PREFIX, base_path

UTC = dt.timezone.utc
#: The page sizes offered; 100 rows render fast and read well.
MAX_PER_PAGE = 500
#: The longest period the cost section audits in one request (the audit reads every try in it).
MAX_COST_DAYS = 90.0


def _now() -> dt.datetime:
    return dt.datetime.now(UTC)


def _connection() -> Iterator[sa.Connection]:
    """A connection of Airflow's own metadata session, rolled back after the request: read-only."""
    from airflow.utils.session import create_session

    with create_session() as session:
        try:
            yield session.connection()
        finally:
            session.rollback()


def _user(request: Request) -> Any:
    """The user Airflow's security dependencies resolved for this request."""
    return request.state.waits_user


def readable(user: Any, dag_ids: Collection[str]) -> set[str]:
    """The DAGs among ``dag_ids`` that ``user`` may read, as the auth manager decides."""
    if not dag_ids:
        return set()
    from airflow.api_fastapi.app import get_auth_manager
    from airflow.configuration import conf

    manager = get_auth_manager()
    if conf.getboolean("core", "multi_team", fallback=False):
        # Team membership comes from each DAG's bundle: let the auth manager read it.
        return set(dag_ids) & manager.get_authorized_dag_ids(user=user, method="GET")
    return manager.filter_authorized_dag_ids(dag_ids=set(dag_ids), user=user, method="GET")


def _triggerer_settings() -> tuple[int, float]:
    from airflow.configuration import conf

    capacity = conf.getint("triggerer", "capacity", fallback=1000)
    threshold = conf.getfloat("triggerer", "triggerer_health_check_threshold", fallback=30.0)
    return capacity, threshold


def create_app() -> FastAPI:
    """The app: ``/waits`` (deferred now, triggerers, watchers) and ``/waits/cost``."""
    from airflow.api_fastapi.auth.managers.models.resource_details import AccessView
    from airflow.api_fastapi.core_api.security import GetUserDep, requires_access_view

    def remember_user(request: Request, user: GetUserDep) -> None:
        request.state.waits_user = user

    guard = [Depends(requires_access_view(access_view=AccessView.TRIGGERS)), Depends(remember_user)]
    app = FastAPI(
        title="Deferrable Kit: waits",
        description="What is deferred now, where, for how long, and what waiting costs (read-only).",
        dependencies=guard,
        docs_url=None,
        redoc_url=None,
        openapi_url=None,
    )
    links = _page.Links(base_path(), URL_PREFIX)
    Connection = Annotated[sa.Connection, Depends(_connection)]

    @app.get("/", include_in_schema=False)
    def root() -> RedirectResponse:
        return RedirectResponse(links.page)

    @app.get("/waits", response_class=HTMLResponse)
    def waits(
        request: Request,
        connection: Connection,
        dag: str | None = None,
        kind: str | None = None,
        triggerer: str | None = None,
        min_age: Annotated[float | None, Query(ge=0)] = None,
        sort: str = "since",
        order: str = "asc",
        page: Annotated[int, Query(ge=1)] = 1,
        per_page: Annotated[int, Query(ge=1, le=MAX_PER_PAGE)] = 100,
    ) -> HTMLResponse:
        if sort not in _read.SORTS:
            raise HTTPException(400, f"sort must be one of {', '.join(_read.SORTS)}")
        if order not in ("asc", "desc"):
            raise HTTPException(400, "order must be asc or desc")
        if kind and kind not in KIND_CHOICES:
            raise HTTPException(400, f"kind must be one of {', '.join(KIND_CHOICES)}")
        if min_age is not None and not math.isfinite(min_age):
            raise HTTPException(400, "min_age must be a number of minutes")
        user = _user(request)
        now = _now()
        filters = _read.Filters(
            dag=dag or None,
            kind=kind or None,
            triggerer=triggerer or None,
            min_age_minutes=min_age or None,
            sort=sort,
            descending=order == "desc",
            page=page,
            per_page=per_page,
        )
        visible = readable(user, _read.deferred_dag_ids(connection))
        deferred = _read.deferred(connection, visible, filters, now)
        capacity, threshold = _triggerer_settings()
        triggerers, unassigned = _read.triggerers(connection, now, capacity=capacity, threshold=threshold)
        watchers = _read.watchers(connection, readable(user, _read.watched_dag_ids(connection)), now)
        html = _page.waits_page(
            links=links, page=deferred, triggerers=triggerers, unassigned=unassigned, watchers=watchers, now=now
        )
        return HTMLResponse(html)

    @app.get("/waits/cost", response_class=HTMLResponse)
    def cost(
        request: Request,
        connection: Connection,
        days: Annotated[float, Query(gt=0, le=MAX_COST_DAYS)] = 7.0,
    ) -> HTMLResponse:
        dag_ids = connection.scalars(sa.select(_read.TI.c.dag_id).distinct()).all()
        visible = readable(_user(request), dag_ids)
        report, error = None, None
        if visible:
            try:
                report = run_audit(days=days, dag_ids=sorted(visible), now=_now())
            except AuditError as exc:
                error = f"The audit could not read the metadata DB: {exc}"
        return HTMLResponse(_page.cost_page(links=links, report=report, days=days, error=error))

    return app
