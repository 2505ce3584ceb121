"""Wait in the triggerer for a job an HTTP API started, then fetch its result.

:class:`~airflow_deferrable_kit.operators.http.HttpJobOperator` submits the job once, on the
worker, and hands this trigger the job's handle (its status URL and id). The trigger never
submits: it polls the status URL on the shared session, judges each answer with the HTTP wait's
conditions (status code and JSON paths, ``success`` / ``failure`` / ``running``), honours
``Retry-After``, follows a ``303 See Other`` to the result, then fetches the result, following
its pages, and fires one event. So a triggerer restart, an HA peer adopting the trigger, or a
rebuild from the stored kwargs polls the same job again and never starts another one.

What it started it may cancel: on timeout (``cancel["on_timeout"]``) and, on Airflow 3.3, when
the task is killed or marked failed while deferred (:meth:`HttpJobTrigger.on_kill`), with one
request to the cancel endpoint (default ``DELETE`` of the status URL); never after a success.

The kwargs carry the handle, the conditions, what the result is and how to page it, and how to
cancel, as JSON: no callable, no header, no credential (those come from the connection).
"""

from __future__ import annotations

import dataclasses
import datetime as dt
from collections.abc import Mapping
from typing import Any, ClassVar, Final

from airflow_deferrable_kit._http.client import (
    HttpOptions,
    close_session,
    is_transient_status,
    load_options,
    open_session,
    status_error_type,
)
from airflow_deferrable_kit._http.responses import (
    NOT_JSON,
    TOO_LARGE,
    Response,
    next_link,
    parse_retry_after,
    send,
)
from airflow_deferrable_kit._redact import redact, redact_url
from airflow_deferrable_kit.conditions import MISSING, lookup, parse_path
from airflow_deferrable_kit.errors import ConditionFailed, ErrorType, FatalError, TransientError
from airflow_deferrable_kit.payload import TIMEOUT, Found, cap_value, success_payload
from airflow_deferrable_kit.triggers.base import parse_deadline
from airflow_deferrable_kit.triggers.http import MAX_VALUE_CHARS, METHODS, HttpBatchReadyTrigger

#: Keys of the ``result`` parameter: where the result is and how its pages follow one another.
RESULT_KEYS: Final = frozenset(
    {
        "endpoint",
        "link_path",
        "path",
        "items_path",
        "next_path",
        "next_header",
        "cursor_path",
        "cursor_param",
        "max_pages",
    }
)
#: Keys of the ``cancel`` parameter.
CANCEL_KEYS: Final = frozenset({"endpoint", "method", "on_timeout", "on_kill"})
#: Keys of the ``job`` parameter: the handle the operator saved, and where a result fetch resumes.
JOB_KEYS: Final = frozenset({"id", "poll_after", "result_url", "cursor", "submitted"})
DEFAULT_MAX_PAGES: Final = 100
#: The most pages any result may be read in, whatever ``max_pages`` says.
MAX_PAGES_LIMIT: Final = 100_000
#: Seconds a cancel request may take (``on_kill`` is bounded by ``[triggerer] on_kill_timeout`` too).
CANCEL_TIMEOUT: Final = 20.0


def job_link(template: str, job_id: str | None, *, argument: str) -> str:
    """``template`` with ``{id}`` replaced by the job's id (URL-quoted); a clear error without one."""
    if "{id}" not in template:
        return template
    if job_id is None:
        raise ValueError(f"{argument}={template!r} names {{id}} but the job has no id")
    from urllib.parse import quote

    return template.replace("{id}", quote(str(job_id), safe=""))


def _path_or_none(spec: Mapping[str, Any], key: str, *, argument: str) -> tuple[str | int, ...] | None:
    value = spec.get(key)
    if value is None:
        return None
    return parse_path(value, argument=f"{argument}[{key!r}]")


def validate_result_spec(result: Any) -> dict[str, Any]:
    """Check the ``result`` parameter (a JSON object); a ``ValueError`` names the bad key."""
    if result is None:
        return {}
    if not isinstance(result, dict):
        raise ValueError(f"result must be an object such as {{'endpoint': 'jobs/{{id}}/result'}}, got {result!r}")
    unknown = set(result) - RESULT_KEYS
    if unknown:
        raise ValueError(f"result: unknown keys {sorted(unknown)}; expected some of {sorted(RESULT_KEYS)}")
    for key in ("endpoint", "cursor_param"):
        value = result.get(key)
        if value is not None and (not isinstance(value, str) or not value):
            raise ValueError(f"result[{key!r}] must be a non-empty string, got {value!r}")
    if result.get("endpoint") and result.get("link_path"):
        raise ValueError("result: give endpoint or link_path, not both (where the result is, said once)")
    for key in ("link_path", "path", "items_path", "next_path", "cursor_path"):
        _path_or_none(result, key, argument="result")
    if bool(result.get("cursor_path")) != bool(result.get("cursor_param")):
        raise ValueError("result: cursor_path and cursor_param go together (where the cursor is, and how to send it)")
    if result.get("path") is not None and any(result.get(key) for key in ("next_path", "cursor_path", "items_path")):
        raise ValueError("result: path picks one value from one document; it cannot be combined with paging keys")
    header = result.get("next_header", True)
    if not isinstance(header, bool):
        raise ValueError(f"result['next_header'] must be true or false, got {header!r}")
    pages = result.get("max_pages", DEFAULT_MAX_PAGES)
    if isinstance(pages, bool) or not isinstance(pages, int) or not 1 <= pages <= MAX_PAGES_LIMIT:
        raise ValueError(f"result['max_pages'] must be an integer from 1 to {MAX_PAGES_LIMIT}, got {pages!r}")
    return result


def validate_cancel_spec(cancel: Any) -> dict[str, Any]:
    """Check the ``cancel`` parameter (a JSON object); a ``ValueError`` names the bad key."""
    if cancel is None:
        return {}
    if not isinstance(cancel, dict):
        raise ValueError(
            f"cancel must be an object such as {{'method': 'POST', 'endpoint': 'jobs/{{id}}/cancel'}}, got {cancel!r}"
        )
    unknown = set(cancel) - CANCEL_KEYS
    if unknown:
        raise ValueError(f"cancel: unknown keys {sorted(unknown)}; expected some of {sorted(CANCEL_KEYS)}")
    method = cancel.get("method", "DELETE")
    if not isinstance(method, str) or method.upper() not in METHODS:
        raise ValueError(f"cancel['method'] must be one of {', '.join(METHODS)}, got {method!r}")
    endpoint = cancel.get("endpoint")
    if endpoint is not None and (not isinstance(endpoint, str) or not endpoint):
        raise ValueError(f"cancel['endpoint'] must be a non-empty string, got {endpoint!r}")
    for flag in ("on_timeout", "on_kill"):
        if not isinstance(cancel.get(flag, True), bool):
            raise ValueError(f"cancel[{flag!r}] must be true or false, got {cancel.get(flag)!r}")
    return cancel


class HttpJobTrigger(HttpBatchReadyTrigger):
    """Poll a submitted job's status URL until it succeeds or fails, then fetch its result.

    :param endpoint: the job's status URL: a path under the connection's base URL, or the
        absolute URL the API answered with (``Location``, ``Operation-Location``,
        ``Azure-AsyncOperation``, ``Content-Location``). At another origin than the
        connection's, it is asked without the connection's credentials.
    :param job: the rest of the handle: ``id`` (the job's id, for ``{id}`` in the result and
        cancel endpoints), ``poll_after`` (ISO time of the first poll, from the submit's
        ``Retry-After``), and where a result fetch resumes: ``result_url`` and ``cursor``.
    :param acceptors: the job's status as data (matchers ``status`` and ``path``): ``success``
        means done, ``failure`` means the job failed (its message and ``select`` fields go in
        the error), ``retry`` means running. With none, a 2xx that is not a ``not_yet_codes``
        status (default ``[202]``) is done.
    :param result: where the result is and how it pages: ``endpoint`` (``"jobs/{id}/result"``)
        or ``link_path`` (a JSON path of the status body holding the result's URL); ``path`` (a
        JSON path picking the result out of the status or result body); ``items_path`` (the
        list on each page to collect); ``next_path`` (a JSON path holding the next page's URL),
        ``next_header`` (follow a ``Link: <...>; rel="next"`` header, default true),
        ``cursor_path`` + ``cursor_param`` (the next page is the result URL with the cursor as
        that query parameter); ``max_pages`` (default 100). Without ``endpoint`` or
        ``link_path`` the result is the status body (or the page a ``303`` led to).
    :param cancel: how to cancel what was started: ``method`` (default ``DELETE``), ``endpoint``
        (default the status URL; may name ``{id}``), ``on_timeout`` and ``on_kill`` (default true).

    The success payload: ``job`` (status URL and id), ``status_code``, ``decision``,
    ``fields`` (``select``), ``result`` (the collected items, or the result document),
    ``pages`` and ``complete`` (false when ``max_pages`` stopped the paging; ``next`` then says
    where it would go on). A payload over the cap is cut to fit and says what was cut.
    """

    __slots__ = ("_cancel_spec", "_done", "_job_target", "_pages", "_result_spec", "_started_wait")

    endpoint: str = ""
    method: str = "GET"
    not_yet_codes: list[int] = dataclasses.field(default_factory=lambda: [202])
    job: dict[str, Any] = dataclasses.field(default_factory=dict)
    result: dict[str, Any] | None = None
    cancel: dict[str, Any] | None = None
    poll_interval: float = 30.0

    metrics_name: ClassVar[str | None] = "http_job"

    # -------------------------------------------------------------------- validation
    def validate(self) -> None:
        endpoint = self.endpoint
        if not isinstance(endpoint, str) or not endpoint.strip():
            raise ValueError(f"endpoint must be the job's status URL (a path or an http(s) URL), got {endpoint!r}")
        # The base refuses absolute URLs (credentials go only where the connection points); a
        # job's status URL is the server's to choose, and HttpOptions.at() keeps that rule per request.
        self.endpoint = ""
        try:
            super().validate()
        finally:
            self.endpoint = endpoint
        if "://" in endpoint and not endpoint.lower().startswith(("http://", "https://")):
            raise ValueError(f"endpoint must be a path or an http(s) URL, got {endpoint!r}")
        if not isinstance(self.job, dict):
            raise ValueError(f"job must be an object such as {{'id': 'j-42'}}, got {self.job!r}")
        unknown = set(self.job) - JOB_KEYS
        if unknown:
            raise ValueError(f"job: unknown keys {sorted(unknown)}; expected some of {sorted(JOB_KEYS)}")
        job_id = self.job.get("id")
        if job_id is not None and (isinstance(job_id, bool) or not isinstance(job_id, (str, int))):
            raise ValueError(f"job['id'] must be a string or an integer, got {job_id!r}")
        if self.job.get("poll_after") is not None:
            parse_deadline(self.job["poll_after"], argument="job['poll_after']")
        self._result_spec = validate_result_spec(self.result)
        self._cancel_spec = validate_cancel_spec(self.cancel)
        for key, template in (("result['endpoint']", self._result_spec.get("endpoint")),
                              ("cancel['endpoint']", self._cancel_spec.get("endpoint"))):  # fmt: skip
            if template:
                job_link(template, self.job_id, argument=key)
        self._pages: _Pages | None = None
        self._done: Found | None = None
        self._job_target: HttpOptions | None = None
        self._started_wait = False

    @property
    def job_id(self) -> str | None:
        value = self.job.get("id") if isinstance(self.job, dict) else None
        return None if value is None else str(value)

    def describe(self) -> str:
        what = f"job {self.job_id!r}" if self.job_id is not None else "job"
        text = f"{what} at {redact_url(self.endpoint)} on connection {self.http_conn_id!r}"
        return f"{text} ({self._last})" if self._last else text

    def handle(self) -> dict[str, Any]:
        """The job's handle as payloads and messages carry it."""
        return {"status_url": redact_url(self.endpoint), "id": self.job_id}

    # ------------------------------------------------------------------------ polling
    async def wait(self) -> dict[str, Any]:
        """The base loop, after the submit's ``Retry-After``; a timeout cancels the job."""
        poll_after = self.job.get("poll_after")
        if poll_after is not None and not self._started_wait:
            self._started_wait = True
            delay = parse_deadline(poll_after, argument="job['poll_after']") - self.clock.time()
            left = self.seconds_left()
            if left is not None:
                delay = min(delay, max(left, 0.0))
            if delay > 0:
                await self.clock.sleep(delay)
        payload = await super().wait()
        if payload.get("status") == TIMEOUT and self._cancel_spec.get("on_timeout", True):
            cancelled = await self.cancel_job(reason="the wait timed out")
            payload = {**payload, "cancel": cancelled}
        return payload

    async def _session_and_target(self) -> tuple[Any, HttpOptions]:
        if self._target is None:
            self._target = await load_options(self.http_conn_id)
        target = self._target
        session = await self.lease(target.lease_key, lambda: open_session(target), close_session)
        return session, target

    async def fetch(self) -> tuple[Response, str, str]:
        """One status poll of the job; identical polls (another wait on the same job) share it."""
        session, target = await self._session_and_target()
        job_target, url = target.at(self.endpoint, self.query)
        method = self.method.upper()
        response = await self.send(session, job_target, method, url)
        return response, redact_url(str(url)), method

    async def check(self) -> Found | None:
        if self._done is None:
            response, safe_url, method = await self.fetch()
            found = await self.judge(response, safe_url=safe_url, method=method)
            if found is None:
                return None
            self._done = found
            self._pages = await self.first_pages(response, found)
        # Done: read the result's pages. A transient error here retries from the page it was on.
        assert self._pages is not None
        return await self.collect(self._done, self._pages)

    async def judge(self, response: Response, *, safe_url: str, method: str) -> Found | None:
        """The job's state from one answer: done (found), running (``None``), or raise.

        A ``303 See Other`` (any redirect the poll followed to a 2xx) is done: the answer is
        the result's first page. A failure condition raises ``condition_failed`` with the
        job's handle, the ``select`` fields and the body's excerpt in the error.
        """
        if response.redirects and response.ok:
            self._last = None
            data = {"status_code": response.status, "method": method, "url": safe_url,
                    "decision": {"state": "success", "matcher": "redirect", "comparator": "see_other",
                                 "actual": response.status}}  # fmt: skip
            if response.url is not None:
                data["final_url"] = redact_url(str(response.url.with_user(None)))
            return Found(data)
        try:
            return await self.evaluate(response, safe_url=safe_url, method=method)
        except ConditionFailed as failed:
            details = dict(failed.details or {})
            details["job"] = self.handle()
            document = await response.document() if self._select_paths else NOT_JSON
            if self._select_paths and document is not NOT_JSON and document is not TOO_LARGE:
                details["fields"] = {
                    path: cap_value(None if (value := lookup(document, parts)) is MISSING else value, MAX_VALUE_CHARS)
                    for path, parts in self._select_paths.items()
                }
            fields = details.get("fields")
            message = (
                f"the job {self.job_id!r} failed: {failed.message}"
                if self.job_id
                else f"the job failed: {failed.message}"
            )
            if fields:
                message += f"; fields: {cap_value(fields, 500)}"
            raise ConditionFailed(message, details=details) from None

    async def answer(self, response: Response, *, safe_url: str, method: str) -> dict[str, Any] | None:
        """Judge an answer the worker got itself (the submit's) as a poll's: the success payload
        (its result fetched), or ``None`` while the job runs; a failed job raises."""
        try:
            found = await self.judge(response, safe_url=safe_url, method=method)
            if found is None:
                return None
            self._done = found
            self._pages = await self.first_pages(response, found)
            return self._safe(success_payload, await self.collect(found, self._pages))
        finally:
            await self.release()

    async def first_pages(self, response: Response, found: Found) -> _Pages:
        """Where the result is, once the job is done: a result URL to page, or the answer itself."""
        spec = self._result_spec
        resume = self.job.get("result_url")
        if response.redirects and response.ok and not resume:  # a 303 led to the result: its first page
            pages = _Pages(url=None)
            pages.first_url = redact_url(str(response.url)) if response.url is not None else None
            await pages.add(self, response, spec)
            return pages
        if resume:  # a fetch that stopped part-way (``next`` of an earlier payload) goes on from there
            cursor = self.job.get("cursor")
            pages = _Pages(url=resume, cursor=cursor)
            if cursor not in (None, "") and spec.get("cursor_param"):
                pages.url = _with_query(resume, str(spec["cursor_param"]), cursor)
            return pages
        if spec.get("endpoint"):
            return _Pages(url=job_link(spec["endpoint"], self.job_id, argument="result['endpoint']"))
        if spec.get("link_path"):
            document = await response.document()
            link = lookup(document, spec["link_path"]) if document not in (NOT_JSON, TOO_LARGE) else MISSING
            if not isinstance(link, str) or not link:
                raise FatalError(
                    f"the job {self.job_id!r} is done but its status body has no result link at "
                    f"{spec['link_path']!r} (saw {cap_value(None if link is MISSING else link, 200)!r})",
                    error_type=ErrorType.PROTOCOL,
                    details={**found.data, "job": self.handle()},
                )
            return _Pages(url=link)
        pages = _Pages(url=None)
        await pages.add(self, response, self._result_spec)
        return pages

    async def collect(self, found: Found, pages: _Pages) -> Found:
        """Read the result's remaining pages (up to ``max_pages``) and build the success data."""
        spec = self._result_spec
        limit = int(spec.get("max_pages", DEFAULT_MAX_PAGES))
        while pages.next_url is not None and pages.count < limit:
            session, target = await self._session_and_target()
            page_target, url = target.at(pages.next_url, pages.next_query)
            response = await send(
                session,
                page_target,
                "GET",
                url,
                json_body=None,
                timeout=float(self.request_timeout),
                max_body_bytes=self.body_limit(),
            )
            if not response.ok:
                raise self._page_error(response, redact_url(str(url)))
            await pages.add(self, response, spec)
        data = {**found.data, "job": self.handle(), "result": pages.result(spec), "pages": pages.count}
        data["complete"] = pages.next_url is None
        if pages.next_url is not None:
            data["next"] = {"result_url": redact_url(pages.next_url), "cursor": pages.cursor}
        data.pop("body_excerpt", None)  # the result says more than an excerpt of the status body
        return Found(data)

    def _page_error(self, response: Response, safe_url: str) -> FatalError | TransientError:
        message = (
            f"GET {safe_url} (the result of job {self.job_id!r}) returned {response.status} {response.reason}".rstrip()
        )
        message += f": {response.excerpt(300)}"
        details = {"status_code": response.status, "url": safe_url, "job": self.handle()}
        if is_transient_status(response.status):
            retry_after = parse_retry_after(response.headers.get("Retry-After"), now=self.clock.time())
            return TransientError(
                message, retry_after=retry_after, error_type=status_error_type(response.status), details=details
            )
        return FatalError(message, error_type=status_error_type(response.status), details=details)

    # ------------------------------------------------------------------------ cancel
    def cancel_request(self) -> tuple[str, str]:
        """The method and URL (path or absolute) of the cancel request."""
        method = str(self._cancel_spec.get("method", "DELETE")).upper()
        endpoint = self._cancel_spec.get("endpoint")
        link = job_link(endpoint, self.job_id, argument="cancel['endpoint']") if endpoint else self.endpoint
        return method, link

    async def cancel_job(self, *, reason: str) -> dict[str, Any]:
        """Send the one cancel request; what happened, as JSON (never raises but on cancellation).

        A 2xx, 404 or 409 answer counts as sent (gone or already finished are both "nothing
        left running"); anything else is reported in the payload and the log, not retried.
        """
        method, link = self.cancel_request()
        try:
            session, target = await self._session_and_target()
            cancel_target, url = target.at(link)
            response = await send(
                session,
                cancel_target,
                method,
                url,
                json_body=None,
                timeout=min(float(self.request_timeout), CANCEL_TIMEOUT),
                max_body_bytes=64 * 1024,
            )
        except Exception as exc:
            error = self.classify_error(exc)
            self.log.warning("Could not cancel %s (%s): %s", self.describe(), reason, redact(error.message))
            return {"sent": False, "method": method, "url": redact_url(link), "error": redact(error.message)}
        finally:
            await self.release()
        sent = response.ok or response.status in (404, 409)
        log = self.log.info if sent else self.log.warning
        log(
            "Cancelled %s (%s): %s %s answered %s",
            self.describe(),
            reason,
            method,
            redact_url(str(url)),
            response.status,
        )
        return {"sent": sent, "method": method, "url": redact_url(str(url)), "status_code": response.status}

    async def on_kill(self) -> None:
        """Airflow 3.3: the task was killed or marked failed while deferred: cancel the job once.

        Runs after :meth:`run` was cancelled, bounded by ``[triggerer] on_kill_timeout``. A
        triggerer restart or an adoption does not call it, so a restart never cancels.
        """
        spec = getattr(self, "_cancel_spec", None)  # unset: the trigger was never built, nothing to cancel
        if spec is not None and spec.get("on_kill", True):
            await self.cancel_job(reason="the task was killed while deferred")


@dataclasses.dataclass
class _Pages:
    """The result read so far: the items (or documents) collected and where the next page is."""

    url: str | None
    cursor: Any = None
    items: list[Any] = dataclasses.field(default_factory=list)
    documents: list[Any] = dataclasses.field(default_factory=list)
    count: int = 0
    #: The URL of the result's first page, which a cursor is sent to.
    first_url: str | None = None

    def __post_init__(self) -> None:
        self.first_url = self.url

    @property
    def next_url(self) -> str | None:
        return self.url

    @property
    def next_query(self) -> dict[str, Any] | None:
        return None

    async def add(self, trigger: HttpJobTrigger, response: Response, spec: Mapping[str, Any]) -> None:
        """Take one page: its items, then where the next one is (body link, Link header, cursor)."""
        document = await response.document()
        if document is NOT_JSON or document is TOO_LARGE:
            if self.count == 0 and not spec.get("items_path") and not spec.get("path"):
                self.documents.append(response.excerpt(int(trigger.excerpt_chars)))  # a text result
                self.count, self.url = 1, None
                return
            why = f"larger than max_body_bytes={trigger.max_body_bytes}" if document is TOO_LARGE else "not JSON"
            raise FatalError(
                f"the result of job {trigger.job_id!r} (page {self.count + 1}) is {why}: {response.excerpt(200)}",
                error_type=ErrorType.PROTOCOL if document is NOT_JSON else ErrorType.BAD_CONFIGURATION,
                details={"status_code": response.status, "job": trigger.handle()},
            )
        self.count += 1
        if spec.get("items_path"):
            items = lookup(document, spec["items_path"])
            if items is MISSING:
                items = []
            if not isinstance(items, list):
                raise FatalError(
                    f"the result of job {trigger.job_id!r}: items_path {spec['items_path']!r} is not a list on page "
                    f"{self.count} (saw {type(items).__name__})",
                    error_type=ErrorType.PROTOCOL,
                    details={"job": trigger.handle()},
                )
            self.items.extend(items)
        elif spec.get("path"):
            value = lookup(document, spec["path"])
            self.documents.append(None if value is MISSING else value)
        else:
            self.documents.append(document)
        self.url = self._next(document, response, spec)

    def _next(self, document: Any, response: Response, spec: Mapping[str, Any]) -> str | None:
        if spec.get("path"):
            return None
        if spec.get("next_path"):
            link = lookup(document, spec["next_path"])
            return link if isinstance(link, str) and link else None
        if spec.get("cursor_path"):
            cursor = lookup(document, spec["cursor_path"])
            if cursor is MISSING or cursor in (None, ""):
                return None
            self.cursor = cursor
            base = self.first_url or str(response.url or "")
            return _with_query(base, str(spec["cursor_param"]), cursor)
        if spec.get("next_header", True):
            return next_link(response.headers.get("Link"))
        return None

    def result(self, spec: Mapping[str, Any]) -> Any:
        """The result: every page's items in one list, or the one document, or each page's."""
        if spec.get("items_path"):
            return self.items
        return self.documents[0] if len(self.documents) == 1 else self.documents


def _with_query(link: str, name: str, value: Any) -> str:
    """``link`` with the query parameter ``name`` set to ``value`` (replacing one already there)."""
    from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

    parts = urlsplit(link)
    query = [(key, item) for key, item in parse_qsl(parts.query, keep_blank_values=True) if key != name]
    query.append((name, "true" if value is True else "false" if value is False else str(value)))
    return urlunsplit(parts._replace(query=urlencode(query)))


def poll_after(seconds: float | None, *, now: float) -> str | None:
    """The ISO time of the first poll, ``seconds`` (a submit's ``Retry-After``) from ``now``."""
    if not seconds:
        return None
    return dt.datetime.fromtimestamp(now + seconds, tz=dt.timezone.utc).isoformat()


__all__ = ["HttpJobTrigger", "job_link", "poll_after", "validate_cancel_spec", "validate_result_spec"]
