"""Wait until the keys under an S3 prefix stop changing: the official ``S3KeysUnchangedSensor``'s rule.

A producer that writes many objects and no marker is done when the set of keys under its prefix
has not changed for an inactivity period. Each poll lists the prefix through the S3 waits'
shared poller (one client per connection, listings shared with every wait on the same prefix,
bounded at :data:`MAX_PREFIX_PAGES` pages) and compares the keys with the last poll's. What must
outlive the trigger (the set's fingerprint, when it last changed) travels in the kwargs as the
look the sensor handed over, and is trusted only while it is fresh (see
:class:`S3KeysUnchangedTrigger`).
"""

from __future__ import annotations

import datetime as dt
import hashlib
import re
from collections.abc import Iterable
from typing import Any, Final

from airflow_deferrable_kit._arguments import require_conn_id, require_seconds
from airflow_deferrable_kit._s3.client import S3Options, classify_s3_error, load_options, s3_request
from airflow_deferrable_kit._s3.poller import Listing, S3Poller, close_poller, open_poller
from airflow_deferrable_kit.errors import ErrorType, WaitError
from airflow_deferrable_kit.triggers.base import FatalError, Found, PollingTrigger, parse_deadline
from airflow_deferrable_kit.triggers.s3 import check_bucket_name

#: Pages (of up to 1,000 objects) an inactivity wait lists a prefix with. It keeps the prefix's
#: keys in memory between polls, so a prefix that holds more ends the wait with an error.
MAX_PREFIX_PAGES: Final = 10
#: How much older than one poll interval the look handed over to the trigger may be and still
#: keep its inactivity clock (the worker's look before deferring, the previous poke).
HANDOVER_GRACE: Final = 60.0
#: Deleted keys a ``condition_failed`` message names (the rest are counted).
DELETED_KEYS_NAMED: Final = 10
#: Hex digits of one key's digest in a hand-over's ``digests`` (64 bits).
KEY_DIGEST_CHARS: Final = 16
_FINGERPRINT = re.compile(r"[0-9a-f]{64}")
_DIGESTS = re.compile(r"(?:[0-9a-f]{16})*")


def keys_fingerprint(keys: Iterable[str]) -> str:
    """SHA-256 of a set of keys (sorted, each length-prefixed): what a hand-over keeps of the set."""
    digest = hashlib.sha256()
    for key in sorted(keys):
        data = key.encode()
        digest.update(len(data).to_bytes(4, "big") + data)
    return digest.hexdigest()


def key_digest(key: str) -> str:
    """A key's 64-bit BLAKE2b digest in hex (:data:`KEY_DIGEST_CHARS` digits)."""
    return hashlib.blake2b(key.encode(), digest_size=KEY_DIGEST_CHARS // 2).hexdigest()


def keys_digests(keys: Iterable[str]) -> str:
    """Each key's :func:`key_digest`, sorted and joined: what a hand-over keeps with ``allow_delete=False``.

    A fingerprint says that a set changed, not how: a key deleted and another added between
    the look and the next listing leaves as many keys as before, and officially that is a
    deletion (``previous - current``). The digests tell it: a digest of the look missing from
    the listing is a key gone. 16 characters a key (160 KB at the 10,000-key bound) instead of
    the keys themselves (up to 1 KB each); a deleted key is missed only if its digest equals
    that of a key listed, about one chance in 2**64 per key listed.
    """
    return "".join(sorted({key_digest(key) for key in keys}))


def _iso(timestamp: float) -> str:
    return dt.datetime.fromtimestamp(timestamp, tz=dt.timezone.utc).isoformat()


class S3KeysUnchangedTrigger(PollingTrigger):
    """Fire once the set of keys under ``prefix`` has not changed for ``inactivity_period`` seconds
    and holds at least ``min_objects`` keys: the official ``S3KeysUnchangedSensor``'s rule.

    Each poll lists the prefix (shared with the other S3 waits on it, bounded at
    :data:`MAX_PREFIX_PAGES` pages) and compares its keys with the last poll's: new keys restart
    the inactivity clock; keys gone restart it with ``allow_delete`` and end the wait with a
    ``condition_failed`` error without. A key rewritten in place is no change, as officially.

    :param bucket_name: the bucket.
    :param prefix: the key prefix (``""``: the whole bucket); keys at any depth under it count.
    :param inactivity_period: seconds the set must stay unchanged.
    :param min_objects: keys the set must hold for the wait to succeed; fewer keep it waiting.
    :param previous_objects: the keys the first poll compares with (the official parameter):
        keys of it missing from the first listing are a deletion.
    :param allow_delete: whether keys may disappear (restarting the clock) or end the wait.
    :param aws_conn_id: Airflow ``aws`` connection; ``None`` for the default credential chain.
    :param last_look: what the look before this trigger saw, as the sensor hands it over:
        ``{"observed_at", "changed_at"}`` (ISO 8601 with offset: when it looked, and when the set
        last changed), plus ``"fingerprint"`` and ``"count"`` of its keys (:func:`keys_fingerprint`)
        unless ``previous_objects`` holds them, and with ``allow_delete=False`` their
        ``"digests"`` (:func:`keys_digests`), so a key replaced by another is a deletion, as
        officially. The kwargs never change while the trigger runs,
        so after a triggerer restart this is still the hand-over's look: its clock is kept only
        if the trigger's first listing comes within one ``poll_interval`` plus
        :data:`HANDOVER_GRACE` of ``observed_at``; later, changes made meanwhile and undone
        cannot be ruled out, so the clock restarts at that listing (later, never early).
    """

    __slots__ = (
        "_changed_at",
        "_count",
        "_digests",
        "_fingerprint",
        "_handed_over",
        "_keys",
        "_listing_id",
        "_observed_at",
        "_settings",
    )  # its state: see PollingTrigger.__slots__

    bucket_name: str
    prefix: str
    inactivity_period: float = 3600.0
    min_objects: int = 1
    previous_objects: list[str] | None = None
    allow_delete: bool = True
    aws_conn_id: str | None = "aws_default"
    last_look: dict[str, Any] | None = None

    extra = "s3"
    extra_modules = ("aiobotocore",)

    def __post_init__(self) -> None:
        self._settings: S3Options | None = None
        self._keys: tuple[str, ...] | None = None  # the last listing's keys, sorted (None: not known exactly)
        self._fingerprint: str | None = None  # ... or only their fingerprint and count (a hand-over)
        self._count = 0
        self._digests: str | None = None  # ... and, with allow_delete=False, each key's digest
        self._changed_at: float | None = None  # when the set last changed (None: the clock has not started)
        self._observed_at: float | None = None  # when the set was last listed
        self._handed_over = True  # the first listing still has to be compared with the kwargs' look
        self._listing_id: int | None = None  # the listing judged last, not to be judged twice
        super().__post_init__()

    def validate(self) -> None:
        if not isinstance(self.bucket_name, str) or not self.bucket_name.strip():
            raise ValueError(f"bucket_name must be a non-empty string, got {self.bucket_name!r}")
        check_bucket_name(self.bucket_name, argument="bucket_name")
        if not isinstance(self.prefix, str):
            raise ValueError(f'prefix must be a string ("" for the whole bucket), got {self.prefix!r}')
        if "://" in self.prefix:
            raise ValueError(f"prefix must be a key prefix relative to bucket_name, not a URI, got {self.prefix!r}")
        require_seconds(self.inactivity_period, argument="inactivity_period", allow_zero=True)
        if isinstance(self.min_objects, bool) or not isinstance(self.min_objects, int) or self.min_objects < 0:
            raise ValueError(f"min_objects must be a non-negative integer, got {self.min_objects!r}")
        if not isinstance(self.allow_delete, bool):
            raise ValueError(f"allow_delete must be True or False, got {self.allow_delete!r}")
        require_conn_id(self.aws_conn_id, argument="aws_conn_id", optional=True)
        if self.previous_objects is not None:
            if not isinstance(self.previous_objects, list) or not all(
                isinstance(k, str) for k in self.previous_objects
            ):
                raise ValueError(f"previous_objects must be a list of keys or None, got {self.previous_objects!r}")
            self._keys = tuple(sorted(set(self.previous_objects)))
        self._load_last_look()
        if self._keys is None and self._fingerprint is None:
            self._keys = ()  # as officially: no previous objects is the empty set

    def _load_last_look(self) -> None:
        look = self.last_look
        if look is None:
            return
        where = "last_look"
        if not isinstance(look, dict) or not {"observed_at", "changed_at"} <= set(look):
            raise ValueError(f"{where} must be a dict with observed_at and changed_at, got {look!r}")
        unknown = set(look) - {"observed_at", "changed_at", "fingerprint", "count", "digests"}
        if unknown:
            raise ValueError(f"{where} has unknown entries {sorted(unknown)}")
        self._observed_at = parse_deadline(look["observed_at"], argument=f"{where}.observed_at")
        self._changed_at = parse_deadline(look["changed_at"], argument=f"{where}.changed_at")
        if self._changed_at > self._observed_at:
            raise ValueError(f"{where}.changed_at must not be after {where}.observed_at, got {look!r}")
        if ("fingerprint" in look) != ("count" in look):
            raise ValueError(f"{where} needs both fingerprint and count, or neither, got {look!r}")
        if "fingerprint" in look:
            if self.previous_objects is not None:
                raise ValueError(f"give previous_objects or {where}.fingerprint, not both")
            fingerprint, count = look["fingerprint"], look["count"]
            if not isinstance(fingerprint, str) or not _FINGERPRINT.fullmatch(fingerprint):
                raise ValueError(f"{where}.fingerprint must be 64 lowercase hex digits, got {fingerprint!r}")
            if isinstance(count, bool) or not isinstance(count, int) or count < 0:
                raise ValueError(f"{where}.count must be a non-negative integer, got {count!r}")
            self._fingerprint, self._count = fingerprint, count
            digests = look.get("digests")
            if digests is None and not self.allow_delete:
                raise ValueError(
                    f"{where} needs digests with allow_delete=False: a fingerprint tells that the keys changed, "
                    "not whether one was deleted while another was added"
                )
            if digests is not None:
                if not isinstance(digests, str) or not _DIGESTS.fullmatch(digests):
                    raise ValueError(
                        f"{where}.digests must be {KEY_DIGEST_CHARS} lowercase hex digits a key, joined, "
                        f"got {digests[:80] if isinstance(digests, str) else digests!r}"
                    )
                if len(digests) != count * KEY_DIGEST_CHARS:
                    raise ValueError(
                        f"{where}.digests holds {len(digests) // KEY_DIGEST_CHARS} key(s) but {where}.count is {count}"
                    )
                self._digests = digests
        elif "digests" in look:
            raise ValueError(f"{where}.digests goes with fingerprint and count, got {look!r}")

    def describe(self) -> str:
        return (
            f"s3://{self.bucket_name}/{self.prefix} unchanged for {self.inactivity_period:g}s "
            f"(at least {self.min_objects} object(s))"
        )

    # ---------------------------------------------------------------------------- state
    def continue_watch(self) -> None:
        """Keep :attr:`last_look`'s clock however old it is: the look was this process's own.

        For the sensor's poke path, whose pokes follow one another in one running task as a
        trigger's polls do (a slow poke is a long gap between polls, not a restart).
        """
        self._handed_over = False

    def seen_keys(self) -> list[str] | None:
        """The keys of the last listing (or of ``previous_objects`` before one); ``None`` if only
        their fingerprint is known."""
        return None if self._keys is None else list(self._keys)

    def look(self) -> dict[str, Any] | None:
        """What this trigger saw, as :attr:`last_look` takes it (with the keys' fingerprint)."""
        if self._observed_at is None or self._changed_at is None:
            return None
        fingerprint = keys_fingerprint(self._keys) if self._keys is not None else self._fingerprint
        count = len(self._keys) if self._keys is not None else self._count
        look: dict[str, Any] = {
            "observed_at": _iso(self._observed_at),
            "changed_at": _iso(self._changed_at),
            "fingerprint": fingerprint,
            "count": count,
        }
        if not self.allow_delete:
            look["digests"] = keys_digests(self._keys) if self._keys is not None else self._digests
        return look

    # ---------------------------------------------------------------------------- check
    async def check(self) -> Found | None:
        if self._settings is None:
            self._settings = await load_options(self.aws_conn_id)
        settings = self._settings
        poller: S3Poller = await self.lease(settings.lease_key, lambda: open_poller(settings), close_poller)
        where = f"s3://{self.bucket_name}/{self.prefix}"
        listing: Listing = await s3_request(
            f"LIST {where}",
            self._where(),
            poller.list_prefix(
                self.bucket_name,
                self.prefix,
                poll_interval=float(self.poll_interval),
                max_pages=MAX_PREFIX_PAGES,
                seen=self._listing_id,
            ),
        )
        self._listing_id = id(listing)
        if not listing.complete or listing.pages > MAX_PREFIX_PAGES:
            raise FatalError(
                f"{where} holds more than {MAX_PREFIX_PAGES} pages of objects ({MAX_PREFIX_PAGES * 1000:,}): an "
                "inactivity wait keeps every key of its prefix between polls; wait on a narrower prefix",
                error_type=ErrorType.BAD_CONFIGURATION,
            )
        now = self.clock.time()
        current = tuple(sorted(listing.keys))
        if self._handed_over:
            self._handed_over = False
            if self._changed_at is not None and abs(now - (self._observed_at or now)) > (
                float(self.poll_interval) + HANDOVER_GRACE
            ):
                self.log.info(
                    "%s: the look handed over (at %s) is too old to vouch for the time since; the inactivity "
                    "clock restarts now",
                    where,
                    _iso(self._observed_at or now),
                )
                self._changed_at = None
        changed = self._compare(current, where)
        self._keys, self._fingerprint, self._count, self._digests = current, None, len(current), None
        self._observed_at = now
        if changed or self._changed_at is None:
            self._changed_at = now
            if changed:
                return None  # as officially, a poll that sees a change never succeeds
        unchanged_for = now - self._changed_at
        if unchanged_for < float(self.inactivity_period) or len(current) < self.min_objects:
            return None
        return Found(
            {
                "bucket": self.bucket_name,
                "prefix": self.prefix,
                "object_count": len(current),
                "total_size": sum(int(size or 0) for size, _, _ in listing.details),
                "last_changed": _iso(self._changed_at),
                "unchanged_for": round(unchanged_for, 3),
                "inactivity_period": self.inactivity_period,
            }
        )

    def _compare(self, current: tuple[str, ...], where: str) -> bool:
        """Whether the set changed since the last look; raise if keys went and may not."""
        if self._keys is None:  # a hand-over kept only the fingerprint and count (and the digests)
            if keys_fingerprint(current) == self._fingerprint:
                return False
            if self._digests is not None:
                listed = {key_digest(key) for key in current}
                step = KEY_DIGEST_CHARS
                missing = sum(
                    1 for at in range(0, len(self._digests), step) if self._digests[at : at + step] not in listed
                )
                if missing:
                    return self._deleted(where, missing, [])
            elif len(current) < self._count:
                return self._deleted(where, self._count - len(current), [])
            self.log.info("%s: the set of keys changed since the hand-over; restarting the inactivity clock", where)
            return True
        if current == self._keys:
            return False
        now_present = set(current)
        gone = [key for key in self._keys if key not in now_present]
        if gone:
            return self._deleted(where, len(gone), gone)
        self.log.info("%s: %d new key(s); restarting the inactivity clock", where, len(current) - len(self._keys))
        return True

    def _deleted(self, where: str, count: int, keys: list[str]) -> bool:
        named = f": {', '.join(keys[:DELETED_KEYS_NAMED])}" if keys else ""
        if len(keys) > DELETED_KEYS_NAMED:
            named += f" and {len(keys) - DELETED_KEYS_NAMED} more"
        if not self.allow_delete:
            raise FatalError(
                f"{where}: {count} key(s) were deleted between two polls{named} (allow_delete=False)",
                error_type=ErrorType.CONDITION_FAILED,
            )
        self.log.info("%s: %d key(s) were deleted%s; restarting the inactivity clock", where, count, named)
        return True

    def next_poll_delay(self) -> float:
        """A poll interval, or less when the inactivity period ends sooner: the wait ends on time
        instead of up to one interval after (the official sensor's caveat)."""
        interval = float(self.poll_interval)
        if self._changed_at is None or self._keys is None or len(self._keys) < self.min_objects:
            return interval
        left = self._changed_at + float(self.inactivity_period) - self.clock.time()
        return min(interval, left) if left > 0 else interval

    # ---------------------------------------------------------------------------- errors
    def classify_error(self, exc: Exception) -> WaitError:
        return classify_s3_error(exc, what=self.describe(), where=self._where()) or super().classify_error(exc)

    def _where(self) -> str:
        return self._settings.describe() if self._settings is not None else f"aws_conn_id={self.aws_conn_id!r}"


__all__ = [
    "HANDOVER_GRACE",
    "KEY_DIGEST_CHARS",
    "MAX_PREFIX_PAGES",
    "S3KeysUnchangedTrigger",
    "key_digest",
    "keys_digests",
    "keys_fingerprint",
]
