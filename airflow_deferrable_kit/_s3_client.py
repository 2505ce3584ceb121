"""The aiobotocore S3 client behind the S3 wait: settings from an Airflow connection, built off the loop.

Building an aiobotocore client is mostly synchronous work: importing botocore (~0.3 s), parsing
its JSON models (``endpoints.json`` alone is 1.2 MB), reading ``~/.aws`` files and, for the
default credential chain, asking the instance metadata service. All of it, and the
assembly of the client itself (~50 ms of CPU), runs in a worker thread
(one long-lived builder thread), once per shared client; the models are parsed once per process
into one loader that every client reuses. The event loop only receives the finished client.

Every S3 wait of one connection then polls through one :class:`S3Poller` around that client.
A HEAD skips botocore's per-request machinery (event hooks, endpoint rules, serialization,
response parsing), which is most of a poll's CPU: the endpoint botocore's rules give for the
bucket is resolved once, and each HEAD is signed by botocore's own SigV4 signer and sent through
the client's own connection pool. Identical listings are shared: waits whose patterns have the
same literal prefix use one ``ListObjectsV2`` of it, started at most a short window earlier.

Credentials never leave this module: the trigger carries an ``aws_conn_id`` and the secret is
read here, in the process that makes the requests.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import dataclasses
import functools
import gzip
import hashlib
import http.client
import json
import logging
import os
import threading
import urllib.parse
from collections import OrderedDict
from collections.abc import Callable, Coroutine, Mapping, Sequence
from typing import Any, Final

from airflow_deferrable_kit.connections import get_connection, get_extra
from airflow_deferrable_kit.payload import FatalError

#: The connection id the official Amazon provider falls back from to the default credential
#: chain when it is not defined; we do the same for this id only, so a typo elsewhere fails loudly.
DEFAULT_CONN_ID = "aws_default"
#: Client options we set unless the connection's ``config_kwargs`` says otherwise.
DEFAULT_CONFIG: Mapping[str, Any] = {"connect_timeout": 10, "read_timeout": 30, "max_pool_connections": 20}
#: One attempt per request: the trigger's own backoff (full jitter, deadline-aware) does retries,
#: so one poll is one request and a throttled bucket is not hit again by botocore's retry loop.
NO_RETRIES: Mapping[str, Any] = {"mode": "standard", "total_max_attempts": 1}
#: Data files every S3 client reads; parsed once per process, in a thread.
_GENERIC_DATA = ("endpoints", "partitions", "sdk-default-configuration", "_retry")
_S3_MODELS = ("service-2", "paginators-1", "waiters-2", "endpoint-rule-set-1")


@dataclasses.dataclass(frozen=True)
class S3Settings:
    """Everything needed to build a client; secrets are kept out of ``repr``."""

    conn_id: str | None
    region_name: str | None = None
    endpoint_url: str | None = None
    access_key_id: str | None = dataclasses.field(default=None, repr=False)
    secret_access_key: str | None = dataclasses.field(default=None, repr=False)
    session_token: str | None = dataclasses.field(default=None, repr=False)
    profile_name: str | None = None
    verify: bool | str | None = None
    config_json: str = "{}"

    @property
    def explicit_keys(self) -> bool:
        return bool(self.access_key_id and self.secret_access_key)

    @functools.cached_property
    def lease_key(self) -> tuple[str, str | None, str | None, str | None, str]:
        """The shared-client key: connection, region, endpoint, plus a digest of the rest.

        The digest (never the secret itself) makes a rotated key or changed option get a new
        client instead of silently reusing one built with the old values.
        """
        material = json.dumps(dataclasses.astuple(self), default=str).encode()
        return ("s3", self.conn_id, self.region_name, self.endpoint_url, hashlib.sha256(material).hexdigest()[:16])

    def describe(self) -> str:
        where = self.endpoint_url or f"AWS {self.region_name or 'default region'}"
        how = "connection keys" if self.explicit_keys else "the default credential chain"
        return f"aws_conn_id={self.conn_id!r} ({where}, {how})"


def _optional_str(extra: Mapping[str, Any], name: str, conn_id: str) -> str | None:
    value = extra.get(name)
    if value is None or value == "":
        return None
    if not isinstance(value, str):
        raise FatalError(
            f"aws_conn_id={conn_id!r}: extra field {name!r} must be a string, got {type(value).__name__}",
            error_type="bad_connection",
        )
    return value


def settings_from_connection(
    conn_id: str, login: str | None, password: str | None, extra: Mapping[str, Any]
) -> S3Settings:
    """Read an Airflow ``aws`` connection the way the Amazon provider does (the subset we support).

    ``login``/``password`` are the access key id and secret (``extra.aws_access_key_id`` /
    ``extra.aws_secret_access_key`` also work); ``extra`` may hold ``region_name``,
    ``endpoint_url`` (``service_config.s3.endpoint_url`` wins), ``aws_session_token``,
    ``profile_name``, ``verify`` and ``config_kwargs``. No keys means the default chain.
    """
    if extra.get("role_arn") or extra.get("assume_role_method"):
        raise FatalError(
            f"aws_conn_id={conn_id!r}: role assumption (extra.role_arn) is not supported by the S3 wait yet; "
            "use a connection with keys, or give the triggerer an identity the default credential chain finds "
            "(environment, ~/.aws profile, container or instance role)",
            error_type="unsupported_connection",
        )
    service_config = extra.get("service_config") or {}
    s3_config = service_config.get("s3") if isinstance(service_config, Mapping) else None
    endpoint_url = _optional_str(extra, "endpoint_url", conn_id)
    if isinstance(s3_config, Mapping) and s3_config.get("endpoint_url"):
        endpoint_url = _optional_str(s3_config, "endpoint_url", conn_id)
    access_key_id = login or _optional_str(extra, "aws_access_key_id", conn_id)
    secret_access_key = password or _optional_str(extra, "aws_secret_access_key", conn_id)
    if bool(access_key_id) != bool(secret_access_key):
        missing = "password (secret access key)" if access_key_id else "login (access key id)"
        raise FatalError(
            f"aws_conn_id={conn_id!r} has only half of a key pair: the {missing} is empty",
            error_type="invalid_credentials",
        )
    verify = extra.get("verify")
    if verify is not None and not isinstance(verify, (bool, str)):
        raise FatalError(
            f"aws_conn_id={conn_id!r}: extra field 'verify' must be true, false or a CA bundle path",
            error_type="bad_connection",
        )
    config_kwargs = extra.get("config_kwargs") or {}
    if not isinstance(config_kwargs, Mapping):
        raise FatalError(
            f"aws_conn_id={conn_id!r}: extra field 'config_kwargs' must be an object", error_type="bad_connection"
        )
    return S3Settings(
        conn_id=conn_id,
        region_name=_optional_str(extra, "region_name", conn_id),
        endpoint_url=endpoint_url,
        access_key_id=access_key_id or None,
        secret_access_key=secret_access_key or None,
        session_token=_optional_str(extra, "aws_session_token", conn_id) if access_key_id else None,
        profile_name=_optional_str(extra, "profile_name", conn_id),
        verify=verify,
        config_json=json.dumps(dict(config_kwargs), sort_keys=True, default=str),
    )


async def resolve_settings(aws_conn_id: str | None) -> S3Settings:
    """Look the connection up (asynchronously) and read it; ``None`` means the default chain."""
    if aws_conn_id is None:
        return S3Settings(conn_id=None)
    try:
        conn = await get_connection(aws_conn_id, argument="aws_conn_id")
    except FatalError as exc:
        if aws_conn_id == DEFAULT_CONN_ID and exc.error_type == "connection_not_found":
            return S3Settings(conn_id=None)
        raise
    extra = await get_extra(conn)
    return settings_from_connection(aws_conn_id, conn.login, conn.password, extra)


# ------------------------------------------------------------------ off-loop preparation
class _GilFriendlyJSONFileLoader:
    """botocore's JSON file loader, parsing with the pure-Python scanner.

    The C parser holds the GIL for a whole file (~50 ms for ``endpoints.json``), which stalls
    the event loop even from a worker thread. The Python scanner yields the GIL every few
    milliseconds; it is slower, but it runs once per process, in a thread.
    """

    def exists(self, file_path: str) -> bool:
        return os.path.isfile(file_path + ".json") or os.path.isfile(file_path + ".json.gz")

    def load_file(self, file_path: str) -> Any:
        import json.scanner

        for suffix, opener in ((".json", open), (".json.gz", gzip.open)):
            path = file_path + suffix
            if os.path.isfile(path):
                with opener(path, "rb") as handle:
                    text = handle.read().decode("utf-8")
                decoder = json.JSONDecoder(object_pairs_hook=OrderedDict)
                decoder.scan_once = json.scanner.py_make_scanner(decoder)  # type: ignore[attr-defined]
                return decoder.decode(text)
        return None


_loaders: dict[str | None, Any] = {}
_loaders_lock = threading.Lock()


def _shared_loader(data_path: str | None) -> Any:
    """The process-wide botocore loader for ``data_path``, with the S3 models already parsed."""
    from botocore.loaders import create_loader

    with _loaders_lock:
        loader = _loaders.get(data_path)
        if loader is None:
            loader = create_loader(data_path)
            loader.file_loader = _GilFriendlyJSONFileLoader()
            for name in _GENERIC_DATA:
                loader.load_data_with_path(name)
            for type_name in _S3_MODELS:
                loader.load_service_model("s3", type_name)
            _loaders[data_path] = loader
        return loader


def _build_client(settings: S3Settings) -> Any:
    """Build the client, entirely in the calling (worker) thread; it is opened by the caller.

    Imports aiobotocore, makes a session that shares the process-wide loader, reads the
    ``~/.aws`` files, resolves the default credential chain if the connection has no keys
    (file reads and instance-metadata HTTP) and assembles the client (~50 ms of CPU: endpoint
    rules, operation methods, handler copies), on a private event loop in this thread.

    Building binds nothing to that loop (asyncio locks bind lazily, on first contention), so the
    trigger's loop can use the client. It is *entered* there, because aiobotocore versions
    before 3 open their aiohttp session, which belongs to the running loop, in ``__aenter__``.
    """
    from aiobotocore.config import AioConfig
    from aiobotocore.session import AioSession
    from botocore.exceptions import NoCredentialsError

    session = AioSession(profile=settings.profile_name)
    session.register_component("data_loader", _shared_loader(session.get_config_variable("data_path")))
    session.get_scoped_config()
    session.get_auth_token()
    options = {**DEFAULT_CONFIG, **json.loads(settings.config_json), "retries": dict(NO_RETRIES)}
    try:
        config = AioConfig(**options)
    except (TypeError, ValueError) as exc:
        raise FatalError(
            f"aws_conn_id={settings.conn_id!r}: extra.config_kwargs is not a valid botocore Config: {exc}",
            error_type="bad_connection",
        ) from exc

    async def build() -> Any:
        if not settings.explicit_keys and await session.get_credentials() is None:
            raise NoCredentialsError()
        # The coroutine behind session.create_client(), which would also enter the client.
        return await session._create_client(
            "s3",
            region_name=settings.region_name,
            endpoint_url=settings.endpoint_url,
            aws_access_key_id=settings.access_key_id,
            aws_secret_access_key=settings.secret_access_key,
            aws_session_token=settings.session_token,
            verify=settings.verify,
            config=config,
        )

    return asyncio.run(build())


#: One long-lived thread builds every client. Starting a pool thread makes the caller wait until
#: the new thread runs, which on a busy host holds the event loop for tens of milliseconds; a
#: single thread is started once per process, and client builds are rare and short anyway.
_builder: concurrent.futures.ThreadPoolExecutor | None = None
_builder_lock = threading.Lock()


def _builder_executor() -> concurrent.futures.ThreadPoolExecutor:
    global _builder
    with _builder_lock:
        if _builder is None:
            _builder = concurrent.futures.ThreadPoolExecutor(max_workers=1, thread_name_prefix="adk-s3-client")
        return _builder


async def create_client(settings: S3Settings) -> Any:
    """An open aiobotocore S3 client, built in a worker thread so the event loop never waits."""
    client = await asyncio.get_running_loop().run_in_executor(_builder_executor(), _build_client, settings)
    return await client.__aenter__()


# ------------------------------------------------------------------ polling through the shared client
log = logging.getLogger(__name__)

#: A poll may answer from a listing that started at most this fraction of the wait's poll
#: interval before the poll did (and at most :data:`LISTING_REUSE_MAX` seconds before).
LISTING_REUSE_FRACTION: Final = 0.1
#: The longest time, in seconds, a listing may have started before a poll that uses it.
LISTING_REUSE_MAX: Final = 1.0
#: Seconds a bucket's existence, once confirmed, answers for every wait of the connection.
BUCKET_CHECK_REUSE: Final = 60.0
#: Statuses handed over to botocore, whose region redirector recognises a bucket that lives in
#: another region by them (a request signed for the wrong region gets a redirect or a 400).
_REDIRECT_STATUSES: Final = frozenset({301, 302, 307, 400})
_SIGNATURE_VERSIONS: Final = (None, "v4", "s3v4")


def listing_reuse_window(poll_interval: float) -> float:
    """How old (from its start) a shared listing may be and still answer a wait's poll.

    An object present when a listing starts is in it, so a wait that uses a listing started at
    most this long before its own poll sees an object at most one poll interval plus this window
    after the object appeared.
    """
    return min(LISTING_REUSE_MAX, LISTING_REUSE_FRACTION * poll_interval)


@dataclasses.dataclass(frozen=True)
class Listing:
    """Every object under one prefix, as one paginated ``ListObjectsV2`` saw it, in key order.

    Many waits match their own pattern against one listing. A pattern's literal tail (the text
    after its last wildcard) picks the candidate keys through an index built once per tail
    length, so a thousand waits on one prefix do not each scan every key.
    """

    keys: tuple[str, ...]
    #: ``(size, etag, last_modified)`` of each key; ``last_modified`` may still be S3's text.
    details: tuple[tuple[int | None, str | None, Any], ...]
    _by_tail: dict[int, dict[str, list[int]]] = dataclasses.field(default_factory=dict, repr=False, compare=False)

    def candidates(self, tail: str) -> Sequence[int]:
        """Indexes, in key order, of the keys that end with ``tail`` (every key for ``""``)."""
        if not tail:
            return range(len(self.keys))
        size = len(tail)
        index = self._by_tail.get(size)
        if index is None:
            index = self._by_tail[size] = {}
            for position, key in enumerate(self.keys):
                index.setdefault(key[-size:], []).append(position)
        return index.get(tail, ())

    def detail(self, index: int) -> tuple[int | None, str | None, Any]:
        """``(size, etag, last_modified)`` of one key, the time parsed as botocore parses it.

        Parsing a timestamp costs more than the rest of a listed object together, so it is done
        only for the objects a wait reports.
        """
        from botocore.utils import parse_timestamp

        size, etag, modified = self.details[index]
        return size, etag, parse_timestamp(modified) if isinstance(modified, str) else modified


@dataclasses.dataclass
class _Shared:
    """One request (or paginated listing) whose answer several waits share."""

    started: float  # loop time at which its first request was about to be sent
    task: asyncio.Task[Any]
    waiters: int = 0
    expiry: asyncio.TimerHandle | None = None

    def failed(self) -> bool:
        return self.task.done() and (self.task.cancelled() or self.task.exception() is not None)


@dataclasses.dataclass(frozen=True)
class _Route:
    """Where a bucket's requests go and how they are signed, as botocore's endpoint rules say."""

    base_url: str  # the bucket's URL without a trailing slash: objects are under it
    region: str

    @property
    def bucket_url(self) -> str:
        """The URL bucket-level requests go to (``…/bucket`` path style, ``https://bucket.host/``)."""
        return self.base_url if urllib.parse.urlsplit(self.base_url).path else self.base_url + "/"


_UNRESOLVED: Final = object()


class S3Poller:
    """What every S3 wait of one connection polls through: one per connection per process.

    ``head_object`` and listings return what botocore would parse, or raise the ``ClientError``
    botocore would raise for the same response, so errors are classified the same way. They skip
    botocore's per-request machinery, which is most of a poll's CPU: the endpoint (host, path or
    virtual-host addressing, signing region) comes from botocore's endpoint rules once per
    bucket, each request is signed by botocore's SigV4 signer with the client's current
    credentials and sent by the client's own HTTP session (its pool, timeouts, TLS and proxy
    settings, and its mapping of network errors to botocore's exceptions), and a listing's XML
    is read with ElementTree directly. Anything else goes through botocore unchanged: a bucket
    whose rules ask for another signer (S3 Express, multi-region access points), a configured
    ``signature_version``, and a request answered by a redirect or a bare 400 (a bucket in
    another region), which botocore's region redirector then follows.
    """

    def __init__(self, client: Any) -> None:
        self.client = client
        self._routes: dict[tuple[str, str], Any] = {}
        self._shared: dict[tuple[str, ...], _Shared] = {}
        try:
            self._user_agent: str | None = client._user_agent_creator.to_string()
        except AttributeError:
            self._user_agent = None

    # ---------------------------------------------------------------------------- HEAD
    async def head_object(self, bucket: str, key: str) -> dict[str, Any] | None:
        """``ContentLength``, ``ETag`` and ``LastModified`` of an object, as botocore parses them.

        ``None`` when S3 answers 404: the usual answer of a poll, so it builds no exception.
        """
        from botocore.utils import parse_timestamp, percent_encode

        route = await self._route("HeadObject", bucket)
        if route is None:
            return await self._botocore_head(bucket, key)
        response = await self._send(route, "HEAD", f"{route.base_url}/{percent_encode(key, safe='/~')}")
        status, headers = response.status_code, response.headers
        if status == 404:
            return None
        if status < 300:
            length, modified = headers.get("content-length"), headers.get("last-modified")
            return {
                "ContentLength": int(length) if length is not None else None,
                "ETag": headers.get("etag"),
                "LastModified": parse_timestamp(modified) if modified is not None else None,
            }
        if status in _REDIRECT_STATUSES:
            self._routes.pop(("HeadObject", bucket), None)  # resolved again, with what botocore learns
            return await self._botocore_head(bucket, key)
        raise _client_error(status, headers, b"", "HeadObject")

    async def _botocore_head(self, bucket: str, key: str) -> dict[str, Any] | None:
        from botocore.exceptions import ClientError

        try:
            return dict(await self.client.head_object(Bucket=bucket, Key=key))
        except ClientError as exc:
            if (exc.response.get("ResponseMetadata") or {}).get("HTTPStatusCode") == 404:
                return None
            raise

    async def head_bucket(self, bucket: str) -> Any:
        """botocore's own ``head_bucket``; a success answers every wait for :data:`BUCKET_CHECK_REUSE` s.

        Waits ask once, on their first 404, so a thousand waits deferred together on one bucket
        would otherwise send a thousand of these at the same moment.
        """
        return await self._share(
            ("bucket", bucket), BUCKET_CHECK_REUSE, BUCKET_CHECK_REUSE, lambda: self.client.head_bucket(Bucket=bucket)
        )

    # ------------------------------------------------------------------------- listings
    async def list_prefix(self, bucket: str, prefix: str, *, max_age: float) -> Listing:
        """Every object under ``prefix``, from a listing that started at most ``max_age`` s ago.

        A listing of the same ``(bucket, prefix)`` that is in flight or finished, and started
        within ``max_age`` seconds, is shared instead of sending another: N waits on one prefix
        cost about one listing per window, not N. A failed listing is never reused: the waits
        that shared it all get its error, and the next poll lists again.
        """
        listing: Listing = await self._share(
            ("list", bucket, prefix), max_age, LISTING_REUSE_MAX, lambda: self._list(bucket, prefix)
        )
        return listing

    async def _list(self, bucket: str, prefix: str) -> Listing:
        """Page through ``ListObjectsV2`` of ``prefix`` (no delimiter: keys at any depth)."""
        keys: list[str] = []
        details: list[tuple[int | None, str | None, Any]] = []
        token: str | None = None
        while True:
            token = await self._list_page(bucket, prefix, token, keys, details)
            if token is None:
                return Listing(tuple(keys), tuple(details))

    async def _list_page(
        self, bucket: str, prefix: str, token: str | None, keys: list[str], details: list[tuple[Any, Any, Any]]
    ) -> str | None:
        """Append one page's objects to ``keys``/``details``; return the next page's token, if any."""
        from botocore.utils import percent_encode_sequence

        route = await self._route("ListObjectsV2", bucket)
        if route is not None:
            query = [("list-type", "2"), ("prefix", prefix)]
            if token is not None:
                query.append(("continuation-token", token))
            query.append(("encoding-type", "url"))
            response = await self._send(route, "GET", f"{route.bucket_url}?{percent_encode_sequence(query)}")
            status = response.status_code
            if status < 300:
                return _read_page(await response.content, keys, details)
            if status not in _REDIRECT_STATUSES:
                raise _client_error(status, response.headers, await response.content, "ListObjectsV2")
            self._routes.pop(("ListObjectsV2", bucket), None)  # resolved again, with what botocore learns
        request = {"Bucket": bucket, "Prefix": prefix}
        if token is not None:
            request["ContinuationToken"] = token
        page = await self.client.list_objects_v2(**request)
        for item in page.get("Contents") or ():
            keys.append(item["Key"])
            details.append((item.get("Size"), item.get("ETag"), item.get("LastModified")))
        following = page.get("NextContinuationToken")
        return following if page.get("IsTruncated") and following else None

    # -------------------------------------------------------------------------- requests
    async def _route(self, operation_name: str, bucket: str) -> _Route | None:
        """How requests of ``operation_name`` in ``bucket`` go; ``None``: through botocore's full path.

        Resolved once per operation and bucket, by botocore's endpoint rules (the same answer
        for every key: the rules do not look at keys or prefixes).
        """
        route = self._routes.get((operation_name, bucket), _UNRESOLVED)
        if route is _UNRESOLVED:
            route = self._routes[operation_name, bucket] = await self._resolve(operation_name, bucket)
        return route

    async def _resolve(self, operation_name: str, bucket: str) -> _Route | None:
        config = self.client.meta.config
        if getattr(config, "signature_version", None) not in _SIGNATURE_VERSIONS:
            return None
        operation = self.client.meta.service_model.operation_model(operation_name)
        context: dict[str, Any] = {
            "client_region": self.client.meta.region_name,
            "client_config": config,
            "has_streaming_input": False,
            "auth_type": operation.resolved_auth_type,
        }
        resolve = self.client._resolve_endpoint_ruleset
        try:
            url, headers, properties = await resolve(operation, {"Bucket": bucket}, context)
        except Exception:  # botocore's own path reports whatever this is, the usual way
            log.debug("Endpoint rules did not resolve s3://%s; its requests go through botocore", bucket, exc_info=True)
            return None
        scheme = (properties.get("authSchemes") or [{}])[0]
        signing = context.get("signing") or {}
        region = signing.get("region") or self.client.meta.region_name
        if headers or scheme.get("name") != "sigv4" or signing.get("signing_name", "s3") != "s3" or not region:
            return None
        return _Route(base_url=url[:-1] if url.endswith("/") else url, region=region)

    async def _send(self, route: _Route, method: str, url: str) -> Any:
        """Sign a body-less request with botocore's SigV4 signer and send it through the client's pool."""
        from botocore.awsrequest import AWSRequest

        request = AWSRequest(
            method=method, url=url, headers={"User-Agent": self._user_agent} if self._user_agent else {}
        )
        request.context["client_config"] = self.client.meta.config  # the signer reads S3 payload-signing options
        auth = await self.client._request_signer.get_auth_instance(
            signing_name="s3", region_name=route.region, signature_version="s3v4"
        )
        auth.add_auth(request)
        return await self.client._endpoint.http_session.send(request.prepare())

    # ---------------------------------------------------------------------------- sharing
    async def _share(
        self, what: tuple[str, ...], max_age: float, keep: float, fetch: Callable[[], Coroutine[Any, Any, Any]]
    ) -> Any:
        """The answer of ``fetch()``, shared with every caller of the same ``what``.

        An answer whose request started at most ``max_age`` seconds ago, finished or still in
        flight, is reused; past that (or after a failure) ``fetch()`` runs again, in its own task
        so that one caller's cancellation does not fail the others. A good answer is dropped
        ``keep`` seconds after its start; a failed one at once, after every caller got its error.
        """
        loop = asyncio.get_running_loop()
        entry = self._shared.get(what)
        if entry is None or loop.time() - entry.started > max_age or entry.failed():
            entry = _Shared(started=loop.time(), task=loop.create_task(fetch()))
            self._shared[what] = entry
            entry.task.add_done_callback(functools.partial(self._settled, what, entry, keep))
        entry.waiters += 1
        try:
            return await asyncio.shield(entry.task)
        finally:
            entry.waiters -= 1
            if not entry.waiters and not entry.task.done():
                entry.task.cancel()  # every caller that wanted it was cancelled

    def _settled(self, what: tuple[str, ...], entry: _Shared, keep: float, task: asyncio.Task[Any]) -> None:
        if task.cancelled() or task.exception() is not None:  # retrieving the error marks it seen
            self._forget(what, entry)
            return
        entry.expiry = asyncio.get_running_loop().call_at(entry.started + keep, self._forget, what, entry)

    def _forget(self, what: tuple[str, ...], entry: _Shared) -> None:
        if self._shared.get(what) is entry:
            del self._shared[what]

    async def close(self) -> None:
        """Stop shared requests nobody waits for any more and close the client's pool."""
        for entry in self._shared.values():
            entry.task.cancel()
            if entry.expiry is not None:
                entry.expiry.cancel()
        self._shared.clear()
        await self.client.close()


def _local(tag: str) -> str:
    """An XML tag without its namespace."""
    return tag.rpartition("}")[2]


def _read_page(body: bytes, keys: list[str], details: list[tuple[Any, Any, Any]]) -> str | None:
    """Append the objects of one ``ListBucketResult`` page; return its continuation token, if any."""
    from xml.etree import ElementTree

    try:
        root = ElementTree.fromstring(body)
    except ElementTree.ParseError as exc:
        from botocore.parsers import ResponseParserError  # what botocore raises for the same body

        raise ResponseParserError(f"unreadable ListObjectsV2 response ({exc}): {body[:120]!r}") from exc
    ns = root.tag[: -len(_local(root.tag))]
    decode = urllib.parse.unquote_plus if root.findtext(f"{ns}EncodingType") == "url" else None
    for item in root.iterfind(f"{ns}Contents"):
        key = item.findtext(f"{ns}Key") or ""
        size = item.findtext(f"{ns}Size")
        keys.append(decode(key) if decode else key)
        details.append(
            (int(size) if size else None, item.findtext(f"{ns}ETag"), item.findtext(f"{ns}LastModified") or None)
        )
    token = root.findtext(f"{ns}NextContinuationToken")
    return token if root.findtext(f"{ns}IsTruncated") == "true" and token else None


def _client_error(status: int, headers: Mapping[str, str], body: bytes, operation_name: str) -> Exception:
    """The ``ClientError`` botocore raises for an S3 error response: the code from the XML body,
    or, without one (every HEAD error), the HTTP status as the code."""
    from xml.etree import ElementTree

    from botocore.exceptions import ClientError

    error = {"Code": str(status), "Message": http.client.responses.get(status, "")}
    metadata: dict[str, Any] = {
        "RequestId": headers.get("x-amz-request-id", ""),
        "HostId": headers.get("x-amz-id-2", ""),
    }
    if body:
        try:
            root = ElementTree.fromstring(body)
        except ElementTree.ParseError:
            root = None
        if root is not None and _local(root.tag) == "Error":
            fields = {_local(child.tag): child.text or "" for child in root}
            metadata["RequestId"] = fields.pop("RequestId", metadata["RequestId"])
            metadata["HostId"] = fields.pop("HostId", metadata["HostId"])
            error = {**error, **fields}
    metadata.update(HTTPStatusCode=status, HTTPHeaders=dict(headers), RetryAttempts=0)
    return ClientError({"Error": error, "ResponseMetadata": metadata}, operation_name)


async def close_poller(poller: S3Poller) -> None:
    """Close a poller (the last lease calls this)."""
    await poller.close()
