"""HTTP jobs: N jobs on one job API, waited for by the kit and by the official operator, through a triggerer kill.

Three cases, each in processes of its own (so sockets and CPU are the case's), against one job
API in a process of its own (``python -m benchmarks.servers jobs``, which counts every submit):

* ``kit-job``: ``HttpJobOperator``. The worker step (here, in the harness) submits each job once
  (``POST /jobs`` -> ``202`` + ``Location``) and defers; ``HttpJobTrigger`` polls
  ``GET /jobs/{id}`` until the job succeeded.
* ``kit-ready``: the kit's HTTP readiness wait (``HttpBatchReadyTrigger``) on the same status
  URLs, the jobs submitted once by the harness: what the job trigger costs beyond a plain wait.
* ``official``: ``HttpOperator(deferrable=True)`` of apache-airflow-providers-http (the
  ``bench`` extra). Its ``HttpTrigger`` sends the request from the triggerer and holds it until
  the answer, so it waits for a job only on a "run and wait" endpoint (``POST /jobs?wait=true``,
  answered when the job is done): one open request per job.

Each case: the worker step (every operator's ``execute`` until it defers; its trigger's
serialized kwargs) -> triggerer A, a child process, builds every trigger from its kwargs and
runs it (``run()`` until its first event) -> one poll interval of warm-up -> ``--hold`` s
measured -> SIGKILL of triggerer A mid-wait -> triggerer B from the same kwargs -> flip (every
job done) -> until every trigger fired -> the server's counts.

* ``submits``: ``POST /jobs`` the server received over the whole case (N is one per job);
  ``submits_before_kill``: before triggerer A was killed.
* ``cpu_ms_per_poll``: triggerer A's CPU (user+sys) in the hold / the status polls the server
  answered in it (the kit's cases; the official trigger makes none while its requests are open).
  ``cpu_core_pct``: the same CPU as % of one core.
* ``sockets_max``: socket fds of triggerer A, sampled every 0.25 s in the hold.
* ``events``: triggers that fired in triggerer B.

Each case runs through :func:`benchmarks.quiet.quiet_cell` (the benchmark lock, a quiet
machine); ``--allow-busy`` measures anyway and marks the result ``busy``. The triggers run in a
plain asyncio loop, each as a task, not in Airflow's ``TriggerRunner`` (``triggerer_load.py``
measures that runner's own cost).

Usage (the three cases and a table)::

    PYTHONPATH=. python -m benchmarks.http_jobs --n 1000 --poll-interval 5 --hold 20
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import importlib
import json
import logging
import os
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path
from types import SimpleNamespace
from typing import Any

from benchmarks.event_watchers import cpu
from benchmarks.quiet import MachineBusy, quiet_cell
from benchmarks.triggerer_load import ROOT, bench_server, socket_count

CASES = ("kit-job", "kit-ready", "official")
CONN_ID = "bench_jobs"
SUCCESS = [{"path": "state", "equals": "succeeded"}]
RUNNING = [{"path": "state", "equals": "running"}]
#: Triggerer A prints this line (then JSON) once its hold is measured; the harness then kills it.
HOLD_PREFIX = "HOLD "


def counts(url: str) -> dict[str, int]:
    with urllib.request.urlopen(f"{url}/__requests__", timeout=10) as response:
        return {key: int(value) for key, value in json.load(response).items()}


def flip(url: str) -> None:
    with urllib.request.urlopen(urllib.request.Request(f"{url}/flip", method="POST"), timeout=10):
        pass


def connection_env(port: int) -> dict[str, str]:
    return {f"AIRFLOW_CONN_{CONN_ID.upper()}": json.dumps({"conn_type": "http", "host": "127.0.0.1", "port": port})}


def quiet_logs() -> None:
    """Errors only: a thousand start lines and warnings are not the measurement (Airflow logs
    through structlog, the kit through logging)."""
    import structlog

    logging.disable(logging.WARNING)
    structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(logging.ERROR))


# -------------------------------------------------------------------------- the worker step
class _Store:
    """The task state store as a task sees it (``get`` / ``set``), in memory."""

    def __init__(self) -> None:
        self.values: dict[str, Any] = {}

    def get(self, key: str, default: Any = None) -> Any:
        return self.values.get(key, default)

    def set(self, key: str, value: Any, **_: Any) -> None:
        self.values[key] = value


def _context(task: Any) -> dict[str, Any]:
    from airflow_deferrable_kit.testing import make_context

    ti = SimpleNamespace(dag_id="bench", run_id="r1", task_id=task.task_id, map_index=-1, try_number=1)
    return make_context(task, ti=ti, task_state_store=_Store())


def _deferred(task: Any) -> tuple[str, dict[str, Any]]:
    """``task.execute`` until it defers: the trigger's classpath and kwargs, as stored."""
    from airflow.sdk.exceptions import TaskDeferred

    try:
        task.execute(_context(task))
    except TaskDeferred as deferred:
        classpath, kwargs = deferred.trigger.serialize()
        return classpath, json.loads(json.dumps(kwargs, default=str))
    raise RuntimeError(f"{task.task_id} did not defer")


def worker_step(case: str, n: int, interval: float, url: str) -> list[tuple[str, dict[str, Any]]]:
    """What the workers do for ``case``: the N triggers they defer to."""
    made: list[tuple[str, dict[str, Any]]] = []
    if case == "kit-job":
        from airflow_deferrable_kit.operators.http import HttpJobOperator

        for i in range(n):
            task = HttpJobOperator(
                task_id=f"job_{i}", http_conn_id=CONN_ID, endpoint="jobs", data={"n": i}, success=SUCCESS,
                running=RUNNING, deferrable=True, poll_interval=interval, timeout=3600,
            )  # fmt: skip
            made.append(_deferred(task))
    elif case == "kit-ready":
        from airflow_deferrable_kit.sensors.http import HttpBatchReadySensor

        for i in range(n):
            request = urllib.request.Request(f"{url}/jobs", data=json.dumps({"n": i}).encode(), method="POST")
            with urllib.request.urlopen(request, timeout=10) as response:  # the submit, once, as a worker's
                job = json.load(response)["id"]
            sensor = HttpBatchReadySensor(
                task_id=f"wait_{i}", http_conn_id=CONN_ID, endpoint=f"jobs/{job}", success=SUCCESS, retry=RUNNING,
                deferrable=True, poke_interval=interval, timeout=3600, check_before_defer=False,
            )  # fmt: skip
            made.append(_deferred(sensor))
    else:
        from airflow.providers.http.operators.http import HttpOperator

        for i in range(n):
            task = HttpOperator(
                task_id=f"job_{i}", http_conn_id=CONN_ID, endpoint="jobs?wait=true", method="POST",
                data=json.dumps({"n": i}), headers={"Content-Type": "application/json"}, deferrable=True,
            )  # fmt: skip
            made.append(_deferred(task))
    return made


# ------------------------------------------------------------------------------ triggerers
async def run_triggerer(specs: list[tuple[str, dict[str, Any]]], url: str, interval: float, hold: float) -> None:
    """A triggerer: every trigger built from its kwargs and run as a task until its first event.

    With ``hold`` > 0 (triggerer A): measure one hold, print it, and wait to be killed. With
    ``hold`` = 0 (triggerer B): print how many fired, once all did or a minute after the flip.
    """
    built = []
    for classpath, kwargs in specs:
        module, _, name = classpath.rpartition(".")
        built.append(getattr(importlib.import_module(module), name)(**kwargs))
    fired: list[Any] = []

    async def first_event(trigger: Any) -> None:
        async for event in trigger.run():
            fired.append(event)
            break
        await trigger.cleanup()

    tasks = [asyncio.ensure_future(first_event(trigger)) for trigger in built]
    if hold > 0:
        await asyncio.sleep(interval)  # the first round: sessions, connections
        sockets = 0

        async def sample() -> None:
            nonlocal sockets
            while True:
                sockets = max(sockets, socket_count())
                await asyncio.sleep(0.25)

        sampler = asyncio.ensure_future(sample())
        before, cpu0 = await asyncio.to_thread(counts, url), cpu()
        await asyncio.sleep(hold)
        cpu_s, after = cpu() - cpu0, await asyncio.to_thread(counts, url)
        sampler.cancel()
        polls = after["polls"] - before["polls"]
        figures = {
            "polls_in_hold": polls,
            "cpu_ms_per_poll": round(cpu_s / polls * 1000, 3) if polls else None,
            "cpu_core_pct": round(cpu_s / hold * 100, 1),
            "sockets_max": sockets,
            "fired_before_kill": len(fired),
        }
        print(HOLD_PREFIX + json.dumps(figures), flush=True)
        await asyncio.sleep(3600)  # killed by the harness, mid-wait
    flipped = time.monotonic()
    await asyncio.to_thread(flip, url)
    await asyncio.wait(tasks, timeout=60)
    print(json.dumps({"events": len(fired), "events_s": round(time.monotonic() - flipped, 2)}), flush=True)


def start_triggerer(kwargs_file: Path, url: str, port: int, interval: float, hold: float) -> subprocess.Popen[str]:
    command = [sys.executable, "-m", "benchmarks.http_jobs", "--triggerer", str(kwargs_file), "--url", url]
    command += ["--poll-interval", str(interval), "--hold", str(hold)]
    env = {**os.environ, **connection_env(port), "PYTHONPATH": str(ROOT)}
    return subprocess.Popen(command, cwd=ROOT, env=env, stdout=subprocess.PIPE, text=True, start_new_session=True)


def run_case(case: str, n: int, interval: float, hold: float) -> dict[str, Any]:
    """One case, start to end: the worker step, triggerer A killed mid-wait, triggerer B."""
    with bench_server("jobs") as (url, port, _), tempfile.TemporaryDirectory() as folder:
        os.environ.update(connection_env(port))
        kwargs_file = Path(folder) / "triggers.json"
        kwargs_file.write_text(json.dumps(worker_step(case, n, interval, url)))
        first = start_triggerer(kwargs_file, url, port, interval, hold)
        assert first.stdout is not None
        line = ""
        while not line.startswith(HOLD_PREFIX):  # past any log line
            line = first.stdout.readline()
            if not line:
                os.killpg(first.pid, signal.SIGKILL)
                raise RuntimeError(f"{case}: triggerer A ended before its hold was measured")
        result: dict[str, Any] = json.loads(line.removeprefix(HOLD_PREFIX))
        result["submits_before_kill"] = counts(url)["submits"]
        os.killpg(first.pid, signal.SIGKILL)  # mid-wait: no cleanup, no on_kill
        first.wait(30)
        second = start_triggerer(kwargs_file, url, port, interval, 0)
        out, _ = second.communicate(timeout=600)
        result.update(json.loads(next(line for line in reversed(out.splitlines()) if line.startswith('{"events"'))))
        served = counts(url)
    return {"case": case, "jobs": n, "poll_interval_s": interval, "hold_s": hold, **result,
            "submits": served["submits"], "jobs_created": served["jobs"]}  # fmt: skip


def table(results: dict[str, dict[str, Any]]) -> str:
    lines = [
        "| case | submits (N jobs, one triggerer kill) | CPU per poll | CPU, % of a core | sockets (max) | fired |",
        "|---|---|---|---|---|---|",
    ]
    for case, r in results.items():
        per_poll = "-" if r["cpu_ms_per_poll"] is None else f"{r['cpu_ms_per_poll']} ms"
        busy = " (busy machine)" if r.get("busy") else ""
        lines.append(
            f"| {case}{busy} | {r['submits']:,} ({r['submits_before_kill']:,} before the kill) | {per_poll} | "
            f"{r['cpu_core_pct']} % | {r['sockets_max']:,} | {r['events']:,} of {r['jobs']:,} |"
        )
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--case", choices=CASES, action="append", help="the cases to run (default: all)")
    parser.add_argument("--n", type=int, default=1000)
    parser.add_argument("--poll-interval", type=float, default=5.0)
    parser.add_argument("--hold", type=float, default=20.0)
    parser.add_argument("--patience", type=float, default=600.0, help="seconds to wait for a quiet machine")
    parser.add_argument("--allow-busy", action="store_true", help="run on a busy machine (the result says so)")
    parser.add_argument("--triggerer", type=Path, help=argparse.SUPPRESS)  # a triggerer process of a case
    parser.add_argument("--url", help=argparse.SUPPRESS)
    args = parser.parse_args()
    quiet_logs()
    if args.triggerer:
        specs = json.loads(args.triggerer.read_text())
        asyncio.run(run_triggerer(specs, args.url, args.poll_interval, args.hold))
        return
    if args.n < 1 or args.poll_interval <= 0 or args.hold <= 0:
        parser.error("--n, --poll-interval and --hold must be positive")
    results = {}
    for case in args.case or CASES:
        try:
            with quiet_cell(patience=args.patience, allow_busy=args.allow_busy) as machine:
                results[case] = {**run_case(case, args.n, args.poll_interval, args.hold), **machine}
        except MachineBusy as busy:
            raise SystemExit(f"{case}: refused, no figure taken: {busy}") from None
        print(json.dumps(results[case]), file=sys.stderr)
    print(table(results))


if __name__ == "__main__":
    with contextlib.suppress(KeyboardInterrupt):
        main()
