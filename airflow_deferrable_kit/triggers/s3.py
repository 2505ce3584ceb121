"""Wait for S3 objects: one key, every key of a list, or keys matching a wildcard.

Runs on aiobotocore with one client per (connection, region, endpoint) shared by every S3 wait
in the triggerer process. A HEAD that says 404 is "not yet"; throttling, 5xx and network errors
back off; a missing bucket, a 403 or bad credentials end the wait at once with a clear message.
Wildcard waits on the same literal prefix share one listing (``list_prefix``), and
so do many exact-key waits in one folder or under one prefix when that is cheaper than a HEAD
each (``find_object``).
The success payload says which objects matched, with size, ETag and last-modified time.
"""

from __future__ import annotations

import dataclasses
import fnmatch
import ipaddress
import json
import re
from collections.abc import Awaitable, Callable, Iterable
from typing import Any, Final

from airflow_deferrable_kit._arguments import require_conn_id
from airflow_deferrable_kit._s3.client import S3Missing, S3Options, classify_s3_error, load_options, s3_request
from airflow_deferrable_kit._s3.poller import Listing, S3Poller, close_poller, open_poller
from airflow_deferrable_kit.errors import ErrorType, WaitError
from airflow_deferrable_kit.payload import MAX_PAYLOAD_BYTES
from airflow_deferrable_kit.triggers.base import FatalError, Found, PollingTrigger

#: At most this many matched objects are described in the payload; the rest are only counted.
MAX_LISTED_KEYS: Final = 100
#: Bytes of serialized object descriptions allowed in one payload (room left for the envelope).
KEYS_BYTE_BUDGET: Final = MAX_PAYLOAD_BYTES - 4096

_WILDCARD = re.compile(r"[*?\[]")
#: Characters that may be part of a wildcard; whatever follows the last of them is literal.
_WILDCARD_PART = re.compile(r"[*?\[\]]")
#: S3's naming rules for buckets, each with what it says when a name breaks it. Names ending in
#: "-s3alias", "--ol-s3" (access point aliases), "--x-s3" (directory buckets) or "--table-s3" are
#: let through: S3 answers object requests for them wherever a bucket name goes.
_BUCKET_RULES: Final[tuple[tuple[Callable[[str], bool], str], ...]] = (
    (lambda name: 3 <= len(name) <= 63, "3 to 63 characters"),
    (lambda name: re.fullmatch(r"[a-z0-9.-]+", name) is not None, "only lowercase letters, digits, dots and hyphens"),
    (lambda name: name[:1].isalnum() and name[-1:].isalnum(), "starting and ending with a letter or digit"),
    (lambda name: ".." not in name, "no two adjacent dots"),
    (lambda name: not _looks_like_ip(name), "not formatted as an IP address"),
    (
        lambda name: not name.startswith(("xn--", "sthree-", "amzn-s3-demo-")),
        "not starting with xn--, sthree- or amzn-s3-demo-",
    ),
    (lambda name: not name.endswith(".mrap"), "not ending with .mrap"),
)


def _looks_like_ip(name: str) -> bool:
    try:
        ipaddress.IPv4Address(name)
    except ValueError:
        return False
    return True


def check_bucket_name(bucket: str, *, argument: str) -> None:
    """Refuse a bucket name S3 can never accept, naming the argument it came from and the rule.

    These are S3's rules for every bucket created since March 2018. A bucket created in
    us-east-1 before then under the legacy rules (capitals, underscores, up to 255 characters)
    is refused too: such names are not DNS-compatible and only path-style requests reach them.
    """
    broken = [rule for check, rule in _BUCKET_RULES if not check(bucket)]
    if broken:
        raise ValueError(
            f"{argument} must name a valid S3 bucket ({'; '.join(broken)}), got {bucket!r} "
            "(see https://docs.aws.amazon.com/AmazonS3/latest/userguide/bucketnamingrules.html)"
        )


def split_s3_uri(uri: str) -> tuple[str, str]:
    """``s3://bucket/some/key`` -> ``("bucket", "some/key")``; raises ``ValueError`` if malformed."""
    rest = uri[len("s3://") :]
    bucket, _, key = rest.partition("/")
    if not bucket or not key:
        raise ValueError(f"bucket_key {uri!r} is not a full s3://bucket/key URI")
    return bucket, key


def resolve_targets(bucket_key: str | list[str], bucket_name: str | None) -> list[tuple[str, str]]:
    """Turn the user's ``bucket_key``/``bucket_name`` into ``(bucket, key)`` pairs.

    Each entry is either a key relative to ``bucket_name`` or a full ``s3://bucket/key`` URI
    (then ``bucket_name`` may be omitted; if given, it must name the same bucket).
    """
    keys = [bucket_key] if isinstance(bucket_key, str) else bucket_key
    if not isinstance(keys, list) or not keys:
        raise ValueError(f"bucket_key must be a key, an s3:// URI or a non-empty list of them, got {bucket_key!r}")
    if bucket_name is not None and (not isinstance(bucket_name, str) or not bucket_name.strip()):
        raise ValueError(f"bucket_name must be a non-empty string or None, got {bucket_name!r}")
    targets = []
    for key in keys:
        if not isinstance(key, str) or not key:
            raise ValueError(f"bucket_key entries must be non-empty strings, got {key!r}")
        if key.startswith("s3://"):
            bucket, relative = split_s3_uri(key)
            if bucket_name is not None and bucket_name != bucket:
                raise ValueError(
                    f"bucket_key {key!r} names bucket {bucket!r} but bucket_name is {bucket_name!r}; "
                    "give either a full s3:// URI or a key relative to bucket_name"
                )
        elif "://" in key:
            raise ValueError(f"bucket_key {key!r} must be an s3:// URI or a key relative to bucket_name")
        elif bucket_name is None:
            raise ValueError(
                f"bucket_key {key!r} is a relative key, so bucket_name is required (or use s3://bucket/key)"
            )
        else:
            bucket, relative = bucket_name, key
        check_bucket_name(bucket, argument="bucket_name" if bucket_name is not None else "bucket_key")
        targets.append((bucket, relative))
    return targets


def literal_prefix(pattern: str) -> str:
    """The part of an fnmatch pattern before its first wildcard: the listing prefix."""
    match = _WILDCARD.search(pattern)
    return pattern if match is None else pattern[: match.start()]


@dataclasses.dataclass(frozen=True)
class KeyPattern:
    """One wildcard target, compiled once: where to list and how to match what is listed."""

    bucket: str
    pattern: str
    prefix: str  # the literal text before the first wildcard: what is listed
    tail: str  # the literal text after the last wildcard: every match ends with it
    regex: re.Pattern[str]

    @classmethod
    def compile(cls, bucket: str, pattern: str) -> KeyPattern:
        """Compile ``pattern`` with ``fnmatch`` semantics (case-sensitive, ``*`` crosses ``/``)."""
        tail = _WILDCARD_PART.split(pattern)[-1]
        return cls(bucket, pattern, literal_prefix(pattern), tail, re.compile(fnmatch.translate(pattern)))

    def matches(self, listing: Listing) -> list[int]:
        """Indexes, in key order, of the listed keys this pattern matches."""
        keys = listing.keys
        return [i for i in listing.candidates(self.tail) if self.regex.match(keys[i])]


def describe_object(bucket: str, key: str, size: Any, etag: Any, last_modified: Any) -> dict[str, Any]:
    """The JSON description of one matched object (ETag without its surrounding quotes)."""
    return {
        "bucket": bucket,
        "key": key,
        "size": int(size) if size is not None else None,
        "etag": etag.strip('"') if isinstance(etag, str) else None,
        "last_modified": last_modified.isoformat() if hasattr(last_modified, "isoformat") else None,
    }


def keys_payload(objects: Iterable[dict[str, Any]], total: int) -> dict[str, Any]:
    """Describe up to :data:`MAX_LISTED_KEYS` objects within :data:`KEYS_BYTE_BUDGET`; count the rest."""
    listed: list[dict[str, Any]] = []
    used = 0
    for description in objects:
        size = len(json.dumps(description, separators=(",", ":"))) + 1
        if len(listed) >= MAX_LISTED_KEYS or used + size > KEYS_BYTE_BUDGET:
            break
        listed.append(description)
        used += size
    return {"keys": listed, "keys_not_listed": total - len(listed)}


class S3KeyTrigger(PollingTrigger):
    """Fire when every key (or wildcard pattern) in ``bucket_key`` exists in S3.

    :param bucket_key: a key relative to ``bucket_name``, a full ``s3://bucket/key`` URI, or a
        list of them (all must exist).
    :param bucket_name: the bucket of relative keys.
    :param wildcard_match: treat each key as an fnmatch pattern (``*``, ``?``, ``[...]``;
        ``*`` also matches ``/``) over a paginated listing of its literal prefix; each pattern
        must match at least one object.
    :param min_size: only objects of at least this many bytes count.
    :param aws_conn_id: Airflow ``aws`` connection to use; ``None`` for the default credential
        chain. Only the id is stored in the trigger; credentials are read in the triggerer.
    """

    __slots__ = (
        "_buckets_seen",
        "_first_missing",
        "_patterns",
        "_settings",
        "_targets",
    )  # its state: see PollingTrigger.__slots__

    bucket_key: str | list[str]
    bucket_name: str | None = None
    wildcard_match: bool = False
    min_size: int | None = None
    aws_conn_id: str | None = "aws_default"

    extra = "s3"
    extra_modules = ("aiobotocore",)

    def __post_init__(self) -> None:
        self._targets: list[tuple[str, str]] = []
        self._patterns: list[KeyPattern] = []  # the targets compiled, with wildcard_match
        self._settings: S3Options | None = None  # the connection, read once per run
        self._first_missing = 0  # index of the key that was missing at the last poll
        self._buckets_seen: tuple[str, ...] = ()  # buckets known to exist (usually one: a tuple is the smallest)
        super().__post_init__()

    def normalise(self) -> None:
        """A tuple of keys (as written in a DAG, or rendered from one in the triggerer) is a list."""
        if isinstance(self.bucket_key, tuple):
            self.bucket_key = list(self.bucket_key)

    def validate(self) -> None:
        self._targets = resolve_targets(self.bucket_key, self.bucket_name)
        if not isinstance(self.wildcard_match, bool):
            raise ValueError(f"wildcard_match must be True or False, got {self.wildcard_match!r}")
        if self.wildcard_match:
            self._patterns = [KeyPattern.compile(bucket, pattern) for bucket, pattern in self._targets]
        if self.min_size is not None and (
            isinstance(self.min_size, bool) or not isinstance(self.min_size, int) or self.min_size < 0
        ):
            raise ValueError(f"min_size must be a non-negative integer number of bytes or None, got {self.min_size!r}")
        require_conn_id(self.aws_conn_id, argument="aws_conn_id", optional=True)

    def describe(self) -> str:
        bucket, key = self._targets[0]
        text = f"s3://{bucket}/{key}"
        if len(self._targets) > 1:
            text += f" and {len(self._targets) - 1} more"
        if self.wildcard_match:
            text += " (wildcard)"
        if self.min_size:
            text += f", at least {self.min_size} bytes"
        return text

    # ---------------------------------------------------------------------------- check
    async def check(self) -> Found | None:
        client = await self._client()
        if self.wildcard_match:
            return await self._check_patterns(client)
        return await self._check_keys(client)

    async def _client(self) -> S3Poller:
        """The shared poller for this trigger's connection (the connection is read once per run)."""
        if self._settings is None:
            self._settings = await load_options(self.aws_conn_id)
        settings = self._settings
        poller: S3Poller = await self.lease(settings.lease_key, lambda: open_poller(settings), close_poller)
        return poller

    async def _call(self, what: str, request: Awaitable[Any]) -> Any:
        """Await one S3 request, botocore's errors turned into ours (a 404 into :class:`S3Missing`)."""
        return await s3_request(what, self._where(), request)

    async def _check_keys(self, client: S3Poller) -> Found | None:
        # Start from the key that was missing last time: it is the one most likely still missing,
        # so a not-yet poll usually costs one HEAD however long the list is.
        order = list(range(self._first_missing, len(self._targets))) + list(range(self._first_missing))
        found: dict[int, dict[str, Any]] = {}
        for index in order:
            bucket, key = self._targets[index]
            description = await self._head(client, bucket, key)
            if description is None:
                self._first_missing = index
                return None
            found[index] = description
        objects = [found[i] for i in range(len(self._targets))]
        return Found(keys_payload(objects, len(objects)))

    async def _head(self, client: S3Poller, bucket: str, key: str) -> dict[str, Any] | None:
        response = await self._call(
            f"HEAD s3://{bucket}/{key}", client.find_object(bucket, key, poll_interval=float(self.poll_interval))
        )
        if response is None:  # 404: the key, or the bucket, does not exist yet
            await self._require_bucket(client, bucket)
            return None
        size = response.get("ContentLength")
        if self.min_size is not None and (size or 0) < self.min_size:
            return None
        return describe_object(bucket, key, size, response.get("ETag"), response.get("LastModified"))

    async def _require_bucket(self, client: S3Poller, bucket: str) -> None:
        """A HEAD 404 cannot tell a missing key from a missing bucket: ask once per bucket."""
        if bucket in self._buckets_seen:
            return
        try:
            await self._call(f"HEAD bucket s3://{bucket}", client.head_bucket(bucket))
        except S3Missing as exc:
            raise FatalError(
                f"s3://{bucket}: the bucket does not exist (HEAD bucket: {exc.code})",
                error_type=ErrorType.NOT_FOUND,
            ) from exc
        except FatalError as exc:
            if exc.error_type != "access_denied":
                raise
            # Allowed to read objects but not to HEAD the bucket: existence cannot be checked.
        self._buckets_seen += (bucket,)

    async def _check_patterns(self, client: S3Poller) -> Found | None:
        # A listing of the same prefix that another wait started moments ago answers this poll too.
        interval = float(self.poll_interval)
        listings: dict[tuple[str, str], Listing] = {}
        seen: set[tuple[str, str]] = set()
        objects: list[dict[str, Any]] = []
        total = 0
        for target in self._patterns:
            bucket, prefix = target.bucket, target.prefix
            listing = listings.get((bucket, prefix))
            if listing is None:
                listing = listings[bucket, prefix] = await self._call(
                    f"LIST s3://{bucket}/{prefix}", client.list_prefix(bucket, prefix, poll_interval=interval)
                )
            matched = 0
            for index in target.matches(listing):
                size = listing.details[index][0]
                if self.min_size is not None and (size or 0) < self.min_size:
                    continue
                matched += 1
                key = listing.keys[index]
                if len(self._patterns) > 1:
                    if (bucket, key) in seen:
                        continue
                    seen.add((bucket, key))
                total += 1
                if len(objects) < MAX_LISTED_KEYS:
                    objects.append(describe_object(bucket, key, *listing.detail(index)))
            if not matched:
                return None
        return Found(keys_payload(objects, total))

    # ---------------------------------------------------------------------------- errors
    def classify_error(self, exc: Exception) -> WaitError:
        return classify_s3_error(exc, what=self.describe(), where=self._where()) or super().classify_error(exc)

    def _where(self) -> str:
        """The connection, for errors raised before S3 answered."""
        return self._settings.describe() if self._settings is not None else f"aws_conn_id={self.aws_conn_id!r}"


__all__ = ["MAX_LISTED_KEYS", "S3KeyTrigger", "keys_payload", "resolve_targets"]
