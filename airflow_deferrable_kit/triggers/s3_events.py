"""Start a DAG run for each new S3 object: ``S3KeyEventTrigger``, for an ``AssetWatcher``.

It is :class:`~airflow_deferrable_kit.triggers.s3.S3KeyTrigger` (same parameters, connection,
client, listing and error rules) that never stops: every ``poll_interval`` it lists the literal
prefix of each key or pattern once, shared by every watcher of that prefix in the triggerer, and
fires one event per object it has not fired before, oldest first.

"New" is decided by a watermark in the asset state store, on S3's own clock (each object's
``LastModified``), never the triggerer's:

* ``floor``: objects last modified before it are old, whether seen or not;
* ``seen``: a short hash of (bucket, key, ETag, LastModified) of every object listed at or after
  the floor. An object at or after the floor is new unless it is in ``seen``.

After each listing the floor moves up to ``lookback`` seconds before the newest ``LastModified``
seen, and ``seen`` is recomputed from the listing (deleted objects drop out). ``lookback`` is how
late an object may become visible and still fire: S3 stamps an object with the time its upload
*started*, so a multipart upload finishing an hour after it began, while newer objects were
already seen, is still caught with the default hour. ``seen`` is capped at
:data:`MAX_SEEN_OBJECTS` (the state store's values should stay under 64 KiB); past the cap the
floor rises further and the log says so. An overwritten key (new ETag or LastModified) is a new
object and fires again.
"""

from __future__ import annotations

import bisect
import datetime as dt
import glob
import hashlib
from typing import Any, ClassVar, Final

from airflow_deferrable_kit._arguments import require_seconds
from airflow_deferrable_kit._event_streams import Board
from airflow_deferrable_kit._s3.poller import Listing
from airflow_deferrable_kit.triggers.events import EventTrigger, event_payload
from airflow_deferrable_kit.triggers.s3 import KeyPattern, S3KeyTrigger, describe_object

#: Objects the watermark remembers at most (about 15 bytes each in the state store).
MAX_SEEN_OBJECTS: Final = 3000
#: Hex digits of an object's hash in ``seen``: 48 bits.
SEEN_HASH_HEX: Final = 12


def _millis(moment: dt.datetime) -> int:
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=dt.timezone.utc)
    return round(moment.timestamp() * 1000)


def _iso(millis: int) -> str:
    return dt.datetime.fromtimestamp(millis / 1000, tz=dt.timezone.utc).isoformat(timespec="milliseconds")


def _parse(text: str) -> int:
    return _millis(dt.datetime.fromisoformat(text))


class _Snapshot:
    """One listing as the watchers of its prefix read it, each ``LastModified`` parsed once for all."""

    def __init__(self, listing: Listing) -> None:
        self.listing = listing
        self._millis: dict[int, int | None] = {}

    def modified(self, index: int) -> int | None:
        """``LastModified`` of key ``index`` in milliseconds since the epoch (``None`` if S3 gave none)."""
        if index not in self._millis:
            raw = self.listing.details[index][2]
            if isinstance(raw, str):
                try:
                    value: int | None = _parse(raw.replace("Z", "+00:00"))
                except ValueError:
                    value = _millis(self.listing.detail(index)[2])  # botocore's parser, slower
            elif isinstance(raw, dt.datetime):
                value = _millis(raw)
            else:
                value = None
            self._millis[index] = value
        return self._millis[index]


class _Object:
    """One listed object as a watcher sees it: its time, its hash in ``seen``, its description."""

    __slots__ = ("bucket", "etag", "key", "millis", "seen_hash", "size")

    def __init__(self, millis: int, bucket: str, key: str, etag: Any, size: Any) -> None:
        self.bucket, self.key, self.millis, self.size = bucket, key, millis, size
        self.etag = etag.strip('"') if isinstance(etag, str) else None
        text = f"{bucket}\0{key}\0{self.etag}\0{millis}"
        self.seen_hash = hashlib.blake2b(text.encode(), digest_size=SEEN_HASH_HEX // 2).hexdigest()

    def payload(self) -> dict[str, Any]:
        """The event: the object as the wait describes it, and an ``event_id`` made of it."""
        modified = dt.datetime.fromtimestamp(self.millis / 1000, tz=dt.timezone.utc)
        description = describe_object(self.bucket, self.key, self.size, self.etag, modified)
        event_id = f"s3://{self.bucket}/{self.key}#{self.etag or ''}@{description['last_modified']}"
        return event_payload({**description, "event_id": event_id})


class S3KeyEventTrigger(EventTrigger, S3KeyTrigger):
    """Fire one asset event for each new S3 object matching ``bucket_key``.

    :param bucket_key: a key, an ``s3://bucket/key`` URI, or a list of them; with
        ``wildcard_match`` fnmatch patterns (``*`` also matches ``/``). An exact key fires for
        each new version of that key.
    :param bucket_name: the bucket of relative keys.
    :param wildcard_match: treat the keys as patterns.
    :param min_size: only objects of at least this many bytes count (a smaller one counts once
        it has grown, as a new object).
    :param aws_conn_id: Airflow ``aws`` connection; only its id is stored in the trigger.
    :param lookback: seconds before the newest ``LastModified`` seen within which a late object
        still counts as new (see the module docstring).
    :param backfill: fire for the objects already there on the first listing (default: they are
        the starting point).

    Each event's payload: ``bucket``, ``key``, ``size``, ``etag``, ``last_modified`` and an
    ``event_id`` made of them.
    """

    fires_items: ClassVar[bool] = True

    lookback: float = 3600.0
    poll_interval: float = 60.0

    tuning_parameters: ClassVar[tuple[str, ...]] = ("lookback",)

    def validate(self) -> None:
        super().validate()
        require_seconds(self.lookback, argument="lookback")
        # An exact key is a pattern matching only itself (its listing prefix is the key).
        self._watched = self._patterns or [
            KeyPattern.compile(bucket, glob.escape(key)) for bucket, key in self._targets
        ]
        self._prefixes = sorted({(pattern.bucket, pattern.prefix) for pattern in self._watched})

    def stream_identity(self) -> Any:
        """The connection and the prefixes listed: watchers of one prefix share its listing."""
        return {"aws_conn_id": self.aws_conn_id, "prefixes": [list(pair) for pair in self._prefixes]}

    # ---------------------------------------------------------------------- the shared look
    async def poll(self, board: Board) -> dict[tuple[str, str], _Snapshot]:
        client = await self._client()
        interval = float(self.poll_interval)
        snapshots = {}
        for bucket, prefix in self._prefixes:
            listing = await self._call(
                f"LIST s3://{bucket}/{prefix}", client.list_prefix(bucket, prefix, poll_interval=interval)
            )
            snapshots[bucket, prefix] = _Snapshot(listing)
        return snapshots

    def judging_units(self, data: Any) -> int:
        return sum(len(data[pair].listing.keys) for pair in self._prefixes)

    # -------------------------------------------------------------------- this watcher's view
    def _listed(self, snapshots: dict[tuple[str, str], _Snapshot]) -> list[tuple[int, str, str, Any, Any]]:
        """``(last modified ms, bucket, key, etag, size)`` of each object this watcher matches, oldest first."""
        found: dict[tuple[str, str], tuple[int, str, str, Any, Any]] = {}
        for pattern in self._watched:
            snapshot = snapshots[pattern.bucket, pattern.prefix]
            listing = snapshot.listing
            for index in pattern.matches(listing):
                key = listing.keys[index]
                size, etag, _ = listing.details[index]
                if (pattern.bucket, key) in found or (self.min_size is not None and (size or 0) < self.min_size):
                    continue
                millis = snapshot.modified(index)
                if millis is not None:
                    found[pattern.bucket, key] = (millis, pattern.bucket, key, etag, size)
        return sorted(found.values())

    async def derive(self, data: Any, state: Any) -> tuple[list[dict[str, Any]], Any]:
        listed = self._listed(data)
        lookback = round(float(self.lookback) * 1000)
        floor = _parse(state["floor"]) if state and state.get("floor") else None
        newest = _parse(state["newest"]) if state and state.get("newest") else None
        if listed and (newest is None or listed[-1][0] > newest):
            newest = listed[-1][0]
        # What is older than the current floor is old for good: never hashed, never fired.
        start = bisect.bisect_left(listed, (floor,)) if floor is not None else 0
        objects = [_Object(*entry) for entry in listed[start:]]
        if state is None:
            fresh = list(objects) if self.backfill else []
        else:
            seen = set(state.get("seen") or ())
            fresh = [o for o in objects if o.seen_hash not in seen]
        if newest is not None:
            floor = max(floor, newest - lookback) if floor is not None else newest - lookback
        floor = self._capped_floor(objects, floor)
        new_state = {
            "floor": _iso(floor) if floor is not None else None,
            "newest": _iso(newest) if newest is not None else None,
            "seen": sorted(o.seen_hash for o in objects if floor is None or o.millis >= floor),
        }
        return [o.payload() for o in fresh], new_state

    def _capped_floor(self, objects: list[_Object], floor: int | None) -> int | None:
        """Raise the floor so at most :data:`MAX_SEEN_OBJECTS` listed objects are at or after it.

        Objects with the same ``LastModified`` stay together (a floor inside a group would make
        the forgotten part of it new again), so a single larger group is kept whole.
        """
        times = [o.millis for o in objects]  # sorted
        start = 0 if floor is None else bisect.bisect_left(times, floor)
        if len(times) - start <= MAX_SEEN_OBJECTS:
            return floor
        cut = times[len(times) - MAX_SEEN_OBJECTS]
        if cut > times[len(times) - MAX_SEEN_OBJECTS - 1]:
            raised = cut
        else:  # the cut falls inside a group of equal times: keep the group out, or all of it
            later = bisect.bisect_right(times, cut)
            raised = times[later] if later < len(times) else cut
        self.log.warning(
            "%s: more than %d objects within lookback=%ss of the newest; objects last modified before %s are "
            "now old even if they were never seen (narrow the prefix or shorten lookback)",
            self.describe(), MAX_SEEN_OBJECTS, self.lookback, _iso(raised),
        )  # fmt: skip
        return raised


__all__ = ["MAX_SEEN_OBJECTS", "S3KeyEventTrigger"]
