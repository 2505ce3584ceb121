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

With ``fire_on_change`` a watcher fires on *values* instead of edges: one event each time the
JSON value at that path of a ready answer differs from the last one seen (a release id, a batch
id), which a ready -> ready answer never is for an edge. The last value is the watermark.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
from typing import Any, ClassVar, Final

from airflow_deferrable_kit._arguments import take_official_name
from airflow_deferrable_kit._http.client import is_transient_status
from airflow_deferrable_kit._http.responses import NOT_JSON, TOO_LARGE, Response
from airflow_deferrable_kit._redact import redact
from airflow_deferrable_kit.conditions import MISSING, ConditionSet, lookup, parse_path
from airflow_deferrable_kit.errors import ConditionFailed, ErrorType, FatalError, WaitError
from airflow_deferrable_kit.payload import Found, cap_value
from airflow_deferrable_kit.triggers.base import register_event_form
from airflow_deferrable_kit.triggers.events import EdgeEventTrigger, event_payload, utc_now
from airflow_deferrable_kit.triggers.http import (
    DEFAULT_NOT_YET_CODES,
    MATCHERS,
    MAX_VALUE_CHARS,
    PREDICATE_RECEIVES,
    HttpBatchReadyTrigger,
    refine_status,
)

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
#: A changed value longer than this, as canonical JSON, is kept in the watermark by its SHA-256
#: (the state store's values should stay small); shorter ones are kept as they are, readable.
MAX_FINGERPRINT_CHARS: Final = 200
#: Parameters added after watchers were deployed: left out of the kwargs at their default, so a
#: watcher deployed before keeps its hash (Airflow's identity of it) and its watermark key.
OMITTED_AT_DEFAULT: Final = ("fire_on_change", "predicate_receives")
#: The official ``HttpSensor``'s names the sensor takes too -> the kit's: never in the kwargs.
OFFICIAL_NAMES: Final = {"request_params": "query", "response_error_codes_allowlist": "not_yet_codes"}


class HttpBatchReadyEventTrigger(EdgeEventTrigger, HttpBatchReadyTrigger):
    """Fire one asset event each time the endpoint's answer becomes ready.

    Takes the parameters of ``HttpBatchReadyTrigger`` (``http_conn_id``, ``endpoint``,
    ``method``, ``query``, ``json_body``, ``acceptors``, ``predicate``, ``not_yet_codes``,
    ``select``, ...), the sensor's shorthand ``success=`` / ``failure=`` / ``retry=``, and
    ``backfill``: fire if the answer is already ready at the first poll (default: that is the
    starting point).

    :param fire_on_change: a JSON path of the body (``"id"``, ``"batch.id"``): fire once for each
        new value at it in a ready answer (a new release id, a new batch id), instead of once per
        change from not ready to ready. A value is new when it differs from the last one seen;
        answers that are not ready, or that lack the path, change nothing.

    Each event's payload is the wait's success payload (``status_code``, ``url``, ``decision``,
    ``fields``, ``body_excerpt``) plus ``became_ready_at`` and ``event_id``; with
    ``fire_on_change``, ``changed`` (the path and its new value) and ``changed_at`` instead of
    ``became_ready_at``.

    The official names the sensor takes are taken too: ``request_params`` for ``query``,
    ``response_error_codes_allowlist`` for ``not_yet_codes``; they are stored under the kit's.

    :param predicate_receives: ``"dict"`` (the default: ``{"status_code", "headers", "text",
        "json"}``) or ``"response"``: a ``requests.Response`` (``status_code``, ``headers``,
        ``text``, ``json()``, ...), what the official ``HttpEventTrigger``'s ``response_check_path``
        callable receives, so such a callable runs unchanged.
    """

    poll_interval: float = 60.0
    success: list[dict[str, Any]] = dataclasses.field(default_factory=list)
    failure: list[dict[str, Any]] = dataclasses.field(default_factory=list)
    retry: list[dict[str, Any]] = dataclasses.field(default_factory=list)
    fire_on_change: str | None = None
    request_params: dict[str, Any] | None = None
    response_error_codes_allowlist: list[int | str] | None = None
    predicate_receives: str | None = None

    tuning_parameters: ClassVar[tuple[str, ...]] = ("request_timeout", "max_body_bytes", "excerpt_chars")

    @classmethod
    def parameter_names(cls) -> tuple[str, ...]:
        return tuple(name for name in super().parameter_names() if name not in OFFICIAL_NAMES)

    def validate(self) -> None:
        take_official_name(self, "request_params", "query", default=None)
        take_official_name(self, "response_error_codes_allowlist", "not_yet_codes", default=list(DEFAULT_NOT_YET_CODES))
        super().validate()
        if self.predicate_receives == "dict":
            self.predicate_receives = None  # the default, kept out of the kwargs
        if self.predicate_receives is not None and self.predicate_receives not in PREDICATE_RECEIVES:
            raise ValueError(
                f"predicate_receives must be one of {', '.join(PREDICATE_RECEIVES)}, got {self.predicate_receives!r}"
            )
        if self.predicate_receives is not None and self.predicate is None:
            raise ValueError("predicate_receives says what the predicate receives: give predicate too")
        self._change_path = None
        if self.fire_on_change is not None:
            self._change_path = parse_path(self.fire_on_change, argument="fire_on_change")

    def _kwargs(self) -> dict[str, Any]:
        kwargs = super()._kwargs()
        for name in OMITTED_AT_DEFAULT:
            if kwargs.get(name) is None:
                kwargs.pop(name, None)
        return kwargs

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
        # How much of a body is read is the shared request's: a watcher with a predicate reads
        # more (body_limit), so it never shares a response cut for watchers without one.
        return {name: getattr(self, name) for name in REQUEST_PARAMETERS} | {"max_body_bytes": self.body_limit()}

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

    async def derive(self, data: Any, state: Any) -> tuple[list[dict[str, Any]], Any]:
        if self._change_path is None:
            return await super().derive(data, state)
        return await self._derive_change(data, state)

    async def _derive_change(self, data: Any, state: Any) -> tuple[list[dict[str, Any]], Any]:
        """One event per new value at ``fire_on_change`` in a ready answer; the last value is the watermark.

        The watermark is ``{"value": fingerprint, "since": time}``. A look that is not ready, or
        cannot be judged, or lacks the path, leaves it as it was, so ``a, 503, a`` fires nothing
        and ``a, not ready, b`` fires once, for ``b``.
        """
        try:
            found = await self.judge(data)
            if found is None:
                return [], state
            value = await self._changed_value(data[0])
        except ConditionFailed:
            return [], state
        except WaitError as error:  # cannot tell: the watermark stays as it was
            if not getattr(self, "_unjudged", False):
                self.log.warning("%s: cannot tell the value (%s)", self.describe(), redact(error.message))
            self._unjudged = True
            return [], state
        if getattr(self, "_unjudged", False):
            self.log.info("%s: can tell again", self.describe())
        self._unjudged = False
        mark = fingerprint(value)
        previous = state if isinstance(state, dict) and "value" in state else None
        if previous is not None and previous["value"] == mark:
            return [], state
        now = utc_now()
        new_state = {"value": mark, "since": now}
        if previous is None and not self.backfill:
            return [], new_state  # the first look is the starting point
        changed = {"path": self.fire_on_change, "value": cap_value(value, MAX_VALUE_CHARS)}
        event_id = change_event_id(self.fire_on_change or "", mark, previous)
        return [event_payload({**found.data, "changed": changed, "changed_at": now, "event_id": event_id})], new_state

    async def _changed_value(self, response: Response) -> Any:
        document = await response.document()
        if document is NOT_JSON or document is TOO_LARGE:
            why = "not JSON" if document is NOT_JSON else self.too_large()
            raise FatalError(
                f"fire_on_change={self.fire_on_change!r}: the ready answer's body is {why}",
                error_type=ErrorType.PROTOCOL,
            )
        assert self._change_path is not None
        value = lookup(document, self._change_path)
        if value is MISSING:
            raise FatalError(
                f"fire_on_change={self.fire_on_change!r}: the ready answer has no value at that path",
                error_type=ErrorType.PROTOCOL,
            )
        return value


def fingerprint(value: Any) -> str:
    """A value as the watermark keeps it: its canonical JSON, or that JSON's SHA-256 when long."""
    text = json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    if len(text) <= MAX_FINGERPRINT_CHARS:
        return text
    return "sha256:" + hashlib.sha256(text.encode("utf-8")).hexdigest()


def change_event_id(path: str, mark: str, previous: Any) -> str:
    """The ``event_id`` of a new value: the value and the saved state it replaces, not the clock.

    A triggerer that dies after the event is stored but before the new value is saved fires it
    again from the same saved state: both copies get one ``event_id``. Naming the state left
    (when its value was first seen) keeps ``a -> b -> a`` two events with two ids.
    """
    since = previous.get("since") if isinstance(previous, dict) else None
    return f"{path}={mark}@after:{since}" if since else f"{path}={mark}@start"


def _event_form(wait: HttpBatchReadyTrigger, **options: Any) -> HttpBatchReadyEventTrigger:
    """``HttpBatchReadyTrigger(...).as_event_trigger()``: one event each time the endpoint says ready."""
    return HttpBatchReadyEventTrigger(**{**wait.serialize()[1], **options})


register_event_form(HttpBatchReadyTrigger, _event_form)

__all__ = ["REQUEST_PARAMETERS", "HttpBatchReadyEventTrigger", "change_event_id", "fingerprint"]
