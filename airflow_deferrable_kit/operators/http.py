"""Run a job an HTTP API starts: submit it once on the worker, wait for it in the triggerer.

:class:`HttpJobOperator` is the shape of ``HttpOperator`` + ``HttpSensor`` (or
``HttpOperator(deferrable=True)``) for asynchronous APIs, without their one flaw: they send the
request again whenever the task runs again. Here the submit happens once, on the worker, with an
idempotency key stable for the task instance (dag, run, task, map index); the job's handle (its
status URL and id) is saved in Airflow's task state store (3.3) before the task defers; the
trigger (:class:`~airflow_deferrable_kit.triggers.http_jobs.HttpJobTrigger`) only polls and
fetches. A triggerer restart or an adoption rebuilds the trigger from its kwargs (0 submits); a
retry after the wait failed re-attaches to the saved handle; a retry after the job itself failed
submits anew only with ``resubmit_on_retry=True``.

Everything about an API is data (class attributes or arguments), so a platform team declares
its job service in a subclass of a few lines (see docs/operators/http-job.md).
"""

from __future__ import annotations

import asyncio
import json
import threading
import time
import uuid
from collections.abc import Mapping, Sequence
from datetime import timedelta
from typing import Any, ClassVar, Final, NoReturn

from airflow.sdk import BaseOperator, Context
from airflow.sdk.configuration import conf
from airflow.sdk.exceptions import AirflowTaskTimeout

from airflow_deferrable_kit._arguments import require_bool, require_conn_id, require_seconds
from airflow_deferrable_kit._http.client import close_session, load_options, open_session
from airflow_deferrable_kit._http.responses import Response, parse_retry_after, send
from airflow_deferrable_kit._redact import is_sensitive_key, redact, redact_url
from airflow_deferrable_kit._trigger_queues import require_trigger_queue, route_trigger
from airflow_deferrable_kit.conditions import MISSING, ConditionSet, lookup, parse_path
from airflow_deferrable_kit.errors import ErrorType, WaitError
from airflow_deferrable_kit.extras import require_extra
from airflow_deferrable_kit.payload import ERROR, SUCCESS, TIMEOUT, error_payload, require_json_primitives
from airflow_deferrable_kit.sensors.base import (
    BACKSTOP_GRACE,
    is_unresolved,
    listeners_registered,
    log_preview,
    run_in_worker,
)
from airflow_deferrable_kit.triggers.base import deadline_after
from airflow_deferrable_kit.triggers.http import (
    DEFAULT_MAX_BODY_BYTES,
    DEFAULT_REQUEST_TIMEOUT,
    MATCHERS,
    METHODS,
    refine_status,
)
from airflow_deferrable_kit.triggers.http_jobs import (
    DEFAULT_MAX_PAGES,
    HttpJobTrigger,
    job_link,
    poll_after,
    validate_cancel_spec,
    validate_result_spec,
)

__all__ = ["JOB_LOCATION_HEADERS", "HttpJobError", "HttpJobOperator"]

#: Response headers naming a job's status URL, in the order they are believed: Azure's two
#: (the long-running-operation pattern), then ``Location`` and ``Content-Location``.
JOB_LOCATION_HEADERS: Final = ("Azure-AsyncOperation", "Operation-Location", "Location", "Content-Location")
#: Seconds the worker's ``on_kill`` waits for its cancel request.
KILL_CANCEL_SECONDS: Final = 25.0
#: The states a saved handle records, each written by the worker that learnt it.
RUNNING, SUCCEEDED, FAILED, CANCELLED = "running", "succeeded", "failed", "cancelled"


class HttpJobError(RuntimeError):
    """The job failed, or could not be submitted or followed (the message says which, and why)."""


#: The operator's parameters: name -> default. Each is a class attribute too, so a subclass
#: declares its API as data (``endpoint = "api/2.0/sql/statements"``) and a DAG overrides it.
PARAMETERS: Final[Mapping[str, Any]] = {
    "http_conn_id": "http_default",
    "endpoint": "",
    "method": "POST",
    "data": None,
    "headers": None,
    "idempotency_header": "Idempotency-Key",
    "status_endpoint": None,
    "job_id_path": None,
    "success": None,
    "failure": None,
    "running": None,
    "acceptors": None,
    "select": None,
    "not_yet_codes": (202,),
    "result_endpoint": None,
    "result_link_path": None,
    "result_path": None,
    "items_path": None,
    "next_link_path": None,
    "next_link_header": True,
    "cursor_path": None,
    "cursor_param": None,
    "max_pages": DEFAULT_MAX_PAGES,
    "cancel_endpoint": None,
    "cancel_method": "DELETE",
    "cancel_on_timeout": True,
    "cancel_on_kill": True,
    "resubmit_on_retry": False,
    "end_from_trigger": False,
    "poll_interval": 30.0,
    "timeout": 7 * 24 * 3600.0,
    "max_backoff": 300.0,
    "request_timeout": DEFAULT_REQUEST_TIMEOUT,
    "max_body_bytes": DEFAULT_MAX_BODY_BYTES,
    "state_key": "http_job",
}


class HttpJobOperator(BaseOperator):
    """Submit a job to an HTTP API once, wait for it (deferred), and return its result as XCom.

    Submit (on the worker, once): ``method`` (default ``POST``) to ``endpoint`` on
    ``http_conn_id`` with ``data`` (a JSON value, or text sent as it is) and ``headers`` (not
    credentials: those come from the connection, with its extra headers), plus
    ``idempotency_header`` (default ``Idempotency-Key``; ``None`` to send none) whose value is
    stable for the task instance, so a server that honours it dedupes a submit sent again.

    The answer: ``200``/``201`` with the result is done at once (no deferral) unless the
    ``running`` conditions say otherwise; ``202`` names the job by a header
    (``Azure-AsyncOperation``, ``Operation-Location``, ``Location``, ``Content-Location``) or
    by an id at ``job_id_path`` in the body, put into ``status_endpoint`` (``"jobs/{id}"``,
    which wins when set); a ``Retry-After`` delays the first poll; a ``303 See Other`` is
    followed to the result.

    The status, as data: ``success``, ``failure``, ``running`` (lists of
    ``{"status": 200}`` or ``{"path": "state", "equals": "DONE"}``; ``in`` and ``exists`` too),
    or canonical ``acceptors``. With none, a 2xx that is not in ``not_yet_codes`` (default
    ``[202]``) is done. ``select``: JSON paths copied into the payload (and a failure's error).

    The result: ``result_endpoint`` (``"jobs/{id}/result"``) or ``result_link_path`` (a JSON
    path of the status body holding its URL), else the status body itself; ``result_path``
    picks one value; pages are followed by ``next_link_path`` (a URL in the body), a ``Link``
    header (``next_link_header``, default true) or ``cursor_path`` + ``cursor_param``, collecting
    ``items_path`` of each page, up to ``max_pages``. The payload is capped as every payload is
    (64 KiB), and says what was cut.

    Cancel (one request: ``cancel_method``, default ``DELETE``, to ``cancel_endpoint``, default
    the status URL): on timeout (``cancel_on_timeout``) and when the task is killed or marked
    failed (``cancel_on_kill``: the trigger's ``on_kill`` on Airflow 3.3 while deferred, the
    operator's ``on_kill`` on the worker); never after a success.

    Retries: the handle is saved in the task state store under ``state_key`` (Airflow 3.3). A
    retry after the wait failed re-attaches to the saved job (0 submits); after the job failed,
    it fails again without submitting unless ``resubmit_on_retry=True`` (default ``False``:
    sending a job again is a decision); after a timeout (the job was cancelled) it submits anew.
    On Airflow 3.2 there is no task state store: a retry submits again, with the same
    idempotency key. A triggerer restart or adoption never submits, on either.

    :param deferrable: wait in the triggerer (default ``[operators] default_deferrable``, read
        when the operator is built); ``False`` runs the very same poll loop on the worker.
    :param trigger_queue: (Airflow 3.2+, ``[triggerer] queues_enabled``) the trigger queue of the
        wait alone, as for the sensors (docs/operations.md, "One upstream, one pool of
        triggerers"); the submit and the result stay on the task's own ``queue``.
    :param end_from_trigger: the triggerer ends the task (success with the payload as XCom, or a
        failure); a timeout still resumes on the worker, which raises ``AirflowTaskTimeout``.
    :param timeout: seconds for the whole wait of a try (one absolute deadline, kept across
        triggerer restarts); ``poll_interval``, ``max_backoff``, ``request_timeout`` and
        ``max_body_bytes`` as for the HTTP wait.
    """

    template_fields: Sequence[str] = (
        "http_conn_id",
        "endpoint",
        "method",
        "data",
        "headers",
        "status_endpoint",
        "result_endpoint",
        "cancel_endpoint",
    )
    template_fields_renderers = {"data": "json", "headers": "json"}
    ui_color = "#e8f0fe"

    # The API, as data: a subclass overrides these (see PARAMETERS for each default).
    http_conn_id: str = PARAMETERS["http_conn_id"]
    endpoint: str = PARAMETERS["endpoint"]
    method: str = PARAMETERS["method"]
    data: Any = None
    headers: dict[str, str] | None = None
    idempotency_header: str | None = PARAMETERS["idempotency_header"]
    status_endpoint: str | None = None
    job_id_path: str | None = None
    success: list[dict[str, Any]] | None = None
    failure: list[dict[str, Any]] | None = None
    running: list[dict[str, Any]] | None = None
    acceptors: list[dict[str, Any]] | None = None
    select: list[str] | None = None
    not_yet_codes: Sequence[int] = PARAMETERS["not_yet_codes"]
    result_endpoint: str | None = None
    result_link_path: str | None = None
    result_path: str | None = None
    items_path: str | None = None
    next_link_path: str | None = None
    next_link_header: bool = True
    cursor_path: str | None = None
    cursor_param: str | None = None
    max_pages: int = PARAMETERS["max_pages"]
    cancel_endpoint: str | None = None
    cancel_method: str = PARAMETERS["cancel_method"]
    cancel_on_timeout: bool = True
    cancel_on_kill: bool = True
    resubmit_on_retry: bool = False
    end_from_trigger: bool = False
    poll_interval: float = PARAMETERS["poll_interval"]
    timeout: float = PARAMETERS["timeout"]
    max_backoff: float = PARAMETERS["max_backoff"]
    request_timeout: float = PARAMETERS["request_timeout"]
    max_body_bytes: int = PARAMETERS["max_body_bytes"]
    #: The task state store key the handle is saved under (renaming it strands in-flight retries).
    state_key: str = PARAMETERS["state_key"]

    #: The trigger class; a subclass may name its own (a subclass of HttpJobTrigger).
    trigger_class: ClassVar[type[HttpJobTrigger]] = HttpJobTrigger

    def __init__(self, *, deferrable: bool | None = None, trigger_queue: str | None = None, **kwargs: Any) -> None:
        given = {name: kwargs.pop(name) for name in PARAMETERS if name in kwargs}
        super().__init__(**kwargs)
        for name, value in given.items():
            setattr(self, name, value)
        require_bool(deferrable, argument="deferrable", optional=True)
        self.deferrable: bool = (
            conf.getboolean("operators", "default_deferrable", fallback=False) if deferrable is None else deferrable
        )
        self.trigger_queue = require_trigger_queue(
            trigger_queue, where=f"{type(self).__name__} (task_id={self.task_id!r})", deferrable=self.deferrable
        )
        for name in (
            "cancel_on_timeout",
            "cancel_on_kill",
            "resubmit_on_retry",
            "end_from_trigger",
            "next_link_header",
        ):
            require_bool(getattr(self, name), argument=name)
        if self.end_from_trigger and listeners_registered():
            self.log.warning(
                "end_from_trigger=True is turned off for task_id=%r: listener plugins are registered and Airflow "
                "refuses end_from_trigger with listeners; the job is still waited for in the triggerer",
                self.task_id,
            )
            self.end_from_trigger = False
        for name, allow_zero in (("poll_interval", False), ("timeout", True), ("max_backoff", False)):
            seconds = require_seconds(getattr(self, name), argument=name, allow_zero=allow_zero, allow_timedelta=True)
            setattr(self, name, seconds)
        require_seconds(self.request_timeout, argument="request_timeout")
        self._acceptors = self._conditions()
        self._check_request()
        self._check_job()
        require_extra("http", "aiohttp", needed_by=type(self).__name__)
        self._live: dict[str, Any] | None = None  # the handle of a job this worker is following
        self._finished = False

    # ---------------------------------------------------------------- parse-time rules
    def _where(self, argument: str) -> str:
        return f"{type(self).__name__} (task_id={self.task_id!r}): {argument}"

    def _conditions(self) -> list[dict[str, Any]]:
        """The status conditions in canonical form; refused at parse, naming the entry."""
        try:
            canonical = ConditionSet.canonicalise(
                matchers=MATCHERS,
                acceptors=self.acceptors,
                success=self.success,
                failure=self.failure,
                retry=self.running,
                refine=refine_status,
            )
            ConditionSet.load(canonical, None, matchers=MATCHERS, refine=refine_status)
        except ValueError as exc:
            raise ValueError(f"{self._where('conditions')}: {exc}".replace("retry[", "running[")) from None
        return canonical

    def _check_request(self) -> None:
        require_conn_id(self.http_conn_id, argument="http_conn_id") if not is_unresolved(self.http_conn_id) else None
        if not isinstance(self.endpoint, str):
            raise ValueError(self._where(f"endpoint must be a path under the connection's URL, got {self.endpoint!r}"))
        if "://" in self.endpoint and not is_unresolved(self.endpoint):
            raise ValueError(
                self._where(
                    f"endpoint must be a path under the connection's base URL, got {self.endpoint!r} "
                    "(put the scheme and host in the connection, so its credentials only go where it points)"
                )
            )
        if not is_unresolved(self.method) and (not isinstance(self.method, str) or self.method.upper() not in METHODS):
            raise ValueError(self._where(f"method must be one of {', '.join(METHODS)}, got {self.method!r}"))
        if self.data is not None and not isinstance(self.data, (str, bytes)) and not is_unresolved(self.data):
            try:
                require_json_primitives(self.data, what="data")
            except Exception as exc:
                raise ValueError(self._where(f"data must be a JSON value or text: {exc}")) from None
        self._check_headers()

    def _check_headers(self) -> None:
        header = self.idempotency_header
        if header is not None and (not isinstance(header, str) or not header.strip() or ":" in header):
            raise ValueError(self._where(f"idempotency_header must be a header name or None, got {header!r}"))
        if self.headers is None or is_unresolved(self.headers):
            return
        if not isinstance(self.headers, Mapping):
            raise ValueError(self._where(f"headers must be a dict of header names to text, got {self.headers!r}"))
        for name, value in self.headers.items():
            if not isinstance(name, str) or not isinstance(value, str):
                raise ValueError(self._where(f"headers[{name!r}] must be text, got {value!r}"))
            same = isinstance(header, str) and name.lower() == header.lower()
            if not same and (is_sensitive_key(name) or name.lower() in ("authorization", "cookie")):
                raise ValueError(
                    self._where(
                        f"headers[{name!r}] looks like a credential: put it in the connection (its password, "
                        "extra 'bearer_token' or an extra header key), where it is kept as a secret"
                    )
                )

    def _check_job(self) -> None:
        for name in ("job_id_path", "result_link_path", "result_path", "items_path", "next_link_path", "cursor_path"):
            value = getattr(self, name)
            if value is not None:
                parse_path(value, argument=self._where(name))
        for path in self.select or []:
            parse_path(path, argument=self._where("select"))
        status = self.status_endpoint
        if status is not None and not is_unresolved(status):
            if not isinstance(status, str) or not status or "://" in status:
                raise ValueError(self._where(f"status_endpoint must be a path such as 'jobs/{{id}}', got {status!r}"))
            if "{id}" in status and self.job_id_path is None:
                raise ValueError(self._where("status_endpoint names {id}: set job_id_path to where the id is"))
        try:
            if not is_unresolved(self.result_endpoint):
                validate_result_spec(self.result_spec())
            if not is_unresolved(self.cancel_endpoint):
                validate_cancel_spec(self.cancel_spec())
        except ValueError as exc:
            raise ValueError(self._where(str(exc))) from None
        for name in ("result_endpoint", "cancel_endpoint"):
            value = getattr(self, name)
            if isinstance(value, str) and "{id}" in value and self.job_id_path is None and "{id}" not in (status or ""):
                raise ValueError(self._where(f"{name} names {{id}}: set job_id_path to where the id is"))
        codes = list(self.not_yet_codes)
        if any(isinstance(code, bool) or not isinstance(code, int) or not 100 <= code <= 599 for code in codes):
            raise ValueError(self._where(f"not_yet_codes must be HTTP status integers, got {codes!r}"))
        if not isinstance(self.state_key, str) or not self.state_key:
            raise ValueError(self._where(f"state_key must be a non-empty string, got {self.state_key!r}"))

    def result_spec(self) -> dict[str, Any]:
        """The trigger's ``result`` parameter, from the flat arguments."""
        spec: dict[str, Any] = {"max_pages": self.max_pages, "next_header": self.next_link_header}
        for key, name in (
            ("endpoint", "result_endpoint"),
            ("link_path", "result_link_path"),
            ("path", "result_path"),
            ("items_path", "items_path"),
            ("next_path", "next_link_path"),
            ("cursor_path", "cursor_path"),
            ("cursor_param", "cursor_param"),
        ):
            if getattr(self, name) is not None:
                spec[key] = getattr(self, name)
        return spec

    def cancel_spec(self) -> dict[str, Any]:
        """The trigger's ``cancel`` parameter, from the flat arguments."""
        spec: dict[str, Any] = {
            "method": self.cancel_method,
            "on_timeout": self.cancel_on_timeout,
            "on_kill": self.cancel_on_kill,
        }
        if self.cancel_endpoint is not None:
            spec["endpoint"] = self.cancel_endpoint
        return spec

    # ------------------------------------------------------------------- the trigger
    def build_trigger(self, handle: Mapping[str, Any], deadline: str | None) -> HttpJobTrigger:
        """The trigger following the job ``handle`` (also what polls on the worker)."""
        job = {key: handle[key] for key in ("id", "poll_after", "result_url", "cursor") if handle.get(key) is not None}
        return self.trigger_class(
            http_conn_id=self.http_conn_id,
            endpoint=handle["status_url"],
            job=job,
            acceptors=self._acceptors,
            select=list(self.select or []),
            not_yet_codes=list(self.not_yet_codes),
            result=self.result_spec(),
            cancel=self.cancel_spec(),
            request_timeout=float(self.request_timeout),
            max_body_bytes=int(self.max_body_bytes),
            poll_interval=float(self.poll_interval),
            max_backoff=float(self.max_backoff),
            deadline=deadline,
            end_from_trigger=self.end_from_trigger,
            do_xcom_push=self.do_xcom_push,
        )

    # ----------------------------------------------------------------------- execute
    def execute(self, context: Context) -> Any:
        # Templated values are checked once rendered, as at parse.
        self._acceptors = self._conditions()
        self._check_request()
        self._check_job()
        deadline = deadline_after(self.timeout)
        store = _state_store(context)
        if store is None:
            self.log.warning(
                "No task state store (Airflow < 3.3): the job's handle cannot outlive this try; a retry submits "
                "again with the same %s, which a server honouring it dedupes",
                self.idempotency_header or "request (no idempotency header)",
            )
        saved = _read(store, self.state_key)
        fresh = False
        if saved is not None:
            outcome = self._reattach(context, store, saved, deadline)
            if outcome is not _SUBMIT:
                return outcome
            fresh = True
        return self._submit_and_follow(context, store, deadline, fresh=fresh)

    def _reattach(self, context: Context, store: Any, saved: dict[str, Any], deadline: str) -> Any:
        """A job saved by an earlier try: follow it, finish with it, or say to submit anew."""
        state = saved.get("state")
        where = f"job {saved.get('id')!r} at {redact_url(str(saved.get('status_url')))}"
        if state == CANCELLED:
            self.log.info("The %s was cancelled by an earlier try (timeout or kill): submitting anew", where)
            return _SUBMIT
        if state == FAILED:
            if self.resubmit_on_retry:
                self.log.info("The %s failed on an earlier try; resubmit_on_retry=True: submitting anew", where)
                return _SUBMIT
            raise HttpJobError(
                f"the {where} failed on an earlier try ({saved.get('message', 'see that try')}); not submitting it "
                "again because resubmit_on_retry=False"
            )
        self.log.info("Re-attaching to the %s, saved by an earlier try: not submitting", where)
        trigger = self.build_trigger(saved, deadline)
        payload = run_in_worker(trigger.poll_once())
        if payload is None:
            return self._follow(context, store, saved, trigger, deadline)
        if payload.get("status") == ERROR and payload.get("error_type") == ErrorType.CONDITION_FAILED:
            _write(store, self.state_key, {**saved, "state": FAILED, "message": payload.get("message", "")[:500]})
            if self.resubmit_on_retry:
                self.log.info(
                    "The %s failed: %s; resubmit_on_retry=True: submitting anew", where, payload.get("message")
                )
                return _SUBMIT
        return self.complete(context, payload, saved)

    def _submit_and_follow(self, context: Context, store: Any, deadline: str, *, fresh: bool) -> Any:
        key = idempotency_key(context, fresh=fresh)
        response = run_in_worker(self._submit(key))
        submitted_url = redact_url(str(response.url)) if response.url is not None else self.endpoint
        self.log.info("Submitted: %s %s answered %s", self.method.upper(), submitted_url, response.status)
        if not response.ok:
            self._submit_failed(response, submitted_url)
        probe = self.build_trigger({"status_url": self.endpoint or "/", "id": self._job_id_of(response)}, None)
        running = response.status in self.not_yet_codes and not response.redirects
        if not running:
            try:
                payload = run_in_worker(probe.answer(response, safe_url=submitted_url, method=self.method.upper()))
            except WaitError as error:
                payload = error_payload(error.error_type, error.message, error.details)
            if payload is not None:
                if payload.get("status") == SUCCESS:
                    self.log.info("The job finished with the submit's answer: no wait")
                return self.complete(context, payload, None)
        handle = self._handle_from(response, key)
        _write(store, self.state_key, handle)
        self.log.info("Job %r at %s; handle saved, waiting", handle.get("id"), redact_url(handle["status_url"]))
        return self._follow(context, store, handle, self.build_trigger(handle, deadline), deadline)

    async def _submit(self, key: str) -> Response:
        target = await load_options(self.http_conn_id)
        session = await open_session(target)
        try:
            extra = dict(self.headers or {})
            if self.idempotency_header:
                extra[self.idempotency_header] = key
            url = target.url(self.endpoint, None)
            json_body, data = (None, self.data) if isinstance(self.data, (str, bytes)) else (self.data, None)
            return await send(
                session,
                target.with_headers(extra),
                self.method.upper(),
                url,
                json_body=json_body,
                data=data,
                timeout=float(self.request_timeout),
                max_body_bytes=int(self.max_body_bytes),
            )
        finally:
            await close_session(session)

    def _submit_failed(self, response: Response, url: str) -> NoReturn:
        kind = "a transient" if response.status in (408, 429) or response.status >= 500 else "an"
        raise HttpJobError(
            f"{self.method.upper()} {url} (the submit) returned {response.status} {response.reason}: "
            f"{redact(response.excerpt(500))}; {kind} error: nothing to follow, and nothing is sent again in this try"
        )

    def _handle_from(self, response: Response, key: str) -> dict[str, Any]:
        """The job's handle from a submit's answer: its status URL (absolute), id and first poll."""
        job_id = self._job_id_of(response)
        status_url: str | None = None
        if self.status_endpoint and ("{id}" not in self.status_endpoint or job_id is not None):
            status_url = job_link(self.status_endpoint, job_id, argument="status_endpoint")
        if status_url is None:
            for name in JOB_LOCATION_HEADERS:
                link = response.headers.get(name)
                if link:
                    base = response.url
                    status_url = str(base.join(type(base)(link))) if base is not None else link
                    break
        if status_url is None:
            raise HttpJobError(
                f"the submit answered {response.status} but named no job to follow: no "
                f"{', '.join(JOB_LOCATION_HEADERS)} header"
                + (f" and no id at job_id_path={self.job_id_path!r}" if self.job_id_path else "")
                + "; set status_endpoint='jobs/{id}' and job_id_path to where the id is"
            )
        retry_after = parse_retry_after(response.headers.get("Retry-After"), now=time.time())
        handle: dict[str, Any] = {
            "status_url": status_url,
            "id": job_id,
            "state": RUNNING,
            "idempotency_key": key,
            "submitted_at": deadline_after(0),
        }
        if retry_after:
            handle["poll_after"] = poll_after(retry_after, now=time.time())
        return handle

    def _job_id_of(self, response: Response) -> str | None:
        """The job's id at ``job_id_path`` in a submit's JSON body, or ``None``."""
        if self.job_id_path is None or response.truncated:
            return None
        try:
            document = json.loads(response.body)
        except (ValueError, UnicodeDecodeError):
            return None
        value = lookup(document, self.job_id_path)
        return None if value is MISSING or value is None or isinstance(value, (dict, list)) else str(value)

    def _follow(
        self, context: Context, store: Any, handle: dict[str, Any], trigger: HttpJobTrigger, deadline: str
    ) -> Any:
        """Wait for the job: deferred to the triggerer, or the same loop here (``deferrable=False``)."""
        self._live = handle
        if not self.deferrable:
            payload = run_in_worker(_wait(trigger))
            return self.complete(context, payload, handle)
        left = max(trigger.seconds_left() or 0.0, 0.0)
        route_trigger(self, self.trigger_queue)
        self.defer(
            trigger=trigger,
            method_name="execute_complete",
            kwargs={"handle": handle},
            timeout=timedelta(seconds=left) + BACKSTOP_GRACE,
        )

    def execute_complete(self, context: Context, event: dict[str, Any], handle: dict[str, Any] | None = None) -> Any:
        """Resume from the trigger: the payload becomes the XCom, or the task fails."""
        return self.complete(context, event, handle)

    def complete(self, context: Context, payload: Any, handle: dict[str, Any] | None) -> Any:
        """Record what became of the job in the saved handle, then end the task with it."""
        store = _state_store(context)
        status = payload.get("status") if isinstance(payload, dict) else None
        self._finished = True
        if status == SUCCESS:
            if handle is not None:
                _write(store, self.state_key, {**handle, "state": SUCCEEDED})
            self.log.info("The job succeeded: %s", log_preview(payload))
            return payload
        message = str(payload.get("message", "")) if isinstance(payload, dict) else repr(payload)
        if status == TIMEOUT:
            cancel = payload.get("cancel") or {}
            if handle is not None:
                _write(store, self.state_key, {**handle, "state": CANCELLED if cancel.get("sent") else RUNNING})
            said = "cancelled" if cancel.get("sent") else "not cancelled" if cancel else "left running"
            raise AirflowTaskTimeout(f"{message} (the job was {said})")
        if status == ERROR:
            if payload.get("error_type") == ErrorType.CONDITION_FAILED and handle is not None:
                _write(store, self.state_key, {**handle, "state": FAILED, "message": message[:500]})
            raise HttpJobError(f"{payload.get('error_type', 'error')}: {message}")
        raise HttpJobError(f"unexpected trigger event payload: {payload!r}")

    # ------------------------------------------------------------------------- kill
    def on_kill(self) -> None:
        """Killed on the worker while following a job (``deferrable=False``): cancel it once.

        While deferred the task has no worker: the trigger's ``on_kill`` (Airflow 3.3) cancels.
        Never after the job finished.
        """
        handle = self._live
        if handle is None or self._finished or not self.cancel_on_kill:
            return
        self._finished = True
        trigger = self.build_trigger(handle, None)
        outcome: dict[str, Any] = {}

        def cancel() -> None:  # a loop of its own: on_kill may interrupt the worker's loop
            outcome.update(asyncio.run(trigger.cancel_job(reason="the task was killed")))

        thread = threading.Thread(target=cancel, name="http-job-cancel", daemon=True)
        thread.start()
        thread.join(KILL_CANCEL_SECONDS)
        self.log.info("Cancel on kill: %s", outcome or "no answer in time")


_SUBMIT: Final = object()


async def _wait(trigger: HttpJobTrigger) -> dict[str, Any]:
    """The trigger's loop, on the worker (``deferrable=False``)."""
    try:
        return await trigger.wait()
    finally:
        await trigger.release()


def idempotency_key(context: Context, *, fresh: bool = False) -> str:
    """A key stable for the task instance (dag, run, task, map index): every submit of it is one
    request to a server that dedupes by it. ``fresh``: a deliberate new submit (after the job
    failed or was cancelled), keyed by the try too, so the server does not answer with the old job."""
    ti = context.get("ti")
    dag_id = getattr(ti, "dag_id", None) or getattr(context.get("dag"), "dag_id", "")
    run_id = getattr(ti, "run_id", None) or context.get("run_id", "")
    task_id = getattr(ti, "task_id", "")
    map_index = getattr(ti, "map_index", -1)
    name = f"airflow-deferrable-kit:{dag_id}:{run_id}:{task_id}:{map_index}"
    if fresh:
        name += f":try-{getattr(ti, 'try_number', 0)}"
    return str(uuid.uuid5(uuid.NAMESPACE_URL, name))


def _state_store(context: Context) -> Any:
    """Airflow 3.3's task state store accessor, or ``None`` (3.2: no store)."""
    try:
        return context.get("task_state_store")
    except Exception:
        return None


def _read(store: Any, key: str) -> dict[str, Any] | None:
    if store is None:
        return None
    value = store.get(key)
    return value if isinstance(value, dict) and value.get("status_url") else None


def _write(store: Any, key: str, handle: Mapping[str, Any]) -> None:
    if store is not None:
        store.set(key, {name: value for name, value in handle.items() if value is not None})
