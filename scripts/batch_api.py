"""A tiny batch-status HTTP API for trying the HTTP wait (a docker-compose service and the demo).

Batches (what ``dags/example_http.py`` waits on first):

* ``GET /v1/batches/{batch_id}/status`` returns ``{"batch_id", "state", "rows", "message",
  "updated_at"}``, plus ``"summary"`` when the query string has ``include=summary``. While the
  batch is unknown it returns ``404``, which the HTTP sensor reads as "not yet".
* ``PUT /v1/batches/{batch_id}`` with ``{"state": "ready", "rows": 42}`` creates or updates a
  batch (``201`` when it creates one). Only the fields you send change, and a new batch starts
  as ``pending``. The fields are ``state`` (``pending``, ``ready`` or ``failed``), ``rows`` (an
  integer >= 0 or null), ``message`` (a string or null) and ``summary`` (an object or null).
* ``DELETE /v1/batches/{batch_id}`` forgets a batch, and ``GET /v1/batches`` lists all of them.

Exports: ``GET``/``HEAD /v1/exports/{export_id}`` returns ``200`` once the export is published
and ``404`` before that. ``PUT /v1/exports/{export_id}`` (optional body ``{"files": N}``) publishes
it, and ``DELETE`` unpublishes it.

Reports: ``POST /v1/reports/query`` with ``{"report": R, "date": D}`` returns ``404`` while the
report is unknown, ``202`` with ``Retry-After`` while it is ``running``, ``200`` once it is
``done``, and ``422`` if it ``failed``. ``PUT /v1/reports/{report}/{date}`` with
``{"state": "running" | "done" | "failed", "rows": N, "message": "..."}`` sets it.

``GET /healthz`` returns ``{"status": "ok"}`` and never needs auth, so health checks can use it.

With a token (``--token``, or the ``BATCH_API_TOKEN`` environment variable) every ``/v1/``
request must send ``Authorization: Bearer <token>``, or it gets ``401``. State is kept in memory.

Run ``python scripts/batch_api.py --host 127.0.0.1 --port 8000 [--token T]``, or import
``make_app(token)``, which returns the :class:`aiohttp.web.Application`. The only dependency is aiohttp.
"""

from __future__ import annotations

import argparse
import datetime as dt
import functools
import hmac
import json
import os
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import Any, Final

from aiohttp import web

BATCH_STATES: Final = ("pending", "ready", "failed")
REPORT_STATES: Final = ("running", "done", "failed")
BATCH_FIELDS: Final = ("state", "rows", "message", "summary")
REPORT_FIELDS: Final = ("state", "rows", "message")
TOKEN_ENV: Final = "BATCH_API_TOKEN"
MAX_ID_CHARS: Final = 200
MAX_MESSAGE_CHARS: Final = 2000
MAX_BODY_BYTES: Final = 64 * 1024
#: Seconds a client is asked to wait (``Retry-After``) while a report is running.
REPORT_RETRY_AFTER: Final = 10

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]
Document = dict[str, Any]

BATCHES: Final = web.AppKey("batches", dict[str, Document])
EXPORTS: Final = web.AppKey("exports", dict[str, Document])
REPORTS: Final = web.AppKey("reports", dict[tuple[str, str], Document])
TOKEN: Final = web.AppKey("token", str)
RETRY_AFTER: Final = web.AppKey("retry_after", int)


class BadRequest(ValueError):
    """A request the API refuses with 400; the message says why."""


def _now() -> str:
    return dt.datetime.now(dt.timezone.utc).isoformat(timespec="milliseconds")


def _error(status: int, message: str, **extra: Any) -> web.Response:
    return web.json_response({"error": message, **extra}, status=status)


def _identifier(request: web.Request, name: str) -> str:
    value = request.match_info[name]
    if len(value) > MAX_ID_CHARS:
        raise BadRequest(f"{name} is longer than {MAX_ID_CHARS} characters")
    return value


async def _json_body(request: web.Request) -> Any:
    """The JSON body (an empty body reads as ``{}``)."""
    raw = await request.read()
    if len(raw) > MAX_BODY_BYTES:
        raise BadRequest(f"body larger than {MAX_BODY_BYTES} bytes")
    if not raw.strip():
        return {}
    try:
        return json.loads(raw)
    except json.JSONDecodeError as exc:
        raise BadRequest(f"body is not valid JSON: {exc}") from None


def _check_fields(body: Any, allowed: Sequence[str], example: str) -> dict[str, Any]:
    if not isinstance(body, dict):
        raise BadRequest(f"the body must be a JSON object such as {example}")
    unknown = sorted(set(body) - set(allowed))
    if unknown:
        raise BadRequest(f"unknown field(s) {', '.join(unknown)}; allowed: {', '.join(allowed)}")
    if "rows" in body:
        rows = body["rows"]
        if rows is not None and (isinstance(rows, bool) or not isinstance(rows, int) or rows < 0):
            raise BadRequest(f"rows must be an integer >= 0 or null, got {rows!r}")
    if "message" in body:
        message = body["message"]
        if message is not None and (not isinstance(message, str) or len(message) > MAX_MESSAGE_CHARS):
            raise BadRequest(f"message must be a string of at most {MAX_MESSAGE_CHARS} characters or null")
    return dict(body)


def validate_update(body: Any) -> dict[str, Any]:
    """Check a batch PUT body and return the fields it sets; raise :class:`BadRequest` (a ``ValueError``)."""
    update = _check_fields(body, BATCH_FIELDS, '{"state": "ready", "rows": 42}')
    if "state" in update and update["state"] not in BATCH_STATES:
        raise BadRequest(f"state must be one of {', '.join(BATCH_STATES)}, got {update['state']!r}")
    if "summary" in update and update["summary"] is not None and not isinstance(update["summary"], dict):
        raise BadRequest("summary must be a JSON object or null")
    return update


def validate_report(body: Any) -> dict[str, Any]:
    """Check a report PUT body; ``state`` is required."""
    update = _check_fields(body, REPORT_FIELDS, '{"state": "done", "rows": 42}')
    if update.get("state") not in REPORT_STATES:
        raise BadRequest(f"state must be one of {', '.join(REPORT_STATES)}, got {update.get('state')!r}")
    return update


@web.middleware
async def errors_and_auth(request: web.Request, handler: Handler) -> web.StreamResponse:
    """Turn :class:`BadRequest` into 400. With a token configured, ``/v1/`` requests must send ``Bearer <token>``."""
    token = request.app.get(TOKEN)
    if token and request.path.startswith("/v1/"):
        scheme, _, given = request.headers.get("Authorization", "").partition(" ")
        if scheme.lower() != "bearer" or not hmac.compare_digest(given.strip().encode(), token.encode()):
            response = _error(401, "missing or invalid bearer token")
            response.headers["WWW-Authenticate"] = 'Bearer realm="batch-api"'
            return response
    try:
        return await handler(request)
    except BadRequest as exc:
        return _error(400, str(exc))


# ------------------------------------------------------------------------------- batches
def _batch_view(batch: Mapping[str, Any], *, summary: bool) -> Document:
    view = {key: batch[key] for key in ("batch_id", "state", "rows", "message", "updated_at")}
    if summary:
        view["summary"] = batch.get("summary")
    return view


async def health(request: web.Request) -> web.Response:
    """Liveness for health checks; never behind the token."""
    return web.json_response({"status": "ok"})


async def list_batches(request: web.Request) -> web.Response:
    batches = request.app[BATCHES].values()
    return web.json_response({"batches": [_batch_view(b, summary=True) for b in batches]})


async def batch_status(request: web.Request) -> web.Response:
    """The status document of one batch; 404 while it is unknown."""
    batch_id = _identifier(request, "batch_id")
    batch = request.app[BATCHES].get(batch_id)
    if batch is None:
        return _error(404, "unknown batch", batch_id=batch_id)
    include = {part.strip() for value in request.query.getall("include", []) for part in value.split(",")}
    return web.json_response(_batch_view(batch, summary="summary" in include))


async def put_batch(request: web.Request) -> web.Response:
    """Create or update a batch from the JSON body; 201 when created, 200 when updated."""
    batch_id = _identifier(request, "batch_id")
    update = validate_update(await _json_body(request))
    batches = request.app[BATCHES]
    created = batch_id not in batches
    batch = batches.setdefault(
        batch_id, {"batch_id": batch_id, "state": "pending", "rows": None, "message": None, "summary": None}
    )
    batch.update(update, updated_at=_now())
    return web.json_response(_batch_view(batch, summary=True), status=201 if created else 200)


async def delete_batch(request: web.Request) -> web.Response:
    batch_id = _identifier(request, "batch_id")
    if request.app[BATCHES].pop(batch_id, None) is None:
        return _error(404, "unknown batch", batch_id=batch_id)
    return web.Response(status=204)


# ------------------------------------------------------------------------------- exports
async def get_export(request: web.Request) -> web.Response:
    """200 once the export is published, 404 before (GET and HEAD)."""
    export_id = _identifier(request, "export_id")
    export = request.app[EXPORTS].get(export_id)
    if export is None:
        return _error(404, "export not published", export_id=export_id)
    return web.json_response(export)


async def put_export(request: web.Request) -> web.Response:
    """Publish an export (optional ``{"files": N}``); 201 the first time."""
    export_id = _identifier(request, "export_id")
    body = _check_fields(await _json_body(request), ("files",), '{"files": 3}')
    files = body.get("files")
    if files is not None and (isinstance(files, bool) or not isinstance(files, int) or files < 0):
        raise BadRequest(f"files must be an integer >= 0 or null, got {files!r}")
    exports = request.app[EXPORTS]
    created = export_id not in exports
    exports[export_id] = {"export_id": export_id, "published": True, "files": files, "updated_at": _now()}
    return web.json_response(exports[export_id], status=201 if created else 200)


async def delete_export(request: web.Request) -> web.Response:
    export_id = _identifier(request, "export_id")
    if request.app[EXPORTS].pop(export_id, None) is None:
        return _error(404, "export not published", export_id=export_id)
    return web.Response(status=204)


# ------------------------------------------------------------------------------- reports
async def query_report(request: web.Request) -> web.Response:
    """404 unknown, 202 running (with Retry-After), 200 done, 422 failed."""
    body = await _json_body(request)
    if not isinstance(body, dict) or not isinstance(body.get("report"), str) or not isinstance(body.get("date"), str):
        raise BadRequest('the body must be {"report": "<name>", "date": "<date>"}')
    report = request.app[REPORTS].get((body["report"], body["date"]))
    if report is None:
        return _error(404, "unknown report", report=body["report"], date=body["date"])
    if report["state"] == "running":
        return web.json_response(report, status=202, headers={"Retry-After": str(request.app[RETRY_AFTER])})
    return web.json_response(report, status=200 if report["state"] == "done" else 422)


async def put_report(request: web.Request) -> web.Response:
    """Set a report's state; 201 the first time."""
    name, date = _identifier(request, "report"), _identifier(request, "date")
    update = validate_report(await _json_body(request))
    reports = request.app[REPORTS]
    created = (name, date) not in reports
    report = reports.setdefault((name, date), {"report": name, "date": date, "rows": None, "message": None})
    report.update(update, updated_at=_now())
    return web.json_response(report, status=201 if created else 200)


def make_app(token: str | None = None, *, report_retry_after: int = REPORT_RETRY_AFTER) -> web.Application:
    """The batch API. With a ``token``, ``/v1/`` requests must send it as a bearer token.

    ``report_retry_after`` is the ``Retry-After`` (seconds) of a running report's 202.
    """
    app = web.Application(middlewares=[errors_and_auth], client_max_size=MAX_BODY_BYTES + 1024)
    app[RETRY_AFTER] = report_retry_after
    app[BATCHES] = {}
    app[EXPORTS] = {}
    app[REPORTS] = {}
    if token:
        app[TOKEN] = token
    app.router.add_get("/healthz", health)
    app.router.add_get("/v1/batches", list_batches)
    app.router.add_get("/v1/batches/{batch_id}/status", batch_status)
    app.router.add_put("/v1/batches/{batch_id}", put_batch)
    app.router.add_delete("/v1/batches/{batch_id}", delete_batch)
    app.router.add_get("/v1/exports/{export_id}", get_export)  # also answers HEAD
    app.router.add_put("/v1/exports/{export_id}", put_export)
    app.router.add_delete("/v1/exports/{export_id}", delete_export)
    app.router.add_post("/v1/reports/query", query_report)
    app.router.add_put("/v1/reports/{report}/{date}", put_report)
    return app


def main(argv: Sequence[str] | None = None) -> None:
    """Serve the API until interrupted (SIGINT/SIGTERM)."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--host", default="127.0.0.1", help="address to listen on (default 127.0.0.1)")
    parser.add_argument("--port", type=int, default=8000, help="port to listen on (default 8000)")
    parser.add_argument(
        "--token",
        default=os.environ.get(TOKEN_ENV) or None,
        help=f"require this bearer token on /v1/ (default: ${TOKEN_ENV}, else no auth)",
    )
    args = parser.parse_args(argv)
    auth = "bearer token required" if args.token else "no auth"
    print(f"batch API on http://{args.host}:{args.port} ({auth})", flush=True)
    web.run_app(make_app(args.token), host=args.host, port=args.port, print=functools.partial(print, flush=True))


if __name__ == "__main__":
    main()
