"""A real job API on 127.0.0.1 (aiohttp), answering every shape the job operator understands.

``POST /jobs`` submits (deduplicated by ``Idempotency-Key`` when ``honour_keys``), answering as
``shape`` says: ``location`` / ``operation`` / ``azure`` / ``content`` (202 and that header),
``id`` (202 and ``{"id": ...}`` only), ``sync`` (200 with the result), ``pending`` (200 with a
running state, the Databricks statement shape). ``GET /jobs/<id>`` answers the job's state:
``running`` for ``runs_for`` polls, then ``succeeded`` (or ``failed`` with an error message when
``fails``); with ``see_other`` a finished job answers ``303`` to its result. ``GET
/jobs/<id>/result`` pages ``items`` (``page_size`` a page) with a ``next`` link in the body, a
``Link`` header, or a ``cursor`` (``paging``). ``DELETE /jobs/<id>`` and ``POST
/jobs/<id>/cancel`` cancel. Every submit and cancel is counted: the tests' evidence.
"""

from __future__ import annotations

import itertools
import json
import threading
from dataclasses import dataclass, field
from typing import Any

from aiohttp import web

from tests.integration.http.conftest import Seen, Server, reply


@dataclass
class Job:
    id: str
    key: str | None
    body: Any
    polls: int = 0
    state: str = "running"
    #: This job's own behaviour, from its submitted body (``{"runs_for": 3, "fails": true,
    #: "refuse_polls": 1}``), else the API's: one server can run jobs of every kind at once.
    runs_for: int | None = None
    fails: bool | None = None
    refuse_polls: int = 0


@dataclass
class JobApi:
    """The API's behaviour (set before or during a test) and what it saw."""

    shape: str = "location"
    runs_for: int = 1
    fails: bool = False
    see_other: bool = False
    honour_keys: bool = True
    retry_after: str | None = None
    items: int = 5
    page_size: int = 2
    paging: str = "next"  # next | link | cursor
    status_code_while_running: int = 200
    jobs: dict[str, Job] = field(default_factory=dict)
    submits: int = 0
    created: int = 0
    cancels: list[tuple[str, str]] = field(default_factory=list)
    keys: list[str | None] = field(default_factory=list)
    server: Server | None = None

    def __post_init__(self) -> None:
        self._ids = itertools.count(1)
        self._lock = threading.Lock()

    @property
    def url(self) -> str:
        assert self.server is not None
        return self.server.url

    def submits_of(self, marker: str) -> int:
        """Submit requests whose body holds ``marker`` (one scenario of several on one server)."""
        assert self.server is not None
        return sum(1 for seen in self.server.requests if seen.method == "POST" and marker.encode() in seen.body
                   and seen.path == "/jobs")  # fmt: skip

    def job_of(self, marker: str) -> Job:
        return next(job for job in self.jobs.values() if marker.encode() in (job.body or b""))

    def finish(self, marker: str, *, refused: int = 0) -> None:
        """End the job of ``marker`` at its next poll after ``refused`` polls answered 403 (the
        test decides when a job ends, not a count of polls made while Airflow was starting)."""
        with self._lock:
            job = self.job_of(marker)
            job.refuse_polls = refused
            job.runs_for = job.polls

    def handler(self, seen: Seen) -> web.StreamResponse:
        parts = [part for part in seen.path.split("/") if part]
        with self._lock:
            if parts == ["jobs"] and seen.method == "POST":
                return self._submit(seen)
            if len(parts) >= 2 and parts[0] == "jobs" and parts[1] in self.jobs:
                job = self.jobs[parts[1]]
                if (len(parts) == 2 and seen.method == "DELETE") or parts[2:] == ["cancel"]:
                    self.cancels.append((seen.method, job.id))
                    job.state = "cancelled"
                    return reply(202, {"id": job.id, "state": "cancelled"})
                if len(parts) == 2:
                    return self._status(job)
                if parts[2:] == ["result"]:
                    return self._result(job, seen)
        return reply(404, {"error": f"no such resource {seen.path}"})

    def _submit(self, seen: Seen) -> web.StreamResponse:
        self.submits += 1
        key = seen.headers.get("Idempotency-Key")
        self.keys.append(key)
        job = next((job for job in self.jobs.values() if key and job.key == key), None) if self.honour_keys else None
        if job is None:
            self.created += 1
            job = Job(id=f"j{next(self._ids)}", key=key, body=seen.body)
            try:
                asked = json.loads(seen.body) if seen.body else {}
            except ValueError:
                asked = {}
            if isinstance(asked, dict):
                job.runs_for = asked.get("runs_for")
                job.fails = asked.get("fails")
                job.refuse_polls = int(asked.get("refuse_polls", 0))
            self.jobs[job.id] = job
        headers = {"Retry-After": self.retry_after} if self.retry_after else {}
        link = f"/jobs/{job.id}"
        if self.shape == "sync":
            job.state = "succeeded"
            return reply(200, {"id": job.id, "state": "succeeded", "answer": 42})
        if self.shape == "pending":
            return reply(200, {"statement_id": job.id, "status": {"state": "PENDING"}}, headers=headers)
        if self.shape == "id":
            return reply(202, {"id": job.id}, headers=headers)
        header = {
            "location": "Location",
            "operation": "Operation-Location",
            "azure": "Azure-AsyncOperation",
            "content": "Content-Location",
        }[self.shape]
        absolute = self.shape in ("operation", "azure")
        return reply(202, {"id": job.id}, headers={**headers, header: f"{self.url}{link}" if absolute else link})

    def _status(self, job: Job) -> web.StreamResponse:
        if job.refuse_polls > 0:  # the wait fails (403) while the job runs on
            job.refuse_polls -= 1
            return reply(403, {"error": "not now"})
        if job.state == "running":
            job.polls += 1
            if job.polls > (self.runs_for if job.runs_for is None else job.runs_for):
                job.state = "failed" if (self.fails if job.fails is None else job.fails) else "succeeded"
        body: dict[str, Any] = {"id": job.id, "state": job.state, "statement_id": job.id}
        body["status"] = {"state": {"running": "RUNNING", "succeeded": "SUCCEEDED"}.get(job.state, job.state.upper())}
        if job.state == "failed":
            body["error"] = {"message": "division by zero in step 3", "code": "E42"}
            body["status"]["error"] = body["error"]
        if job.state == "succeeded":
            body["result_url"] = f"/jobs/{job.id}/result"
            if self.see_other:
                return web.Response(status=303, headers={"Location": f"/jobs/{job.id}/result"})
        status = self.status_code_while_running if job.state == "running" else 200
        return reply(status, body)

    def _result(self, job: Job, seen: Seen) -> web.StreamResponse:
        start = int((seen.query.get("cursor") or seen.query.get("page") or ["0"])[0])
        items = [{"n": n} for n in range(start, min(start + self.page_size, self.items))]
        after = start + self.page_size
        body: dict[str, Any] = {"items": items}
        headers: dict[str, str] = {}
        if after < self.items:
            if self.paging == "next":
                body["next"] = f"/jobs/{job.id}/result?page={after}"
            elif self.paging == "link":
                headers["Link"] = f'<{self.url}/jobs/{job.id}/result?page={after}>; rel="next"'
            else:
                body["cursor"] = str(after)
        return reply(200, body, headers=headers)


def start(serve: Any, **behaviour: Any) -> JobApi:
    """A job API with ``behaviour``, served by the ``serve`` fixture (stopped after the test)."""
    api = JobApi(**behaviour)
    api.server = serve(api.handler)
    return api
