"""HTTP event watchers: N watched assets in one triggerer loop, the kit's and the official trigger.

Side by side in one run, each case in a fresh process (so memory and sockets are its own), the
same local aiohttp server (its own process) for all:

* ``kit``: the kit's ``HttpBatchReadyEventTrigger`` (shared polls, edges, watermarks);
* ``official``: ``HttpEventTrigger`` of apache-airflow-providers-http (>= 6.3), whose condition
  is the dotted path of an async response check (``benchmarks/http_event_checks.py``).

Two layouts: ``one`` endpoint for every watcher (``GET /items/<N>``, one document of N items,
watcher ``i`` waiting for item ``i`` to be ready), and ``distinct`` endpoints (watcher ``i``
polls ``GET /state/<i>``). Every answer is a 200; the flip turns every item ready.

Each case runs the way Airflow 3.3's triggerer runs ``AssetWatcher`` triggers (``WatcherHarness``:
Airflow's ``SharedStreamManager`` in ack mode, an in-memory asset state store per asset), each
trigger rebuilt from its serialized kwargs. Phases: start -> one poll interval -> ``--hold`` s
of steady watching -> flip -> until each watcher fired -> ``--after`` s more. A watcher that
exits is started again once a second, as the triggerer's trigger loop does.

* ``requests_per_round``: requests the server answered during the hold / rounds in the hold.
* ``cpu_ms_per_round`` / ``cpu_core_pct``: CPU (user+sys) of the watching process in the hold.
* ``rss_per_watcher_kb``: (RSS after the hold - RSS before any watcher) / N.
* ``sockets_max``: socket fds of the watching process (sampled every 0.25 s, hold and events).
* ``lag_max_ms``: worst lateness of a 10 ms ticker in the hold.
* ``events`` / ``latency_*``: watchers that fired, and from the flip to each first event.
* ``events_after``: events fired in the ``--after`` s once every watcher had fired (the
  condition stays true): the kit fires once per transition; a watcher that exits after its
  event and is started again fires again.

Usage (the four cases and the ratios)::

    PYTHONPATH=. python -m benchmarks.http_event_watchers --n 1000 --poll-interval 5 --hold 20
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import logging
import os
import statistics
import subprocess
import sys
import time
import urllib.request
from typing import Any

from benchmarks.event_watchers import cpu, rss_kb
from benchmarks.triggerer_load import ROOT, bench_server, socket_count

CASES = ("kit-one", "official-one", "kit-distinct", "official-distinct")
#: How often an exited watcher is started again (the triggerer's trigger loop runs about once a second).
RESTART_EVERY = 1.0


def server_requests(url: str) -> int:
    with urllib.request.urlopen(f"{url}/__requests__", timeout=10) as response:
        return int(json.load(response)["requests"])


def flip(url: str) -> None:
    with urllib.request.urlopen(urllib.request.Request(f"{url}/flip", method="POST"), timeout=10):
        pass


def build(case: str, n: int, interval: float) -> list[Any]:
    """The N watchers of ``case``, each rebuilt from its serialized kwargs as the triggerer does."""
    impl, layout = case.split("-")
    made: list[Any] = []
    for i in range(n):
        endpoint = f"items/{n}" if layout == "one" else f"state/{i}"
        if impl == "kit":
            from airflow_deferrable_kit.triggers.http_events import HttpBatchReadyEventTrigger

            path = f"items.i{i:05d}" if layout == "one" else "state"
            made.append(
                HttpBatchReadyEventTrigger(
                    http_conn_id="bench_http",
                    endpoint=endpoint,
                    poll_interval=interval,
                    success=[{"path": path, "equals": "ready"}],
                )
            )
        else:
            from airflow.providers.http.triggers.http import HttpEventTrigger

            check = f"item_{i:05d}" if layout == "one" else "ready"
            made.append(
                HttpEventTrigger(
                    http_conn_id="bench_http",
                    endpoint=endpoint,
                    poll_interval=interval,
                    response_check_path=f"benchmarks.http_event_checks.{check}",
                )
            )
    rebuilt = []
    for trigger in made:
        _, kwargs = trigger.serialize()
        rebuilt.append(type(trigger)(**kwargs))
    return rebuilt


async def run_case(case: str, n: int, interval: float, hold: float, after: float) -> dict[str, Any]:
    from airflow_deferrable_kit.testing_events import WatcherHarness

    with bench_server("http") as (url, port, _):
        os.environ["AIRFLOW_CONN_BENCH_HTTP"] = json.dumps(
            {"conn_type": "http", "host": "127.0.0.1", "port": port, "schema": "http"}
        )
        loop = asyncio.get_running_loop()
        meter = {"lag": 0.0, "lag_on": False, "sockets": 0, "sockets_on": False}

        async def ticker() -> None:
            while True:
                start = loop.time()
                await asyncio.sleep(0.01)
                if meter["lag_on"]:
                    meter["lag"] = max(meter["lag"], loop.time() - start - 0.01)

        async def sockets() -> None:
            while True:
                if meter["sockets_on"]:
                    meter["sockets"] = max(meter["sockets"], socket_count())
                await asyncio.sleep(0.25)

        helpers = [asyncio.ensure_future(ticker()), asyncio.ensure_future(sockets())]
        rss_before = rss_kb()
        triggers = build(case, n, interval)
        firsts: dict[int, float] = {}
        counts = [0] * n
        async with WatcherHarness() as triggerer:
            watches = {i: await triggerer.start(t, assets=(f"asset-{i}",)) for i, t in enumerate(triggers)}

            async def restarter() -> None:  # what the triggerer does with a watcher that exited
                while True:
                    await asyncio.sleep(RESTART_EVERY)
                    for i, watch in list(watches.items()):
                        if watch.task is not None and watch.task.done():
                            counts[i] += len(watch.events)
                            _, kwargs = watch.trigger.serialize()
                            watches[i] = await triggerer.start(type(watch.trigger)(**kwargs), assets=(f"asset-{i}",))

            helpers.append(asyncio.ensure_future(restarter()))
            await asyncio.sleep(interval)  # the first round: starting points, client set-up
            requests0, cpu0 = await asyncio.to_thread(server_requests, url), cpu()
            meter["lag_on"] = meter["sockets_on"] = True
            await asyncio.sleep(hold)
            cpu_s, requests = cpu() - cpu0, await asyncio.to_thread(server_requests, url) - requests0
            meter["lag_on"] = False
            rss_after = rss_kb()
            await asyncio.to_thread(flip, url)
            flipped = time.monotonic()

            def fired(i: int) -> int:
                return counts[i] + len(watches[i].events)

            while len(firsts) < n and time.monotonic() - flipped < 120:
                for i in range(n):
                    if i not in firsts and fired(i):
                        firsts[i] = time.monotonic() - flipped
                await asyncio.sleep(0.02)
            settled = sum(fired(i) for i in range(n))
            await asyncio.sleep(after)
            events_after = sum(fired(i) for i in range(n)) - settled
            meter["sockets_on"] = False
        for helper in helpers:
            helper.cancel()
    rounds = hold / interval
    latencies = sorted(firsts.values())
    return {
        "case": case,
        "watchers": n,
        "poll_interval_s": interval,
        "hold_s": hold,
        "requests_per_round": round(requests / rounds, 1),
        "cpu_ms_per_round": round(cpu_s / rounds * 1000, 1),
        "cpu_core_pct": round(cpu_s / hold * 100, 1),
        "rss_per_watcher_kb": round((rss_after - rss_before) / n, 1),
        "sockets_max": int(meter["sockets"]),
        "lag_max_ms": round(float(meter["lag"]) * 1000, 1),
        "events": len(firsts),
        "latency_p50_s": round(statistics.median(latencies), 2) if latencies else None,
        "latency_max_s": round(latencies[-1], 2) if latencies else None,
        "events_after": events_after,
        "after_s": after,
    }


def ratio(official: float, kit: float) -> str:
    return "-" if not kit else f"{official / kit:,.1f}x"


def table(results: dict[str, dict[str, Any]]) -> str:
    lines = [
        "| endpoints | trigger | requests per round | CPU per round | CPU, % of a core | RSS per watcher | "
        "sockets (max) | worst loop lag | fired (latency p50 / max) | events in the next "
        f"{results['kit-one']['after_s']:.0f} s |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for case in CASES:
        r = results[case]
        impl, layout = case.split("-")
        lines.append(
            f"| {layout} | {impl} | {r['requests_per_round']:,} | {r['cpu_ms_per_round']:,} ms | "
            f"{r['cpu_core_pct']} % | {r['rss_per_watcher_kb']} KB | {r['sockets_max']} | {r['lag_max_ms']} ms | "
            f"{r['events']:,} ({r['latency_p50_s']} s / {r['latency_max_s']} s) | {r['events_after']:,} |"
        )
    lines += ["", "| endpoints | official / kit: requests | CPU | RSS per watcher | sockets |", "|---|---|---|---|---|"]
    for layout in ("one", "distinct"):
        k, o = results[f"kit-{layout}"], results[f"official-{layout}"]
        lines.append(
            f"| {layout} | {ratio(o['requests_per_round'], k['requests_per_round'])} | "
            f"{ratio(o['cpu_ms_per_round'], k['cpu_ms_per_round'])} | "
            f"{ratio(o['rss_per_watcher_kb'], k['rss_per_watcher_kb'])} | {ratio(o['sockets_max'], k['sockets_max'])} |"
        )
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--case", choices=CASES, help="run one case in this process and print its JSON")
    parser.add_argument("--n", type=int, default=1000)
    parser.add_argument("--poll-interval", type=float, default=5.0)
    parser.add_argument("--hold", type=float, default=20.0)
    parser.add_argument("--after", type=float, default=10.0)
    args = parser.parse_args()
    if args.case:
        logging.disable(logging.WARNING)  # a thousand start lines and retries are not the measurement
        result = asyncio.run(run_case(args.case, args.n, args.poll_interval, args.hold, args.after))
        print(json.dumps(result))
        return
    results = {}
    for case in CASES:
        options = ["--n", args.n, "--poll-interval", args.poll_interval, "--hold", args.hold, "--after", args.after]
        command = [sys.executable, "-m", "benchmarks.http_event_watchers", "--case", case, *map(str, options)]
        done = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, check=False)
        if done.returncode != 0:
            raise SystemExit(f"{case} failed:\n{done.stderr[-3000:]}")
        results[case] = json.loads(done.stdout.strip().splitlines()[-1])
        print(json.dumps(results[case]), file=sys.stderr)
    print(table(results))


if __name__ == "__main__":
    with contextlib.suppress(KeyboardInterrupt):
        main()
