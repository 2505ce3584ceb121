"""The reliability HTTP API: ``<anything>/ready`` answers ``{"state": "ready"}``, the rest pending.

Importable (``handler``) for the in-process server the other reliability tests inspect, and
runnable as ``python -m tests.integration.reliability.http_api <port>`` for a server in a process of its
own: a loop-blocking check must not count the time the loop waited for the GIL held by a test
server thread that answers fifty pollers at once, which no real triggerer shares its process
with. The process serves until its standard input closes.
"""

from __future__ import annotations

import sys

from aiohttp import web

from tests.integration.http.conftest import Seen, Server


def handler(seen: Seen) -> web.StreamResponse:
    state = "ready" if seen.path.endswith("/ready") else "pending"
    return web.json_response({"state": state, "rows": 7})


if __name__ == "__main__":
    server = Server(handler, port=int(sys.argv[1])).start()
    try:
        sys.stdin.read()  # until the parent closes the pipe (or exits)
    finally:
        server.stop()
