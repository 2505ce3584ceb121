"""Wait until an HTTP endpoint says a batch is ready, deferrable, with readiness declared as data.

The official ``response_check`` callable is taken too and still defers. When the triggerer can
import it (:func:`triggerer_path`) the trigger judges each answer with it, as its predicate;
otherwise the trigger finds a candidate (a response the conditions accept), the event carries that
response, and the callable judges it in the worker on resume, as a ``requests.Response`` (see
:meth:`HttpBatchReadySensor.accepts_in_worker`).
"""

from __future__ import annotations

import base64
import dataclasses
import inspect
import sys
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, ClassVar, Final

from airflow.sdk import Context, PokeReturnValue
from airflow.sdk.exceptions import AirflowSkipException

from airflow_deferrable_kit.conditions import Acceptor, ConditionSet, import_predicate
from airflow_deferrable_kit.payload import SUCCESS
from airflow_deferrable_kit.sensors.base import (
    DeferrableSensor,
    OfficialRefusal,
    is_unresolved,
    run_in_worker,
    unless_default,
    unless_empty,
)
from airflow_deferrable_kit.triggers.http import (
    DEFAULT_EXCERPT_CHARS,
    DEFAULT_MAX_BODY_BYTES,
    DEFAULT_REQUEST_TIMEOUT,
    MATCHERS,
    HttpBatchReadyTrigger,
    joined_headers,
    refine_status,
    requests_response,
)

if TYPE_CHECKING:
    import requests

__all__ = ["HttpBatchReadySensor", "requests_response"]

#: What the worker reads of a body it fetches again for ``response_check``: all of it, as the
#: official sensor does (``max_body_bytes`` bounds what the triggerer reads).
WHOLE_BODY: Final = sys.maxsize - 1


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
    :param response_check: the official sensor's callable, given a ``requests.Response``.
        Judged **in the triggerer**, like ``predicate`` (a "not yet" costs no worker start), when
        the triggerer can import it: a dotted path (``"my_pkg.checks:is_ready"``), or a function
        of an installed package taking the response alone. Otherwise (a lambda, a function defined
        in the DAG file, one that names context keys) it runs in the worker on each response the
        conditions accept: ``response_check(response)``, plus the context keys its signature names
        (or all of them with ``**context``), as the official sensor calls it; a falsy answer waits
        on (after one ``poke_interval``) within the same ``timeout``; a ``PokeReturnValue`` says
        done with ``is_done`` and its ``xcom_value`` becomes the XCom; an exception fails the
        task; not with ``end_from_trigger=True``.

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

    include_response: bool

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
        response_check: Callable[..., bool | PokeReturnValue] | str | None = None,
        **kwargs: Any,
    ) -> None:
        if response_check is not None and not callable(response_check) and not isinstance(response_check, str):
            raise TypeError(
                "response_check must be a callable taking the response (a requests.Response) or its dotted path, "
                f"got {response_check!r}"
            )
        in_triggerer = triggerer_path(response_check)
        if in_triggerer is not None:
            if predicate is not None:
                raise ValueError("give response_check or predicate, not both: both judge the response")
            predicate = in_triggerer
            kwargs["predicate_receives"] = "response"
        #: The callable checked in the worker (``None`` when the triggerer judges it).
        self.response_check: Callable[..., bool | PokeReturnValue] | None = (
            None if in_triggerer is not None or isinstance(response_check, str) else response_check
        )
        self._local_response: Any = None  # the response of a look in this worker (poke, first look)
        self._fresh_payload: dict[str, Any] | None = None  # a look again here, for a body left out
        self._check_xcom: tuple[Any] | None = None  # a PokeReturnValue's xcom_value
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

    # ------------------------------------------------------------ response_check, in the worker
    def checks_in_worker(self) -> str | None:
        return "response_check" if self.response_check is not None else None

    def trigger_params(self) -> dict[str, Any]:
        params = super().trigger_params()
        params["include_response"] = bool(params.get("include_response")) or self.response_check is not None
        return params

    def _worker_trigger(self, **overrides: Any) -> HttpBatchReadyTrigger:
        """The wait's trigger for a look from the worker, keeping the response for ``response_check``."""
        trigger = self.build_trigger(deadline=None)
        assert isinstance(trigger, HttpBatchReadyTrigger)
        if overrides:
            trigger = dataclasses.replace(trigger, **overrides)
        trigger.keep_last_response = self.response_check is not None
        return trigger

    def _poll_in_worker(self) -> dict[str, Any] | None:
        trigger = self._worker_trigger()
        payload = run_in_worker(trigger.poll_once())
        self._local_response = trigger.last_response if _is_success(payload) else None
        return payload

    def accepts_in_worker(self, payload: dict[str, Any], context: Context) -> bool:
        """The official ``response_check`` on the response the trigger accepted.

        It gets a ``requests.Response`` (``status_code``, ``reason``, ``url``, ``headers``,
        ``content``, ``text``, ``json()``, ``ok``, ``raise_for_status()``) built from the event, or,
        when the body could not travel in it whole (see
        :func:`~airflow_deferrable_kit.triggers.http.response_for_event`), from the same request
        sent again here, read to the end and held to the same conditions first (a "not yet" there
        waits on). Exceptions are the official sensor's: ``silent_fail`` logs one and waits on,
        ``never_fail`` skips, anything else fails the task.
        """
        assert self.response_check is not None
        response = self._response_to_check(payload)
        if response is None:
            return False
        from airflow.sdk.bases.decorator import determine_kwargs  # what the official sensor calls

        try:
            answer = self.response_check(response, **determine_kwargs(self.response_check, [response], context))
        except AirflowSkipException:
            raise
        except Exception:
            if getattr(self, "silent_fail", False):
                self.log.exception("response_check raised; taken as not yet (silent_fail)")
                return False
            if self.never_fail:
                raise AirflowSkipException("Skipping: response_check raised (never_fail)") from None
            raise
        if isinstance(answer, PokeReturnValue):
            if answer.is_done:
                self._check_xcom = (answer.xcom_value,)
            return bool(answer.is_done)
        return bool(answer)

    def _response_to_check(self, payload: dict[str, Any]) -> requests.Response | None:
        local, self._local_response = self._local_response, None
        if local is not None and not local.truncated:
            url = payload.get("url", "")
            return requests_response(local.status, local.reason, url, joined_headers(local), local.body)
        record = payload.get("response")
        cut = any(str(c.get("path", "")).startswith("$.response") for c in payload.get("truncated") or [])
        if isinstance(record, dict) and record.get("complete") and isinstance(record.get("content"), str) and not cut:
            body = base64.b64decode(record["content"])
            return requests_response(record["status_code"], record["reason"], record["url"], record["headers"], body)
        self.log.info("The response's body did not travel whole in the event; sending the request again here")
        return self._fetch_again()

    def _fetch_again(self) -> requests.Response | None:
        """The same request once more, read whole: ``None`` if the answer is not a success now."""
        trigger = self._worker_trigger(max_body_bytes=WHOLE_BODY)
        payload = run_in_worker(trigger.poll_once())
        if payload is None:
            return None  # not yet, or a transient error: wait on
        if not _is_success(payload):
            self.finish(payload)  # raises: the error fails the task as the trigger's would
        response = trigger.last_response
        assert response is not None
        self._fresh_payload = payload
        url = payload.get("url", "")
        return requests_response(response.status, response.reason, url, joined_headers(response), response.body)

    def finish(self, payload: Any) -> Any:
        """As every sensor, minus the ``response`` block added for ``response_check`` (never an XCom).

        A ``PokeReturnValue`` from ``response_check`` makes its ``xcom_value`` the XCom, as officially.
        """
        if _is_success(payload) and self.response_check is not None:
            xcom, self._check_xcom = self._check_xcom, None
            fresh, self._fresh_payload = self._fresh_payload, None
            payload = fresh or payload
            if not self.include_response:
                payload = {key: value for key, value in payload.items() if key != "response"}
            if xcom is not None:
                self.log.info("Condition met: %s; response_check returned the XCom", payload)
                return xcom[0]
        return super().finish(payload)


def triggerer_path(response_check: Any) -> str | None:
    """The dotted path the triggerer imports ``response_check`` by, or ``None`` for the worker.

    A string is that path (its shape is checked, and it is imported here, so a typo fails at
    parse). A callable qualifies only if every host surely imports it by name, the same object:
    a module-level function of an installed package (not the DAG file, whose module the DAG
    processor names for itself, nor a module beside the DAGs that the triggerer may lack), taking
    the response alone (context keys exist only in the worker).
    """
    if response_check is None:
        return None
    if isinstance(response_check, str):
        import_predicate(response_check, argument="response_check")
        return response_check
    module_name = getattr(response_check, "__module__", None) or ""
    qualname = getattr(response_check, "__qualname__", "") or ""
    module = sys.modules.get(module_name)
    origin = str(getattr(getattr(module, "__spec__", None), "origin", "") or "")
    if "<" in qualname or not inspect.isfunction(response_check) or module is None:
        return None
    if not any(part in origin for part in ("site-packages", "dist-packages")):
        return None
    parameters = list(inspect.signature(response_check).parameters.values())
    if len(parameters) != 1 or parameters[0].kind not in (
        inspect.Parameter.POSITIONAL_ONLY,
        inspect.Parameter.POSITIONAL_OR_KEYWORD,
    ):
        return None
    path = f"{module_name}:{qualname}"
    try:
        found = import_predicate(path, argument="response_check")
    except ValueError:
        return None
    return path if found is response_check else None


def _is_success(payload: Any) -> bool:
    return isinstance(payload, dict) and payload.get("status") == SUCCESS
