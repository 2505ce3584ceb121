"""Servers the load benchmark talks to, each run in its own process (never the measured one).

* ``s3``: moto's S3 WSGI app served by uvicorn through a2wsgi, so HTTP keep-alive works
  (``moto_server``'s Werkzeug server closes the connection after every response, which would
  hide connection reuse).
* ``http``: a tiny aiohttp app with one URL per wait: ``GET /ready/{i}`` answers 404 until
  ``POST /flip`` is called, then 200 ``{"state": "ready", "id": i}``. ``POST /flip`` returns the
  server time at which the condition turned true for every URL; ``POST /flip/{i}`` turns
  ``/ready/{i}`` alone ready (a steady flow of events) and returns its time. For event watchers, which poll
  an answer that is always 200: ``GET /state/{i}`` answers ``{"state": "pending"}`` until the
  flip, then ``{"state": "ready", "id": i}``; ``GET /items/{n}`` answers one document for ``n``
  items, ``{"items": {"i00000": "pending", ...}}``, each ``"ready"`` after the flip.
  For the isolation benchmark, a poisoned wait's URLs (never counted as polls):
  ``GET /poison/500`` always answers 500; ``GET /poison/slow`` answers only after an hour, so
  the wait's own request timeout ends every request it makes.

* ``jobs``: a job API for ``benchmarks/http_jobs.py``. ``POST /jobs`` creates a job and answers
  ``202`` with its ``Location`` (``/jobs/{id}``); ``POST /jobs?wait=true`` holds the request open
  until the job is done and answers ``200`` with it (a "run and wait" endpoint, the only way
  ``HttpOperator(deferrable=True)`` waits for a job). ``GET /jobs/{id}`` answers
  ``{"state": "running"}`` until ``POST /flip``, then ``{"state": "succeeded"}``. Every submit is
  counted: ``GET /__requests__`` also says ``submits``, ``polls`` and ``jobs``.

All answer ``GET /__requests__`` with the number of requests served so far (that one not
counted), so the benchmark divides CPU by the polls really made, not by the polls due.

Run ``python -m benchmarks.servers {s3|http} --port P``.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import json
import time
from typing import Any

COUNT_PATH = "/__requests__"


class CountRequests:
    """ASGI middleware: count requests, and each HTTP method's; answer ``COUNT_PATH`` with the counts.

    By method, because one S3 count mixes what a wait costs differently: ``HEAD`` (an object or a
    bucket), ``GET`` (a listing page, or an object), ``PUT`` (the benchmark's own objects).
    """

    def __init__(self, app: Any) -> None:
        self.app = app
        self.requests = 0
        self.methods: collections.Counter[str] = collections.Counter()

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] == "http" and scope["path"] == COUNT_PATH:
            body = json.dumps({"requests": self.requests, "methods": self.methods}).encode()
            headers = [(b"content-type", b"application/json")]
            await send({"type": "http.response.start", "status": 200, "headers": headers})
            await send({"type": "http.response.body", "body": body})
            return
        if scope["type"] == "http":
            self.requests += 1
            self.methods[scope["method"]] += 1
        await self.app(scope, receive, send)


def serve_s3(port: int) -> None:
    import uvicorn
    from a2wsgi import WSGIMiddleware
    from moto.moto_server.werkzeug_app import DomainDispatcherApplication, create_backend_app

    app = CountRequests(WSGIMiddleware(DomainDispatcherApplication(create_backend_app), workers=8))
    uvicorn.run(
        app, host="127.0.0.1", port=port, log_level="warning", access_log=False, timeout_keep_alive=60, lifespan="off"
    )


def serve_http(port: int) -> None:
    from aiohttp import web

    state: dict[str, Any] = {"ready_at": None, "requests": 0}
    ready_ids: dict[str, float] = {}  # URLs flipped one at a time (``POST /flip/{i}``)

    async def ready(request: web.Request) -> web.Response:
        state["requests"] += 1
        if state["ready_at"] is None and request.match_info["i"] not in ready_ids:
            return web.json_response({"state": "pending"}, status=404)
        return web.json_response({"state": "ready", "id": request.match_info["i"]})

    async def item_state(request: web.Request) -> web.Response:
        state["requests"] += 1
        if state["ready_at"] is None:
            return web.json_response({"state": "pending"})
        return web.json_response({"state": "ready", "id": request.match_info["i"]})

    documents: dict[tuple[int, bool], str] = {}

    async def items(request: web.Request) -> web.Response:
        state["requests"] += 1
        n, ready = int(request.match_info["n"]), state["ready_at"] is not None
        if (n, ready) not in documents:  # built once: the server is not what is measured
            value = "ready" if ready else "pending"
            documents[n, ready] = json.dumps({"items": {f"i{i:05d}": value for i in range(n)}})
        return web.Response(text=documents[n, ready], content_type="application/json")

    async def flip(request: web.Request) -> web.Response:
        if state["ready_at"] is None:
            state["ready_at"] = time.time()
        return web.json_response({"ready_at": state["ready_at"]})

    async def flip_one(request: web.Request) -> web.Response:
        at = ready_ids.setdefault(request.match_info["i"], time.time())
        return web.json_response({"ready_at": at})

    async def count(request: web.Request) -> web.Response:
        return web.json_response({"requests": state["requests"]})

    async def poison_500(request: web.Request) -> web.Response:
        return web.json_response({"error": "poisoned"}, status=500)

    async def poison_slow(request: web.Request) -> web.Response:
        await asyncio.sleep(3600)
        return web.json_response({"state": "ready"})

    app = web.Application()
    app.router.add_get(COUNT_PATH, count)
    app.router.add_get("/ready/{i}", ready)
    app.router.add_get("/state/{i}", item_state)
    app.router.add_get("/items/{n}", items)
    app.router.add_post("/flip", flip)
    app.router.add_post("/flip/{i}", flip_one)
    app.router.add_get("/poison/500", poison_500)
    app.router.add_get("/poison/slow", poison_slow)
    web.run_app(app, host="127.0.0.1", port=port, print=None, access_log=None, keepalive_timeout=75)


def serve_jobs(port: int) -> None:
    from aiohttp import web

    state: dict[str, Any] = {"submits": 0, "polls": 0}
    jobs: dict[str, str] = {}
    done = asyncio.Event()

    async def submit(request: web.Request) -> web.Response:
        state["submits"] += 1
        job = f"j{len(jobs) + 1}"
        jobs[job] = "running"
        if request.query.get("wait") == "true":  # answered when the job is done
            await done.wait()
            return web.json_response({"id": job, "state": "succeeded"})
        return web.json_response({"id": job}, status=202, headers={"Location": f"/jobs/{job}"})

    async def status(request: web.Request) -> web.Response:
        state["polls"] += 1
        job = request.match_info["id"]
        if job not in jobs:
            return web.json_response({"error": f"no job {job}"}, status=404)
        return web.json_response({"id": job, "state": "succeeded" if done.is_set() else "running"})

    async def flip(request: web.Request) -> web.Response:
        done.set()
        return web.json_response({"ready_at": time.time()})

    async def count(request: web.Request) -> web.Response:
        served = state["submits"] + state["polls"]
        return web.json_response({"requests": served, **state, "jobs": len(jobs)})

    app = web.Application()
    app.router.add_get(COUNT_PATH, count)
    app.router.add_post("/jobs", submit)
    app.router.add_get("/jobs/{id}", status)
    app.router.add_post("/flip", flip)
    web.run_app(app, host="127.0.0.1", port=port, print=None, access_log=None, keepalive_timeout=75)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("server", choices=["s3", "http", "jobs"])
    parser.add_argument("--port", type=int, required=True)
    args = parser.parse_args()
    {"s3": serve_s3, "http": serve_http, "jobs": serve_jobs}[args.server](args.port)


if __name__ == "__main__":
    main()
