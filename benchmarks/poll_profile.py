"""Where a poll's CPU goes: the stacks sampled during a hold (``triggerer_load --profile-hold``), by family.

One HTTP poll of the kit and of the official ``HttpSensorTrigger`` spend their time in different
places: the kit sends each request on a kept-alive socket of one shared session, the official
trigger builds a session, a connector and a TCP connection per poll. This sums the samples of a
profiled hold into families (connect, request building, the socket write, the response, the
kit's own code, Airflow's runner, ...), each stack counted once, in the first family that
claims it, and leaves out the samples of the loop asleep in ``epoll_wait``.

    PYTHONPATH=. python -m benchmarks.triggerer_load --kind http --impl kit --n 1000 \\
        --poll-interval 5 --hold 60 --profile-hold /tmp/kit.folded
    PYTHONPATH=. python benchmarks/poll_profile.py /tmp/kit.folded /tmp/official.folded
"""

from __future__ import annotations

import argparse
import collections
import json
from collections.abc import Callable
from pathlib import Path

#: (family, does this stack belong to it): the first family that claims a stack gets its samples.
Rule = tuple[str, Callable[[str, str], bool]]
ASLEEP = "the loop asleep in epoll_wait"
FAMILIES: list[Rule] = [
    (ASLEEP, lambda stack, leaf: "EpollSelector.select" in leaf),
    ("the benchmark's own sampling", lambda stack, leaf: "triggerer_load.py" in leaf or "socket_count" in stack),
    (
        "session and connector built per poll",
        lambda stack, leaf: "ClientSession.__init__" in stack or "TCPConnector.__init__" in stack,
    ),
    (
        "TCP connect",
        lambda stack, leaf: any(f in stack for f in ("BaseConnector.connect", "_add_writer", "_sock_connect")),
    ),
    (
        "session and socket closed per poll",
        lambda stack, leaf: any(
            f in stack for f in ("ClientSession.close", "ClientSession.__aexit__", "TCPConnector._close")
        ),
    ),
    (
        "the hook's connection and config per poll",
        lambda stack, leaf: "HttpAsyncHook.config" in stack or "get_async_connection" in stack,
    ),
    ("retries (tenacity)", lambda stack, leaf: "tenacity" in stack and "ClientSession._request" not in stack),
    (
        "the socket write (one send per request)",
        lambda stack, leaf: "_SelectorSocketTransport.write" in leaf or "StreamWriter" in stack,
    ),
    (
        "the response: read and parsed",
        lambda stack, leaf: any(f in stack for f in ("data_received", "read_capped", "ClientResponse", "read_ready")),
    ),
    ("aiohttp: building and sending the request", lambda stack, leaf: "aiohttp" in stack),
    ("the kit's code: the wait, shared answers, the condition", lambda stack, leaf: "airflow_deferrable_kit" in stack),
    (
        "the official trigger's and hook's own code",
        lambda stack, leaf: any(f in stack for f in ("HttpSensorTrigger", "HttpAsyncHook", "AsyncHttpSession")),
    ),
    (
        "Airflow's runner (greenback portal, log lines)",
        lambda stack, leaf: any(f in stack for f in ("greenback", "triggerer_job_runner", "structlog")),
    ),
    ("threads", lambda stack, leaf: "threading.py" in stack or "thread.py" in stack),
    ("the event loop (timers, handles)", lambda stack, leaf: "asyncio" in stack),
    ("other", lambda stack, leaf: True),
]


def families(folded: Path) -> dict[str, object]:
    """Shares of the busy samples by family (the loop asleep left out and reported on its own)."""
    counts: collections.Counter[str] = collections.Counter()
    for line in folded.read_text().splitlines():
        stack, _, samples = line.rstrip().rpartition(" ")
        if not stack or not samples.isdigit():
            continue
        leaf = stack.rsplit(";", 1)[-1]
        name = next(name for name, claims in FAMILIES if claims(stack, leaf))
        counts[name] += int(samples)
    asleep = counts.pop(ASLEEP, 0)
    busy = sum(counts.values())
    return {
        "file": str(folded),
        "busy_samples": busy,
        "asleep_samples": asleep,
        "busy_share_pct": {name: round(100 * n / busy, 1) for name, n in counts.most_common()} if busy else {},
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("folded", nargs="+", type=Path, help="raw stacks from triggerer_load --profile-hold")
    parser.add_argument("--out", help="append one JSON line per file to this file too")
    args = parser.parse_args(argv)
    for path in args.folded:
        line = json.dumps(families(path))
        print(line)
        if args.out:
            with open(args.out, "a") as handle:
                handle.write(line + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
