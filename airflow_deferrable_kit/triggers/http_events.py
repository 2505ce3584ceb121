"""Start a DAG run each time an HTTP endpoint says ready: ``HttpBatchReadyEventTrigger``.

It is :class:`~airflow_deferrable_kit.triggers.http.HttpBatchReadyTrigger` (the same request,
connection, shared session, acceptors, predicate and error rules) that never stops, firing on
*edges*: one event when the answer goes from "not ready" to "ready", none while it stays ready
(see :class:`~airflow_deferrable_kit.triggers.events.EdgeEventTrigger`). The last state seen is
the watermark, in the asset state store.

Watchers of the same request (connection, method, endpoint, query, body) share one request per
poll in the triggerer, whatever their conditions; each judges the answer on its own. An answer
that cannot be judged (an error status, a body a path condition cannot read) leaves each
watcher's state as it was; an error status the watchers do not take as "not yet" (408, 429, 5xx)
makes the shared poll back off, honouring ``Retry-After``.
"""

from __future__ import annotations

import dataclasses
from typing import Any, ClassVar, Final

from airflow_deferrable_kit._http.client import Response, is_transient_status
from airflow_deferrable_kit.conditions import ConditionSet
from airflow_deferrable_kit.payload import Found
from airflow_deferrable_kit.triggers.base import register_event_form
from airflow_deferrable_kit.triggers.events import EdgeEventTrigger
from airflow_deferrable_kit.triggers.http import MATCHERS, HttpBatchReadyTrigger, refine_status

#: What the shared request depends on; the rest (conditions, excerpts) each watcher judges with.
REQUEST_PARAMETERS: Final = (
    "http_conn_id",
    "method",
    "endpoint",
    "query",
    "json_body",
    "request_timeout",
    "max_body_bytes",
    "not_yet_codes",
)


class HttpBatchReadyEventTrigger(EdgeEventTrigger, HttpBatchReadyTrigger):
    """Fire one asset event each time the endpoint's answer becomes ready.

    Takes the parameters of ``HttpBatchReadyTrigger`` (``http_conn_id``, ``endpoint``,
    ``method``, ``query``, ``json_body``, ``acceptors``, ``predicate``, ``not_yet_codes``,
    ``select``, ...), the sensor's shorthand ``success=`` / ``failure=`` / ``retry=``, and
    ``backfill``: fire if the answer is already ready at the first poll (default: that is the
    starting point).

    Each event's payload is the wait's success payload (``status_code``, ``url``, ``decision``,
    ``fields``, ``body_excerpt``) plus ``became_ready_at`` and ``event_id``.
    """

    poll_interval: float = 60.0
    success: list[dict[str, Any]] = dataclasses.field(default_factory=list)
    failure: list[dict[str, Any]] = dataclasses.field(default_factory=list)
    retry: list[dict[str, Any]] = dataclasses.field(default_factory=list)

    tuning_parameters: ClassVar[tuple[str, ...]] = ("request_timeout", "max_body_bytes", "excerpt_chars")

    def canonical_conditions(self) -> list[dict[str, Any]]:
        """``acceptors`` and the ``success=`` / ``failure=`` / ``retry=`` shorthand, as the sensor takes them."""
        return ConditionSet.canonicalise(
            matchers=MATCHERS,
            acceptors=self.acceptors,
            success=self.success,
            failure=self.failure,
            retry=self.retry,
            refine=refine_status,
        )

    def stream_identity(self) -> Any:
        return {name: getattr(self, name) for name in REQUEST_PARAMETERS}

    async def observe(self) -> tuple[Response, str, str]:
        """One request for every watcher of it; an error status backs the shared poll off."""
        response, safe_url, method = await self.fetch()
        if is_transient_status(response.status) and response.status not in self.not_yet_codes:
            context = {"status_code": response.status, "method": method, "url": safe_url}
            raise self._status_error(response, context)
        return response, safe_url, method

    async def judge(self, observed: Any) -> Found | None:
        response, safe_url, method = observed
        return await self.evaluate(response, safe_url=safe_url, method=method)


def _event_form(wait: HttpBatchReadyTrigger, **options: Any) -> HttpBatchReadyEventTrigger:
    """``HttpBatchReadyTrigger(...).as_event_trigger()``: one event each time the endpoint says ready."""
    return HttpBatchReadyEventTrigger(**{**wait.serialize()[1], **options})


register_event_form(HttpBatchReadyTrigger, _event_form)

__all__ = ["REQUEST_PARAMETERS", "HttpBatchReadyEventTrigger"]
