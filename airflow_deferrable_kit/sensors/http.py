"""Wait until an HTTP endpoint says a batch is ready, deferrable, with readiness declared as data."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, ClassVar

from airflow_deferrable_kit.conditions import Acceptor, ConditionSet
from airflow_deferrable_kit.sensors.base import (
    DeferrableSensor,
    OfficialRefusal,
    is_unresolved,
    unless_default,
    unless_empty,
)
from airflow_deferrable_kit.triggers.http import (
    DEFAULT_EXCERPT_CHARS,
    DEFAULT_MAX_BODY_BYTES,
    DEFAULT_REQUEST_TIMEOUT,
    MATCHERS,
    HttpBatchReadyTrigger,
    refine_status,
)


def _refine_unless_templated(acceptor: Acceptor, where: str) -> Acceptor:
    """HTTP's status rule now; a status still templated is checked by the trigger once rendered."""
    return acceptor if is_unresolved(acceptor.expected) else refine_status(acceptor, where)


_KEEP_ALIVE = (
    "the TCP keep-alive options of requests have no equivalent: the triggerer's shared aiohttp pool keeps "
    "idle connections open between polls and closes them after 30 s; remove the argument"
)


class HttpBatchReadySensor(DeferrableSensor):
    """Succeed when ``endpoint`` on ``http_conn_id`` answers that the batch is ready.

    Readiness is declared as data, so the wait defers even with a custom condition:

    :param success: conditions meaning "ready", e.g. ``[{"path": "state", "equals": "ready"}]``
        or ``[{"status": 200}]``.
    :param failure: conditions meaning "will never be ready": the task fails at once with the
        body excerpt, e.g. ``[{"path": "state", "in": ["failed", "cancelled"]}]``.
    :param retry: conditions meaning "not yet", tried before ``success``.
    :param acceptors: the same rules in canonical form
        (``{"state", "matcher", "argument", "comparator", "expected"}``), tried first.
    :param predicate: ``"pkg.module:function"`` for what data cannot express (sync or async).

    With no success condition and no predicate, any 2xx response no condition decided is ready.
    Other parameters (``endpoint``, ``method``, ``query``, ``json_body``, ``not_yet_codes``,
    ``select``, ``request_timeout``, ``max_body_bytes``, ``excerpt_chars``) are those of
    :class:`~airflow_deferrable_kit.triggers.http.HttpBatchReadyTrigger`. Templated:
    ``http_conn_id``, ``endpoint``, ``method``, ``query``, ``json_body`` and the conditions.
    """

    trigger_class = HttpBatchReadyTrigger
    official_sensor = "HttpSensor"
    official_aliases = {"request_params": "query", "response_error_codes_allowlist": "not_yet_codes"}
    official_refusals: ClassVar[Mapping[str, OfficialRefusal]] = {
        "headers": unless_empty(
            "put headers in the connection extras (each extra key other than the options is sent as a header, "
            "or an extra 'headers' object): as an argument they would be stored in plain text in the trigger table"
        ),
        "response_check": (
            "a callable cannot cross to the triggerer; declare readiness as data with success=[...], "
            "failure=[...] or retry=[...], or name a function with predicate='pkg.module:function' "
            "(it receives a dict with status_code, headers, text and json)"
        ),
        "extra_options": unless_empty(
            "set TLS and proxy in the connection extras ('verify', 'proxy' or 'proxies') and the request "
            "timeout with request_timeout=; other requests options have no equivalent"
        ),
        "request_kwargs": unless_empty(
            "pass a JSON body as json_body= and query parameters as query=; TLS, proxy and headers go in the "
            "connection extras ('verify', 'proxy', header keys)"
        ),
        "tcp_keep_alive": unless_default(_KEEP_ALIVE, True),
        "tcp_keep_alive_idle": unless_default(_KEEP_ALIVE, 120),
        "tcp_keep_alive_count": unless_default(_KEEP_ALIVE, 20),
        "tcp_keep_alive_interval": unless_default(_KEEP_ALIVE, 30),
    }
    template_fields: Sequence[str] = ("http_conn_id", "endpoint", "method", "query", "json_body", "acceptors")
    template_fields_renderers = {"query": "json", "json_body": "json", "acceptors": "json"}

    def __init__(
        self,
        *,
        endpoint: str = "",
        http_conn_id: str = "http_default",
        method: str = "GET",
        query: Mapping[str, Any] | None = None,
        json_body: Any = None,
        success: Sequence[Mapping[str, Any]] | None = None,
        failure: Sequence[Mapping[str, Any]] | None = None,
        retry: Sequence[Mapping[str, Any]] | None = None,
        acceptors: Sequence[Mapping[str, Any]] | None = None,
        predicate: str | None = None,
        not_yet_codes: Sequence[int | str] | None = None,
        select: Sequence[str] | None = None,
        request_timeout: float = DEFAULT_REQUEST_TIMEOUT,
        max_body_bytes: int = DEFAULT_MAX_BODY_BYTES,
        excerpt_chars: int = DEFAULT_EXCERPT_CHARS,
        **kwargs: Any,
    ) -> None:
        # One canonical list on the trigger, whatever mix of sugar and canonical form was given,
        # checked by HTTP's rules under the names the user wrote.
        canonical = ConditionSet.canonicalise(
            matchers=MATCHERS,
            acceptors=acceptors,
            success=success,
            failure=failure,
            retry=retry,
            refine=_refine_unless_templated,
        )
        optional: dict[str, Any] = {}
        if not_yet_codes is not None:
            optional["not_yet_codes"] = list(not_yet_codes)
        if select is not None:
            optional["select"] = list(select)
        super().__init__(
            endpoint=endpoint,
            http_conn_id=http_conn_id,
            method=method,
            query=dict(query) if isinstance(query, Mapping) else query,
            json_body=json_body,
            acceptors=canonical,
            predicate=predicate,
            request_timeout=request_timeout,
            max_body_bytes=max_body_bytes,
            excerpt_chars=excerpt_chars,
            **optional,
            **kwargs,
        )
