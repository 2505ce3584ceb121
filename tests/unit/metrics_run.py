"""Run a few real waits to their events in this fresh process and print what they ended with.

Usage: ``python -m tests.unit.metrics_run [--slow-resolver] [--core-only]``, with Airflow's ``[metrics]``
options in the environment. Airflow reads them when it is imported, which is why the metrics
tests run this in a subprocess instead of changing the configuration of their own process. The
waits run in a forked child, as a triggerer's TriggerRunner does.

The waits: the scripted sample trigger (a transient error then success; a fatal error; a
deadline already passed), a sample trigger leasing a shared client until it is cancelled, a
DateTime wait, and an HTTP wait against an aiohttp server in this process that answers 503 once,
then 200. Everything from the first metric on runs under the blocking watch; with
``--slow-resolver`` every host-name lookup takes 0.3 s, as a slow DNS server would make it.
With ``--core-only``, ``[metrics] statsd_on`` is turned on only after Airflow was imported, so
only the core's metrics layer (which the triggerer sets up itself) has a backend.
"""

from __future__ import annotations

import asyncio
import json
import os
import socket
import sys
import time
from typing import Any

from aiohttp import web

from airflow_deferrable_kit import _metrics, leases
from airflow_deferrable_kit.connections import get_connection
from airflow_deferrable_kit.testing import run_trigger, watch_blocking
from airflow_deferrable_kit.triggers.base import deadline_after
from airflow_deferrable_kit.triggers.http import HttpBatchReadyTrigger
from airflow_deferrable_kit.triggers.temporal import DateTimeTrigger
from tests.unit.sample import LeasingTrigger, ScriptedTrigger, script

SLOW_LOOKUP = 0.3


def slow_resolver() -> None:
    real = socket.getaddrinfo

    def getaddrinfo(*args: Any, **kwargs: Any) -> Any:
        time.sleep(SLOW_LOOKUP)
        return real(*args, **kwargs)

    socket.getaddrinfo = getaddrinfo  # type: ignore[assignment]


def initialize_like_the_triggerer() -> None:
    """What ``airflow triggerer`` does before it forks its TriggerRunner: set up the core's metrics."""
    from airflow.configuration import conf
    from airflow.observability.metrics import stats_utils
    from airflow.observability.stats import Stats

    try:  # Airflow 3.3
        Stats.initialize(
            factory=stats_utils.get_stats_factory(),
            export_legacy_names=conf.getboolean("metrics", "legacy_names_on"),
        )
    except TypeError:  # Airflow 3.2
        Stats.initialize(factory=stats_utils.get_stats_factory(Stats))


async def http_server() -> tuple[web.AppRunner, int]:
    answers = iter([503])

    async def status(request: web.Request) -> web.Response:
        return web.json_response({"state": "ready"}, status=next(answers, 200))

    app = web.Application()
    app.router.add_get("/v1/status", status)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    return runner, runner.addresses[0][1]


async def main() -> dict[str, Any]:
    runner, port = await http_server()
    os.environ["AIRFLOW_CONN_METRICS_API"] = json.dumps({"conn_type": "http", "host": "127.0.0.1", "port": port})
    waits = {
        "recovers": ScriptedTrigger(script=script("recovers", "none", "transient", "found"), poll_interval=0.01),
        "fatal": ScriptedTrigger(script=script("fatal", "fatal"), poll_interval=0.01),
        "late": ScriptedTrigger(script=script("late", "none"), deadline=deadline_after(-1)),
        "datetime": DateTimeTrigger(target_time=deadline_after(0.05)),
        "http": HttpBatchReadyTrigger(http_conn_id="metrics_api", endpoint="v1/status", poll_interval=0.01),
    }
    await get_connection("metrics_api")  # Airflow imports its lookup machinery once per process
    with watch_blocking(0.05) as blocked:
        statuses = {name: (await run_trigger(trigger, timeout=30)).payload["status"] for name, trigger in waits.items()}
        leasing = asyncio.ensure_future(run_trigger(LeasingTrigger(key="k1", poll_interval=0.01), timeout=30))
        for _ in range(1000):  # until it holds its client (bounded)
            if leases.held_keys():
                break
            await asyncio.sleep(0.01)
        leasing.cancel()
        await asyncio.gather(leasing, return_exceptions=True)
    await runner.cleanup()
    return {"statuses": statuses, "blocked": blocked}


def child(slow: bool) -> None:
    if slow:
        slow_resolver()
    result = asyncio.run(main())
    _metrics.wait_until_ready()  # off the loop: what was kept while the backend was built is sent
    result["metrics"] = _metrics._sender._state
    print("RESULT " + json.dumps(result), flush=True)


if __name__ == "__main__":
    if "--core-only" in sys.argv:  # the Task SDK's metrics were set up while [metrics] said off
        os.environ["AIRFLOW__METRICS__STATSD_ON"] = "True"
    initialize_like_the_triggerer()
    # Like the triggerer, whose TriggerRunner is forked from a process that imported Airflow (and
    # may have built its metrics backend there): Airflow drops the backend in the fork and builds
    # a new one on the child's first metric, which happens inside the child's event loop.
    pid = os.fork()
    if pid == 0:
        try:
            child("--slow-resolver" in sys.argv)
        finally:
            os._exit(0)
    _, status = os.waitpid(pid, 0)
    sys.exit(os.waitstatus_to_exitcode(status))
