"""Where the CPU of one S3 HEAD goes, on the kit's path and beside the floors under it.

Keys that share no prefix (``own-{i}/data.csv``) cannot share a listing: each poll is one HEAD,
and the kit's cost per poll is the cost of its HEAD. This measures, in one process against the
benchmark's S3 server (``benchmarks/servers.py``), the trigger-process CPU per HEAD of an absent
key (the usual answer of a poll: a 404), ``--heads`` of them, 20 in flight as on the pool:

* ``http-only``: a bare aiohttp ``HEAD`` of the same URL, unsigned, through an aiohttp session
  like the client's (what any HTTP poll costs in asyncio Python: the floor under every S3 HEAD);
* ``sign-only``: botocore's SigV4 signature of the same request, not sent (no S3 request is
  accepted without it);
* ``kit``: :meth:`S3Poller.head_object` (signed by botocore's signer, sent through the client's
  own session, the 404 read without an exception);
* ``botocore``: ``client.head_object`` on the same open aiobotocore client (botocore's full path:
  what the official trigger's poll pays at the least, before the client it builds per poll).

Then a profile of the kit's path, its own time by family (signing, request building, the HTTP
session and aiohttp, asyncio, the kit), the loop's waits for the server left out. The trigger's
share beyond the HEAD (the runner, its log lines, the wait's bookkeeping) is in the
triggerer-load cells, not here.

    PYTHONPATH=. python benchmarks/s3_head_profile.py --heads 3000 --out benchmarks/s3_head_profile.jsonl
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import cProfile
import json
import pstats
import resource
import sys
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
BUCKET = "bench-head"
IN_FLIGHT = 20

#: Families of the profile, by the file a function lives in (first match wins).
FAMILIES = (
    ("signing (botocore auth, hmac, hashlib)", ("botocore/auth.py", "botocore/signers.py", "hmac.py", "hashlib")),
    ("request building (botocore awsrequest, urllib)", ("botocore/awsrequest.py", "botocore/utils.py", "urllib/")),
    ("HTTP session + aiohttp", ("aiobotocore/", "aiohttp/", "yarl/", "multidict/", "propcache/")),
    ("asyncio", ("asyncio/",)),
    ("the kit", ("airflow_deferrable_kit/",)),
    ("C calls (socket, select, builtins)", ("~",)),
)


#: What the profile counts as the loop waiting (cProfile measures wall time), left out of the shares.
IDLE = frozenset({"<method 'poll' of 'select.epoll' objects>", "<method 'select' of 'select.epoll' objects>"})


def cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


async def spread(heads: int, one: Callable[[int], Awaitable[Any]]) -> float:
    """CPU ms per call of ``one(i)`` for ``heads`` calls, :data:`IN_FLIGHT` at a time."""
    counter = iter(range(heads))

    async def lane() -> None:
        for i in counter:
            await one(i)

    start = cpu()
    await asyncio.gather(*(lane() for _ in range(IN_FLIGHT)))
    return (cpu() - start) * 1000 / heads


def family_of(filename: str) -> str:
    for family, markers in FAMILIES:
        if any(marker in filename for marker in markers):
            return family
    return "other"


async def measure(endpoint: str, heads: int) -> dict[str, Any]:
    import aiohttp
    from botocore.awsrequest import AWSRequest

    from airflow_deferrable_kit._s3.client import S3Options, new_client
    from airflow_deferrable_kit._s3.poller import S3Poller

    settings = S3Options(
        conn_id="bench", region_name="us-east-1", endpoint_url=endpoint, access_key_id="k", secret_access_key="s"
    )
    client = await new_client(settings)
    await client.create_bucket(Bucket=BUCKET)
    poller = S3Poller(client)
    await poller.head_object(BUCKET, "warm/data.csv")  # the route, resolved once
    session = aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=IN_FLIGHT))
    auth = await client._request_signer.get_auth_instance(
        signing_name="s3", region_name="us-east-1", signature_version="s3v4"
    )

    def url(i: int) -> str:
        return f"{endpoint}/{BUCKET}/own-{i}/data.csv"

    async def http_only(i: int) -> None:
        async with session.head(url(i)) as response:
            assert response.status == 404, response.status

    async def sign_only(i: int) -> None:
        request = AWSRequest(method="HEAD", url=url(i), headers={})
        request.context["client_config"] = client.meta.config
        auth.add_auth(request)
        request.prepare()

    async def kit(i: int) -> None:
        assert await poller.head_object(BUCKET, f"own-{i}/data.csv") is None

    async def botocore_path(i: int) -> None:
        from botocore.exceptions import ClientError

        with contextlib.suppress(ClientError):  # the 404, raised as botocore raises it
            await client.head_object(Bucket=BUCKET, Key=f"own-{i}/data.csv")

    paths = {"http-only": http_only, "sign-only": sign_only, "kit": kit, "botocore": botocore_path}
    result: dict[str, Any] = {"heads": heads, "in_flight": IN_FLIGHT}
    try:
        for _ in range(2):  # the second round counts: imports, pools and caches are warm
            for name, one in paths.items():
                result[f"{name}_cpu_ms_per_head"] = round(await spread(heads, one), 4)
        profiler = cProfile.Profile()
        profiler.enable()
        await spread(heads, kit)
        profiler.disable()
    finally:
        await session.close()
        await poller.close()
    stats = pstats.Stats(profiler)
    by_family: dict[str, float] = {}
    total = 0.0
    waiting = 0.0
    for (filename, _, name), (_, _, tottime, _, _) in stats.stats.items():  # type: ignore[attr-defined]
        if name in IDLE:  # the loop waiting for the server: wall time, not CPU
            waiting += tottime
            continue
        by_family[family_of(filename)] = by_family.get(family_of(filename), 0.0) + tottime
        total += tottime
    result["kit_profile_waiting_pct_of_wall"] = round(100 * waiting / (waiting + total), 1)
    result["kit_profile_share_pct"] = {
        family: round(100 * seconds / total, 1) for family, seconds in sorted(by_family.items(), key=lambda x: -x[1])
    }
    working = [item for item in stats.stats.items() if item[0][2] not in IDLE]  # type: ignore[attr-defined]
    top = sorted(working, key=lambda item: -item[1][2])[:15]
    result["kit_profile_top_own_time"] = [
        {"function": f"{Path(filename).name}:{line}:{name}", "pct": round(100 * row[2] / total, 1)}
        for (filename, line, name), row in top
    ]
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--heads", type=int, default=3000)
    parser.add_argument("--out", type=Path, default=None, help="append the result as one JSON line")
    parser.add_argument("--patience", type=float, default=600.0, help="seconds to wait for a quiet machine")
    parser.add_argument("--allow-busy", action="store_true", help="run (marked busy) on a busy machine")
    args = parser.parse_args()
    sys.path.insert(0, str(ROOT))
    from benchmarks.quiet import quiet_cell
    from benchmarks.triggerer_load import bench_server

    quiet = quiet_cell(patience=args.patience, allow_busy=args.allow_busy)
    with quiet as machine, bench_server("s3") as (endpoint, _, _):
        result = {
            "benchmark": "s3_head_profile",
            "when": time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime()),
            **machine,
            **asyncio.run(measure(endpoint, args.heads)),
        }
    line = json.dumps(result)
    print(line)
    if args.out:
        with args.out.open("a") as handle:
            handle.write(line + "\n")


if __name__ == "__main__":
    main()
