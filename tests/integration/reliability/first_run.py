"""Run one serialized trigger to its event in this fresh process, the way a triggerer would,
under asyncio debug with a slow-callback threshold; print the outcome as JSON.

Usage: ``python -m tests.integration.reliability.first_run '<json [classpath, kwargs, conn_id|null]>'``.
The trigger module is imported first (the triggerer imports the class before running it) and
the connection lookup is warmed; everything ``run()`` does happens inside the watch.
"""

from __future__ import annotations

import asyncio
import importlib
import json
import sys

from airflow_deferrable_kit.connections import get_connection
from airflow_deferrable_kit.testing import run_trigger, watch_blocking


async def main(classpath: str, kwargs: dict[str, object], conn_id: str | None) -> dict[str, object]:
    module, _, name = classpath.rpartition(".")
    trigger_class = getattr(importlib.import_module(module), name)
    if conn_id is not None:
        await get_connection(conn_id)
    trigger = trigger_class(**kwargs)
    with watch_blocking(0.05) as blocked:
        event = await run_trigger(trigger, timeout=60)
    return {"payload": event.payload, "blocked": blocked, "modules": sorted(sys.modules)}


if __name__ == "__main__":
    classpath, kwargs, conn_id = json.loads(sys.argv[1])
    print("RESULT " + json.dumps(asyncio.run(main(classpath, kwargs, conn_id)), default=str))
