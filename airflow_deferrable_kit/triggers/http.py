"""Wait until an HTTP endpoint says a batch is ready, over one shared aiohttp session.

Readiness is data: acceptors on the status code and on JSON paths of the body (see
:mod:`airflow_deferrable_kit.conditions`), optionally an importable predicate. Credentials come
from the Airflow connection inside the triggerer and are applied per request, so the kwargs
hold none and one pooled keep-alive session serves every trigger in the process.

How a connection becomes a request, the shared session, the response and aiohttp's errors live
in :mod:`airflow_deferrable_kit._http.client`; this module decides what a response means. Waits
sending the identical request within a short window share one response (``send_shared``), and
each judges it by its own conditions.
Neither imports ``aiohttp`` at module level, so the sensor imports without the ``http`` extra.
"""

from __future__ import annotations

import asyncio
import base64
import dataclasses
import importlib
import sys
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, ClassVar, Final

from airflow_deferrable_kit._arguments import require_conn_id, require_seconds
from airflow_deferrable_kit._http.client import (
    HttpOptions,
    classify_aiohttp_error,
    close_session,
    is_transient_status,
    load_options,
    open_session,
    status_error_type,
)
from airflow_deferrable_kit._http.responses import (
    MAX_REDIRECTS,
    NOT_JSON,
    TOO_LARGE,
    Response,
    parse_retry_after,
    send_shared,
)
from airflow_deferrable_kit._redact import redact, redact_url, redact_value
from airflow_deferrable_kit._shared_polls import reuse_window
from airflow_deferrable_kit.conditions import (
    DEFAULT,
    MISSING,
    Acceptor,
    ConditionSet,
    Verdict,
    capped_decision,
    explain,
    lookup,
    parse_path,
    settle,
)
from airflow_deferrable_kit.errors import ErrorType, FatalError, TransientError, WaitError
from airflow_deferrable_kit.payload import cap_value, json_size, truncate_text
from airflow_deferrable_kit.triggers.base import Found, PollingTrigger

if TYPE_CHECKING:
    import requests

#: Matchers an HTTP acceptor may use, and whether each takes an argument.
MATCHERS: Final[Mapping[str, bool]] = {"status": False, "path": True}
METHODS: Final = ("GET", "POST", "PUT", "PATCH", "DELETE", "HEAD", "OPTIONS")

#: What an HTTP predicate may be given (see ``predicate_receives``).
PREDICATE_RECEIVES: Final = ("dict", "response")
DEFAULT_NOT_YET_CODES: Final = (404,)
DEFAULT_REQUEST_TIMEOUT: Final = 30.0
DEFAULT_MAX_BODY_BYTES: Final = 1024 * 1024
#: The most of a body a predicate (an importable ``response_check`` too) may be given when
#: ``max_body_bytes`` is lower: the official ``HttpSensor`` hands its callable the whole body,
#: so a wait with a predicate reads up to ``max(max_body_bytes, this)``; a larger body fails the
#: wait naming ``max_body_bytes``, and a callable is never given a cut body.
PREDICATE_BODY_BYTES: Final = 32 * 1024 * 1024
DEFAULT_EXCERPT_CHARS: Final = 1000
#: Upper bound for ``excerpt_chars`` so a payload always fits in MAX_PAYLOAD_BYTES.
MAX_EXCERPT_CHARS: Final = 16_000
#: A selected or observed value longer than this (as JSON) is cut to a marked string.
MAX_VALUE_CHARS: Final = 1000
#: Consecutive 2xx answers whose body is not JSON, while a path condition needs it, taken as
#: "not yet" (a proxy's or load balancer's HTML page during a deploy) before the wait fails.
MAX_UNREADABLE_BODIES: Final = 5
#: Most of a body, in bytes, a success event carries for a check in the worker (``include_response``);
#: base64 makes it about 43 KiB of the 64 KiB payload. A larger body is left out and fetched again there.
RESPONSE_BODY_EVENT_BYTES: Final = 32 * 1024
#: Most the response headers may take in such an event, as JSON; more and the response is left out.
RESPONSE_HEADERS_EVENT_BYTES: Final = 8 * 1024
#: Response headers holding a URL the server chose: secret-looking query values masked in events.
URL_HEADERS: Final = frozenset({"location", "content-location", "link", "refresh"})


class _Unreadable(Exception):
    """A path acceptor needed the body as JSON and it is not (or it was too large to read)."""


def _cap_value(value: Any) -> Any:
    """Keep a JSON value if small, else a marked cut of its JSON text (payloads stay bounded)."""
    return None if value is MISSING else cap_value(value, MAX_VALUE_CHARS)


# ------------------------------------------------------------------------------ trigger
class HttpBatchReadyTrigger(PollingTrigger):
    """Poll ``endpoint`` on ``http_conn_id`` until the response says the batch is ready.

    :param http_conn_id: Airflow connection with the base URL, credentials and extra headers.
    :param endpoint: path relative to the connection's base URL (may carry a query string).
    :param method: HTTP method (GET, POST, PUT, PATCH, DELETE, HEAD, OPTIONS).
    :param query: query parameters; a list value repeats the parameter.
    :param json_body: JSON request body (``None`` sends no body).
    :param acceptors: canonical acceptors (matchers ``status`` and ``path``), tried in order.
    :param predicate: dotted path of a sync or async callable judging 2xx responses, by the one
        rule of :mod:`airflow_deferrable_kit.conditions` (truthy means ready).
    :param predicate_receives: what the predicate is given: ``"dict"`` (``status_code``,
        ``headers``, ``text``, ``json``) or ``"response"``, a ``requests.Response`` as the
        official ``HttpSensor``'s ``response_check`` gets (the sensor's importable
        ``response_check`` is judged here with it, so a "not yet" costs no worker).
    :param not_yet_codes: statuses meaning "not yet" when no acceptor decided.
    :param select: JSON paths copied into the success payload's ``fields``.
    :param request_timeout: seconds for one request, including waiting for a pooled socket.
    :param max_body_bytes: most of a body read; a larger one cannot be evaluated as JSON. With a
        predicate at least :data:`PREDICATE_BODY_BYTES` is read (see :meth:`body_limit`): the
        predicate is given the whole body or, past that, the wait fails naming this parameter.
    :param excerpt_chars: length of the body excerpt in payloads and error messages.
    :param include_response: put the whole response (status, reason, headers, body) in the success
        payload under ``response``, for a check that runs in the worker (the sensor's
        ``response_check``); see :func:`response_for_event` for when the body is left out.
    """

    __slots__ = (
        "_acceptors",
        "_conditions",
        "_hold_off",
        "_last",
        "_seen",
        "_select_paths",
        "_status_conditions",
        "_target",
        "_unreadable_bodies",
        "keep_last_response",
        "last_response",
    )  # its state: see PollingTrigger.__slots__

    http_conn_id: str = "http_default"
    endpoint: str = ""
    method: str = "GET"
    query: dict[str, Any] | None = None
    json_body: Any = None
    acceptors: list[dict[str, Any]] = dataclasses.field(default_factory=list)
    predicate: str | None = None
    predicate_receives: str | None = "dict"
    not_yet_codes: list[int] = dataclasses.field(default_factory=lambda: list(DEFAULT_NOT_YET_CODES))
    select: list[str] = dataclasses.field(default_factory=list)
    request_timeout: float = DEFAULT_REQUEST_TIMEOUT
    max_body_bytes: int = DEFAULT_MAX_BODY_BYTES
    excerpt_chars: int = DEFAULT_EXCERPT_CHARS
    include_response: bool = False
    poll_interval: float = 60.0

    extra: ClassVar[str | None] = "http"
    extra_modules: ClassVar[tuple[str, ...]] = ("aiohttp",)

    # -------------------------------------------------------------------- validation
    def validate(self) -> None:
        require_conn_id(self.http_conn_id, argument="http_conn_id")
        if not isinstance(self.endpoint, str):
            raise ValueError(f"endpoint must be a string, got {type(self.endpoint).__name__}")
        if "://" in self.endpoint:
            raise ValueError(
                f"endpoint must be a path relative to the connection's base URL, got {self.endpoint!r} "
                "(put the scheme and host in the connection, so credentials only go where it points)"
            )
        if not isinstance(self.method, str) or self.method.upper() not in METHODS:
            raise ValueError(f"method must be one of {', '.join(METHODS)}, got {self.method!r}")
        self._validate_query()
        self._conditions = ConditionSet.load(
            self.canonical_conditions(), self.predicate, matchers=MATCHERS, refine=refine_status
        )
        self._acceptors: tuple[Acceptor, ...] = self._conditions.acceptors
        #: Off a 2xx only the status can be judged: the body is an error page or empty.
        self._status_conditions = ConditionSet([a for a in self._acceptors if a.matcher == "status"])
        codes = [as_status(code) for code in self._require_list("not_yet_codes")]
        if None in codes:
            raise ValueError(f"not_yet_codes must be a list of {STATUS_CODES}, got {self.not_yet_codes!r}")
        self.not_yet_codes = [code for code in codes if code is not None]
        self._select_paths = {path: parse_path(path, argument="select") for path in self._require_list("select")}
        require_seconds(self.request_timeout, argument="request_timeout")
        if isinstance(self.max_body_bytes, bool) or not isinstance(self.max_body_bytes, int) or self.max_body_bytes < 1:
            raise ValueError(f"max_body_bytes must be a positive integer, got {self.max_body_bytes!r}")
        chars = self.excerpt_chars
        if isinstance(chars, bool) or not isinstance(chars, int) or not 0 <= chars <= MAX_EXCERPT_CHARS:
            raise ValueError(f"excerpt_chars must be an integer from 0 to {MAX_EXCERPT_CHARS}, got {chars!r}")
        if self.predicate_receives is not None and self.predicate_receives not in PREDICATE_RECEIVES:
            raise ValueError(
                f"predicate_receives must be one of {', '.join(PREDICATE_RECEIVES)}, got {self.predicate_receives!r}"
            )
        if not isinstance(self.include_response, bool):
            raise ValueError(f"include_response must be true or false, got {self.include_response!r}")
        self._unreadable_bodies = 0
        #: Set by the sensor's worker path: keep the last response for a check in the worker.
        self.keep_last_response = False
        self.last_response: Response | None = None
        self._seen: int | None = None  # id() of the response the last poll judged: never judged twice
        self._target: HttpOptions | None = None
        self._hold_off: float | None = None
        self._last: str | None = None

    def canonical_conditions(self) -> list[dict[str, Any]]:
        """The acceptors in their canonical form (a subclass may add its own shorthand)."""
        return self.acceptors

    def _require_list(self, name: str) -> list[Any]:
        value = getattr(self, name)
        if not isinstance(value, list):
            raise ValueError(f"{name} must be a list, got {type(value).__name__}")
        return value

    def _validate_query(self) -> None:
        if self.query is None:
            return
        if not isinstance(self.query, dict):
            raise ValueError(f"query must be a dict of parameter names to values, got {type(self.query).__name__}")
        for name, value in self.query.items():
            for item in value if isinstance(value, list) else [value]:
                if item is not None and not isinstance(item, (str, int, float, bool)):
                    raise ValueError(
                        f"query[{name!r}] must be a string, number, boolean or a list of them, got {item!r}"
                    )

    def describe(self) -> str:
        """What is polled, and what the last poll saw (so a timeout message says why it waited)."""
        text = f"{self.method.upper()} {self.endpoint or '/'} on connection {self.http_conn_id!r}"
        return f"{text} ({self._last})" if self._last else text

    # ------------------------------------------------------------------------ polling
    async def check(self) -> Found | None:
        response, safe_url, method = await self.fetch()
        if self.keep_last_response:
            self.last_response = response
        return await self.evaluate(response, safe_url=safe_url, method=method)

    def body_limit(self) -> int:
        """The most of a body read: ``max_body_bytes``, raised to :data:`PREDICATE_BODY_BYTES` for a
        predicate, which is given the body whole (as the official ``response_check`` is) or not at all."""
        limit = int(self.max_body_bytes)
        return max(limit, PREDICATE_BODY_BYTES) if self.predicate else limit

    def too_large(self) -> str:
        """Why a body cut at :meth:`body_limit` cannot be judged, naming ``max_body_bytes``."""
        limit = self.body_limit()
        if limit == int(self.max_body_bytes):
            return f"larger than max_body_bytes={self.max_body_bytes}"
        return (
            f"larger than {limit} bytes, the most read for a predicate while "
            f"max_body_bytes={self.max_body_bytes} is lower"
        )

    async def fetch(self) -> tuple[Response, str, str]:
        """Send the request once: the response, its URL without credentials, and the method.

        An identical request (same connection settings, method, URL, headers, body, timeout and
        body cap) started within :func:`~airflow_deferrable_kit._shared_polls.reuse_window` of
        this wait's poll interval answers instead, in flight or just finished.
        """
        if self._target is None:
            self._target = await load_options(self.http_conn_id)
        target = self._target
        session = await self.lease(target.lease_key, lambda: open_session(target), close_session)
        method = self.method.upper()
        url = self._target.url(self.endpoint, self.query)
        response = await self.send(session, self._target, method, url)
        return response, str(url.with_user(None)), method

    async def send(self, session: Any, target: HttpOptions, method: str, url: Any) -> Response:
        """This wait's request, sent once or answered by an identical one (:func:`send_shared`)."""
        response = await send_shared(
            session,
            target,
            method,
            url,
            json_body=self.json_body,
            timeout=float(self.request_timeout),
            max_body_bytes=self.body_limit(),
            max_age=reuse_window(float(self.poll_interval)),
            seen=self._seen,
        )
        self._seen = id(response)
        return response

    async def evaluate(self, response: Response, *, safe_url: str, method: str) -> Found | None:
        """Decide on one response: ready, not yet, or raise a transient / fatal / failed error."""
        status = response.status
        context: dict[str, Any] = {"status_code": status, "method": method, "url": safe_url}
        if response.redirects and response.url is not None:
            # Where the answer came from: a URL the server chose, so its signature, token or
            # credential query values (a pre-signed URL's) are masked by name.
            context["final_url"] = redact_url(str(response.url.with_user(None)))
            context["redirects"] = response.redirects
        # The body is only evaluated on a 2xx that is not a "not yet" code: an error page or an
        # empty 202 must never satisfy (or break) a path acceptor such as {"exists": false}.
        evaluate_body = response.ok and status not in self.not_yet_codes
        needs_document = evaluate_body and (
            self._select_paths or self.predicate or any(a.matcher == "path" for a in self._acceptors)
        )
        document = await response.document() if needs_document else NOT_JSON

        def value_of(acceptor: Acceptor) -> Any:
            if acceptor.matcher == "status":
                return status
            if document is NOT_JSON or document is TOO_LARGE:
                raise _Unreadable
            return lookup(document, acceptor.parts)

        conditions = self._conditions if evaluate_body else self._status_conditions
        if self.predicate_receives == "response" and conditions.predicate is not None:
            await _import_requests()  # the first import of requests must not happen on the loop
        try:
            verdict = await conditions.evaluate(value_of, lambda: self._predicate_subject(response, document, context))
        except _Unreadable:
            self._unreadable(response, document, context)
            return None
        self._unreadable_bodies = 0
        context["observed"] = {label: _cap_value(value) for label, value in verdict.observed.items()}
        state = self._state_of(verdict, response)
        if state is None:
            raise self._status_error(response, context)
        if state == "retry":
            self._hold_off = parse_retry_after(response.headers.get("Retry-After"), now=self.clock.time())
            seen = ", ".join(f"{label}={value!r}" for label, value in context["observed"].items())
            self._last = truncate_text(f"last response: {status}" + (f", {seen}" if seen else ""), 300)
            return None
        decided = self._capped_decision(verdict, status)
        data = {**context, "decision": decided}
        if state == "success":
            self._last = None
            if self._select_paths:
                usable = document is not NOT_JSON and document is not TOO_LARGE
                data["fields"] = {
                    path: _cap_value(lookup(document, parts)) if usable else None
                    for path, parts in self._select_paths.items()
                }
            if self.include_response:
                data["response"] = response_for_event(response, safe_url)
        data["body_excerpt"] = response.excerpt(int(self.excerpt_chars))
        return settle(
            state,
            data,
            lambda: (
                f"{method} {safe_url} reported failure: {explain(decided)}; "
                f"body: {response.excerpt(min(int(self.excerpt_chars), 300))}"
            ),
        )

    def _state_of(self, verdict: Verdict, response: Response) -> str | None:
        """The verdict's state, with HTTP's own default: a 2xx is ready, a not-yet code is not yet.

        ``None``: no condition spoke and the status is neither, so it is an error status.
        """
        decided = verdict.decided_by is not None and verdict.state != DEFAULT
        if decided or (verdict.state == "retry" and response.ok and response.status not in self.not_yet_codes):
            return verdict.state
        if response.status in self.not_yet_codes:
            return "retry"
        if response.ok:
            return "success" if verdict.state == DEFAULT else "retry"
        return None

    @staticmethod
    def _capped_decision(verdict: Verdict, status: int) -> dict[str, Any] | None:
        if verdict.state == DEFAULT:
            return {"state": "success", "matcher": "default", "comparator": "2xx", "actual": status}
        return capped_decision(verdict.decided_by, MAX_VALUE_CHARS)

    def _status_error(self, response: Response, context: dict[str, Any]) -> WaitError:
        status = response.status
        excerpt = response.excerpt(int(self.excerpt_chars))
        short = response.excerpt(min(int(self.excerpt_chars), 300))
        if 300 <= status <= 399:  # a redirect's body quotes the URL the server chose ("Redirecting to ...")
            excerpt, short = redact_url(excerpt), redact_url(short)
        message = f"{context['method']} {context['url']} returned {status} {response.reason}".rstrip() + f": {short}"
        details = {**context, "body_excerpt": excerpt}
        self._last = f"last response: {status} {response.reason}".rstrip()
        if is_transient_status(status):
            retry_after = parse_retry_after(response.headers.get("Retry-After"), now=self.clock.time())
            error_type = status_error_type(status)
            return TransientError(message, retry_after=retry_after, error_type=error_type, details=details)
        if 300 <= status <= 399:
            location = response.headers.get("Location")
            if not location:
                message += " (a redirect without a Location to follow)"
            elif response.redirects >= MAX_REDIRECTS:
                where = redact_url(location)
                message += f" (redirect to {where!r} not followed: more than {MAX_REDIRECTS} redirects)"
        error_type = status_error_type(status)
        if error_type in (ErrorType.AUTHENTICATION, ErrorType.AUTHORIZATION):
            what = "rejected the credentials of" if error_type is ErrorType.AUTHENTICATION else "refused access to"
            message = f"http_conn_id={self.http_conn_id!r}: the server {what} the connection: {message}"
        return FatalError(message, error_type=error_type, details=details)

    def _unreadable(self, response: Response, document: Any, context: dict[str, Any]) -> None:
        """A 2xx body a path condition cannot read: not yet a few times, then a fatal error.

        A proxy or load balancer answering 200 with an HTML page during a deploy must not end
        a wait at once; a body that stays unreadable for :data:`MAX_UNREADABLE_BODIES` polls
        in a row, or one over ``max_body_bytes``, does.
        """
        excerpt = response.excerpt(int(self.excerpt_chars))
        content_type = response.headers.get("Content-Type", "no content type")
        if document is TOO_LARGE:
            reason = f"the body is {self.too_large()}"
            error_type = ErrorType.BAD_CONFIGURATION
        else:
            self._unreadable_bodies += 1
            reason = "the body is not JSON"
            error_type = ErrorType.PROTOCOL
            if self._unreadable_bodies < MAX_UNREADABLE_BODIES:
                self.log.warning(
                    "%s %s returned %s (%s) but the body is not JSON, so the path conditions cannot be "
                    "evaluated; taken as not yet (%d of %d in a row before the wait fails): %s",
                    context["method"], context["url"], response.status, content_type,
                    self._unreadable_bodies, MAX_UNREADABLE_BODIES, redact(response.excerpt(200)),
                )  # fmt: skip
                self._last = f"last response: {response.status} ({content_type}), not JSON"
                return None
            reason += f" ({self._unreadable_bodies} answers in a row)"
        raise FatalError(
            f"{context['method']} {context['url']} returned {response.status} ({content_type}) but {reason}, "
            f"so the path acceptors cannot be evaluated: {response.excerpt(min(int(self.excerpt_chars), 300))}",
            error_type=error_type,
            details={**context, "body_excerpt": excerpt},
        )

    def _predicate_subject(self, response: Response, document: Any, context: dict[str, Any]) -> Any:
        if response.truncated:  # over body_limit(): never hand a callable a cut body
            what = "response_check" if self.predicate_receives == "response" else "predicate"
            size = response.headers.get("Content-Length")
            raise FatalError(
                f"{context['method']} {context['url']} returned {response.status} with a body "
                + (f"of {size} bytes, " if size else "")
                + f"{self.too_large()}: the {what} {self.predicate!r} is given a body whole or not at all; "
                "raise max_body_bytes above the body's size to judge it",
                error_type=ErrorType.BAD_CONFIGURATION,
                details={**context, "body_excerpt": response.excerpt(int(self.excerpt_chars))},
            )
        if self.predicate_receives == "response":
            url = str(response.url.with_user(None)) if response.url is not None else ""
            return requests_response(response.status, response.reason, url, joined_headers(response), response.body)
        return {
            "status_code": response.status,
            "headers": dict(response.headers),
            "text": response.decoded,
            "json": None if document is NOT_JSON or document is TOO_LARGE else document,
        }

    def next_poll_delay(self) -> float:
        """The poll interval, or longer if a "not yet" response asked for it with Retry-After."""
        hold_off, self._hold_off = self._hold_off, None
        return max(float(self.poll_interval), hold_off or 0.0)

    def classify_error(self, exc: Exception) -> WaitError:
        # The base names the last transient error in a timeout message; ``_last`` says what the
        # last *answer* was, so the two never repeat each other.
        return classify_aiohttp_error(exc) or super().classify_error(exc)


def requests_response(status: int, reason: str, url: str, headers: Mapping[str, str], body: bytes) -> requests.Response:
    """A ``requests.Response`` as requests' own adapter builds one, for a callable written for it.

    The body is set as the content already read (as the official provider's
    ``HttpResponseSerializer`` does), and the encoding is what requests derives from the headers,
    so ``text`` and ``json()`` answer as they would for the official sensor. No cookies, history
    or ``elapsed``.
    """
    import requests
    from requests.structures import CaseInsensitiveDict
    from requests.utils import get_encoding_from_headers

    response = requests.Response()
    response.status_code = status
    response.reason = reason
    response.url = url
    response.headers = CaseInsensitiveDict(headers)
    response.encoding = get_encoding_from_headers(response.headers)
    response._content = body
    return response


async def _import_requests() -> None:
    """Import requests off the loop once per process (it reads files and builds tables)."""
    if "requests" not in sys.modules:
        await asyncio.to_thread(importlib.import_module, "requests")


def joined_headers(response: Response) -> dict[str, str]:
    """The response's headers as one value per name, repeated ones joined with ``", "`` as requests does."""
    headers: Any = response.headers  # aiohttp's multidict: getall gives every value of a name
    return {name: ", ".join(headers.getall(name)) for name in dict.fromkeys(headers.keys())}


def response_for_event(response: Response, url: str) -> dict[str, Any]:
    """The response as a check in the worker needs it, as JSON: what a ``requests.Response`` is built from.

    ``status_code``, ``reason``, ``url`` (without credentials), ``headers`` (repeated ones joined
    with ``", "``, as requests joins them) and ``content``, the body's bytes in base64. The body
    travels only whole and as it was sent: ``content`` is ``None`` and ``complete`` false when it
    was not read to the end (``max_body_bytes``), is over :data:`RESPONSE_BODY_EVENT_BYTES`, or
    holds a known secret (which the payload would mask), and when the headers are over
    :data:`RESPONSE_HEADERS_EVENT_BYTES` or hold one, or a URL header (:data:`URL_HEADERS`) whose
    secret-looking query values are masked. The worker then fetches the response again rather
    than judge a part of it.
    """
    sent = joined_headers(response)
    headers = {name: redact_url(value) if name.lower() in URL_HEADERS else value for name, value in sent.items()}
    whole = (
        not response.truncated
        and len(response.body) <= RESPONSE_BODY_EVENT_BYTES
        and json_size(headers) <= RESPONSE_HEADERS_EVENT_BYTES
        and headers == sent
        and redact_value(headers) == headers
        and redact(response.decoded) == response.decoded
    )
    return {
        "status_code": response.status,
        "reason": response.reason,
        "url": url,
        "headers": headers if json_size(headers) <= RESPONSE_HEADERS_EVENT_BYTES else {},
        "content": base64.b64encode(response.body).decode("ascii") if whole else None,
        "complete": whole,
    }


#: What a status code may be given as, for messages.
STATUS_CODES: Final = "HTTP status integers (100-599) or their digits as strings ('404')"


def as_status(value: Any) -> int | None:
    """An HTTP status code as an int, from an int or a string of its digits; ``None`` if not one.

    Strings are accepted because Airflow's own ``HttpSensor`` takes its
    ``response_error_codes_allowlist`` as strings (``["404"]``), and templates render to text.
    """
    if isinstance(value, str) and value.isascii() and value.isdigit():
        value = int(value)
    if isinstance(value, int) and not isinstance(value, bool) and 100 <= value <= 599:
        return value
    return None


def refine_status(acceptor: Acceptor, where: str) -> Acceptor:
    """HTTP's rule for an acceptor: a ``status`` one expects status codes, normalised to ints.

    Run when the acceptor is built (see :data:`airflow_deferrable_kit.conditions.Refine`), so a
    bad code is named by the entry the user wrote, ``success[0]``, at DAG parse.
    """
    if acceptor.matcher != "status" or acceptor.comparator == "exists":
        return acceptor
    values = acceptor.expected if acceptor.comparator == "in" else [acceptor.expected]
    codes = [as_status(value) for value in values]
    if None in codes:
        raise ValueError(f"{where}: a status acceptor expects {STATUS_CODES}, got {acceptor.expected!r}")
    expected = codes if acceptor.comparator == "in" else codes[0]
    return dataclasses.replace(acceptor, expected=expected)


__all__ = [
    "MATCHERS",
    "PREDICATE_BODY_BYTES",
    "HttpBatchReadyTrigger",
    "as_status",
    "joined_headers",
    "parse_retry_after",
    "refine_status",
    "requests_response",
    "response_for_event",
]
