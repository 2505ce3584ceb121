"""aiobotocore behind the S3 wait: connection -> client, botocore's errors -> ours, and botocore's internals.

* :func:`load_options` reads an Airflow ``aws`` connection, inside the triggerer, so no
  secret ever travels in trigger kwargs.
* :func:`new_client` builds the client off the loop. Building an aiobotocore client is mostly
  synchronous work: importing botocore, parsing its JSON models (``endpoints.json`` alone is
  over a megabyte), reading ``~/.aws`` files and, for the default credential chain, asking the
  instance metadata service. All of it, and the assembly of the client itself (tens of
  milliseconds of CPU; figures in docs/benchmarks.md), runs in one long-lived builder thread,
  once per shared client; the models are parsed once per process into one loader that every
  client reuses. The event loop only receives the finished client.
* :func:`classify_s3_error` is the one place botocore's exceptions become transient or fatal.
* The last section fences every use of aiobotocore's and botocore's private API, each with why.

The client is polled through :class:`airflow_deferrable_kit._s3.poller.S3Poller`, whose HEADs
and listing pages take the direct path of :mod:`airflow_deferrable_kit._s3.signed`.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import dataclasses
import functools
import gzip
import hashlib
import json
import logging
import os
import sys
import threading
import urllib.parse
import weakref
from collections.abc import Awaitable, Mapping
from typing import Any, Final

from airflow_deferrable_kit._redact import guard_loggers
from airflow_deferrable_kit.connections import get_connection, get_extra
from airflow_deferrable_kit.errors import ErrorType, FatalError, TransientError, WaitError

log = logging.getLogger(__name__)

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
class S3Options:
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
            error_type=ErrorType.BAD_CONNECTION,
        )
    return value


def options_from_connection(
    conn_id: str, login: str | None, password: str | None, extra: Mapping[str, Any]
) -> S3Options:
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
            error_type=ErrorType.BAD_CONNECTION,
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
            error_type=ErrorType.AUTHENTICATION,
        )
    verify = extra.get("verify")
    if verify is not None and not isinstance(verify, (bool, str)):
        raise FatalError(
            f"aws_conn_id={conn_id!r}: extra field 'verify' must be true, false or a CA bundle path",
            error_type=ErrorType.BAD_CONNECTION,
        )
    config_kwargs = extra.get("config_kwargs") or {}
    if not isinstance(config_kwargs, Mapping):
        raise FatalError(
            f"aws_conn_id={conn_id!r}: extra field 'config_kwargs' must be an object",
            error_type=ErrorType.BAD_CONNECTION,
        )
    return S3Options(
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


#: One instance per distinct settings among the live waits (see :func:`load_options`).
_settings_in_use: weakref.WeakValueDictionary[tuple[Any, ...], S3Options] = weakref.WeakValueDictionary()


def _shared(settings: S3Options) -> S3Options:
    """The instance live waits already hold for settings equal to ``settings``, else ``settings``."""
    fields = tuple(getattr(settings, field.name) for field in dataclasses.fields(settings))
    return _settings_in_use.setdefault(fields, settings)


async def load_options(aws_conn_id: str | None) -> S3Options:
    """Look the connection up (asynchronously) and read it; ``None`` means the default chain.

    Each wait reads its connection once per run, so a rotated key reaches the next wait; waits
    whose reads come out equal then keep one :class:`S3Options` (its strings and lease key
    included) instead of one each, a copy less per waiting trigger (docs/benchmarks.md).
    """
    if aws_conn_id is None:
        return _shared(S3Options(conn_id=None))
    try:
        conn = await get_connection(aws_conn_id, argument="aws_conn_id", conn_types=("aws", "s3"))
    except FatalError as exc:
        if aws_conn_id == DEFAULT_CONN_ID and exc.error_type == "connection_not_found":
            return _shared(S3Options(conn_id=None))
        raise
    extra = await get_extra(conn)
    return _shared(options_from_connection(aws_conn_id, conn.login, conn.password, extra))


# ------------------------------------------------------------------ off-loop preparation
class _GilFriendlyJSONFileLoader:
    """botocore's JSON file loader, parsing with the pure-Python scanner.

    The C parser holds the GIL for a whole file (tens of milliseconds for ``endpoints.json``),
    which stalls the event loop even from a worker thread. The Python scanner yields the GIL every few
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
                # Plain dicts, where botocore's own loader makes OrderedDicts: the same order
                # (dicts keep it), and the parsed S3 model and endpoint data take about a third
                # less memory, once per process (docs/benchmarks.md).
                decoder = json.JSONDecoder()
                # CPython's pure-Python scanner (json.scanner.py_make_scanner, outside its __all__).
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


def _build_client(settings: S3Options) -> Any:
    """Build the client, entirely in the calling (worker) thread; it is opened by the caller.

    Imports aiobotocore, makes a session that shares the process-wide loader, reads the
    ``~/.aws`` files, resolves the default credential chain if the connection has no keys
    (file reads and instance-metadata HTTP) and assembles the client (endpoint rules, operation
    methods, handler copies: the costly part), on a private event loop in this thread.

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
            error_type=ErrorType.BAD_CONNECTION,
        ) from exc

    async def build() -> Any:
        if not settings.explicit_keys and await session.get_credentials() is None:
            raise NoCredentialsError()
        return await _unentered_client(
            session,
            region_name=settings.region_name,
            endpoint_url=client_endpoint(settings.endpoint_url),
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


#: botocore's and aiobotocore's loggers that can write a credential or an endpoint, read from
#: botocore 1.43.117 and aiobotocore 3.10.0 (a filter runs only for the records its own logger
#: writes, not for its children's, so each is named). At DEBUG they write: the canonical request
#: and string to sign, session token included (``auth``); the request sent with its URL and
#: headers, and the response (``endpoint``; aiobotocore's endpoint, http session, parsers, hooks,
#: retry handlers and client write through botocore's loggers of the same module); response
#: headers and bodies, which a server may echo a credential in (``parsers``, ``handlers``); the
#: handlers called with their bound arguments (``hooks``); the endpoint rules' parameters and the
#: endpoint they resolved (``regions``, ``aiobotocore.regions``, ``endpoint_provider``); rewritten
#: request URIs and instance-metadata requests (``utils``, ``aiobotocore.utils``); an assumed
#: endpoint host (``client``); endpoint URLs from the config files and environment
#: (``configprovider``); session variables and ignored credentials (``session``); the failed
#: request's exception, which names its URL (``httpsession``, ``retryhandler``, ``retries.*``);
#: and credential providers' errors (``credentials``, ``aiobotocore.credentials``, ``tokens``).
CREDENTIAL_LOGGERS: Final = (
    "botocore.auth",
    "botocore.endpoint",
    "botocore.parsers",
    "botocore.handlers",
    "botocore.hooks",
    "botocore.regions",
    "botocore.endpoint_provider",
    "botocore.utils",
    "botocore.client",
    "botocore.configprovider",
    "botocore.session",
    "botocore.httpsession",
    "botocore.retryhandler",
    "botocore.retries.standard",
    "botocore.retries.special",
    "botocore.retries.adaptive",
    "botocore.credentials",
    "botocore.tokens",
    "aiobotocore.regions",
    "aiobotocore.utils",
    "aiobotocore.credentials",
    "aiobotocore.tokens",
    "aiobotocore.retries.adaptive",
)


def client_endpoint(endpoint_url: str | None) -> str | None:
    """``endpoint_url`` without a ``user:password@``, which S3 never reads (requests are SigV4-signed).

    aiohttp refuses a URL that carries credentials next to an ``Authorization`` header, so every
    request to such an endpoint would fail; boto3 (the official provider's client) ignores them.
    Dropping them here gives the same outcome as boto3, and keeps the password out of what
    botocore logs about its endpoint.
    """
    if not endpoint_url or "@" not in endpoint_url:
        return endpoint_url
    parts = urllib.parse.urlsplit(endpoint_url)
    if parts.username is None and parts.password is None:
        return endpoint_url
    return parts._replace(netloc=parts.netloc.rpartition("@")[2]).geturl()


async def new_client(settings: S3Options) -> Any:
    """An open aiobotocore S3 client, built in a worker thread so the event loop never waits."""
    guard_loggers(CREDENTIAL_LOGGERS)
    client = await asyncio.get_running_loop().run_in_executor(_builder_executor(), _build_client, settings)
    return await client.__aenter__()


# ------------------------------------------------------------------------- errors -> ours
#: Error codes meaning "no such object (yet)". HEAD has no body, so S3 reports a bare "404".
MISSING_CODES: Final = frozenset({"404", "NoSuchKey", "NotFound"})
THROTTLING_CODES: Final = frozenset(
    {
        "SlowDown",
        "Throttling",
        "ThrottlingException",
        "ThrottledException",
        "RequestThrottled",
        "RequestThrottledException",
        "TooManyRequestsException",
        "RequestLimitExceeded",
        "BandwidthLimitExceeded",
        "PriorRequestNotComplete",
    }
)
RETRYABLE_CODES: Final = frozenset(
    {"RequestTimeout", "RequestTimeoutException", "InternalError", "ServiceUnavailable", "OperationAborted"}
)
CREDENTIAL_CODES: Final = frozenset(
    {
        "InvalidAccessKeyId",
        "SignatureDoesNotMatch",
        "ExpiredToken",
        "InvalidToken",
        "TokenRefreshRequired",
        "InvalidClientTokenId",
        "UnrecognizedClientException",
    }
)
ACCESS_CODES: Final = frozenset({"AccessDenied", "AllAccessDisabled", "AccountProblem", "InvalidObjectState"})


class S3Missing(Exception):
    """S3 answered "no such key" (a 404): whether that means "not yet" or a missing bucket is the wait's to say.

    :func:`s3_request` raises it for botocore's ``ClientError`` (kept as :attr:`error`), so a
    trigger never handles botocore's own type; :func:`classify_s3_error` classifies it as that error.
    """

    def __init__(self, code: str, error: BaseException) -> None:
        super().__init__(code)
        self.code = code
        self.error = error


async def s3_request(what: str, where: str, request: Awaitable[Any]) -> Any:
    """Await one S3 request, with botocore's errors turned into ours.

    A "missing" answer (404, ``NoSuchKey``) is raised as :class:`S3Missing`: only the caller
    knows whether it means "not yet" or a missing bucket. Every other ``ClientError`` becomes
    the transient or fatal error :func:`classify_s3_error` makes of it.
    """
    try:
        return await request
    except Exception as exc:
        errors = sys.modules.get("botocore.exceptions")  # imported by then: the client is built
        if errors is None or not isinstance(exc, errors.ClientError):
            raise
        code = missing_code(exc)
        if code is not None:
            raise S3Missing(code, exc) from exc
        error = classify_s3_error(exc, what=what, where=where)
        if error is None:  # not reached: every ClientError is classified
            raise
        raise error from exc


def missing_code(exc: Any) -> str | None:
    """The code of a botocore ``ClientError`` that means "no such object (yet)"; ``None`` otherwise.

    Not an error to classify: what a missing object or bucket means is the wait's to say.
    """
    code = str((exc.response.get("Error") or {}).get("Code") or "")
    return code if code in MISSING_CODES else None


def _retry_after(headers: Mapping[str, Any]) -> float | None:
    """``Retry-After`` in seconds, the header's name in any case (the direct path keeps the server's)."""
    for name, value in headers.items():
        if str(name).lower() == "retry-after":
            try:
                return float(value)
            except (TypeError, ValueError):
                return None
    return None


def retry_after_of(exc: BaseException) -> float | None:
    """The seconds a server asked to wait before asking again, from a botocore error or one of ours."""
    response = getattr(exc, "response", None)
    if isinstance(response, Mapping):
        return _retry_after((response.get("ResponseMetadata") or {}).get("HTTPHeaders") or {})
    value = getattr(exc, "retry_after", None)
    return float(value) if isinstance(value, (int, float)) else None


def classify_s3_error(exc: BaseException, *, what: str, where: str) -> WaitError | None:
    """Transient or fatal for botocore's errors; ``None`` if ``exc`` is not one of them.

    ``what`` names the request an error response answered (e.g. ``HEAD s3://b/k``), ``where``
    the connection, for the errors raised before any response (credentials, TLS, network).
    botocore is looked up, not imported: if nothing imported it, ``exc`` is none of its errors.
    """
    if isinstance(exc, S3Missing):
        exc = exc.error
    errors = sys.modules.get("botocore.exceptions")
    if errors is None:
        return None
    if isinstance(exc, errors.ClientError):
        error = exc.response.get("Error") or {}
        meta = exc.response.get("ResponseMetadata") or {}
        code = str(error.get("Code") or "")
        status = int(meta.get("HTTPStatusCode") or (code if code.isdigit() else 0))
        detail = error.get("Message") or ""
        seen = f"{what}: {code or status}" + (f" ({detail})" if detail and detail != code else "")
        if code in THROTTLING_CODES or status in (429, 503):
            return TransientError(
                f"throttled, {seen}",
                retry_after=_retry_after(meta.get("HTTPHeaders") or {}),
                error_type=ErrorType.THROTTLED,
            )
        if status >= 500 or code in RETRYABLE_CODES:
            return TransientError(f"server error, {seen}", error_type=ErrorType.UNAVAILABLE)
        if code == "NoSuchBucket":
            return FatalError(f"{seen}: the bucket does not exist", error_type=ErrorType.NOT_FOUND)
        if code in CREDENTIAL_CODES:
            return FatalError(
                f"{seen}: the credentials were rejected; check the connection's keys or session token",
                error_type=ErrorType.AUTHENTICATION,
            )
        if status == 403 or code in ACCESS_CODES:
            cause = "access denied"
            if code == "403":  # a HEAD response has no body, so no error code to tell the causes apart
                cause = "access denied or credentials rejected (HEAD responses carry no error code)"
            return FatalError(
                f"{seen}: {cause}. The identity needs s3:GetObject on the keys and s3:ListBucket on the bucket "
                "(without ListBucket, S3 answers 403 instead of 404 for a key that does not exist yet)",
                error_type=ErrorType.AUTHORIZATION,
            )
        return FatalError(f"{seen} (HTTP {status})", error_type=ErrorType.BAD_REQUEST)
    if isinstance(exc, (errors.NoCredentialsError, errors.PartialCredentialsError)):
        return FatalError(
            f"{where}: no AWS credentials found. Put the access key id and secret in the connection's "
            "login and password, or give the triggerer an identity the default chain can find",
            error_type=ErrorType.AUTHENTICATION,
        )
    if isinstance(exc, (errors.CredentialRetrievalError, errors.TokenRetrievalError)):
        return FatalError(f"{where}: could not obtain credentials: {exc}", error_type=ErrorType.AUTHENTICATION)
    if isinstance(exc, errors.SSLError):
        return FatalError(f"{where}: TLS error: {exc}", error_type=ErrorType.TLS)
    if isinstance(exc, (errors.ConnectionError, errors.HTTPClientError)):
        return TransientError(f"{where}: {type(exc).__name__}: {exc}", error_type=ErrorType.NETWORK)
    if isinstance(exc, errors.BotoCoreError):
        return FatalError(f"{where}: {type(exc).__name__}: {exc}", error_type=ErrorType.BAD_CONFIGURATION)
    return None


# ------------------------------------------------------------------ private API, fenced
# Every use of aiobotocore's or botocore's private API is one of the functions below, and each
# says why the public API does not do. Checked against aiobotocore 3.10.0 on botocore 1.43.117;
# re-read them after upgrading either. tests/integration/s3/test_signed.py compares the requests they
# make with botocore's own, and tests/integration/s3/test_client.py builds clients through them.

#: ``signature_version`` settings under which S3 requests are signed with plain SigV4.
_SIGV4_SETTINGS: Final = (None, "v4", "s3v4")


async def _unentered_client(session: Any, **kwargs: Any) -> Any:
    """``AioSession._create_client("s3", ...)``: the coroutine behind ``session.create_client()``.

    ``create_client()`` returns a context manager that builds *and enters* the client where it
    is used; here the client is built in a worker thread, on a private loop (:func:`_build_client`),
    and entered later on the trigger's loop (:func:`new_client`), so only the building is wanted.
    """
    return await session._create_client("s3", **kwargs)


def user_agent(client: Any) -> str | None:
    """The ``User-Agent`` botocore sends for ``client`` (``BaseClient._user_agent_creator``), if any.

    A direct request sends the same one, so S3 (and its access logs) sees the same client;
    botocore has no public accessor for it.
    """
    try:
        agent: str = client._user_agent_creator.to_string()
    except AttributeError:
        return None
    return agent


async def resolve_sigv4_endpoint(client: Any, operation_name: str, bucket: str) -> tuple[str, str] | None:
    """``(url, signing region)`` for ``operation_name`` in ``bucket`` by botocore's endpoint rules.

    ``None`` when the request is not a plain SigV4 one for ``s3`` (another ``signature_version``,
    S3 Express, multi-region access points, extra headers) or the rules do not resolve: such
    requests go through botocore's full path. botocore has no public way to resolve an endpoint
    without sending a request; ``AioBaseClient._resolve_endpoint_ruleset`` is how it resolves one
    itself, and it fills ``context["signing"]`` in place. The context has the keys botocore's
    ``_make_api_call`` gives it.
    """
    config = client.meta.config
    if getattr(config, "signature_version", None) not in _SIGV4_SETTINGS:
        return None
    operation = client.meta.service_model.operation_model(operation_name)
    context: dict[str, Any] = {
        "client_region": client.meta.region_name,
        "client_config": config,
        "has_streaming_input": False,
        "auth_type": operation.resolved_auth_type,
    }
    try:
        url, headers, properties = await client._resolve_endpoint_ruleset(operation, {"Bucket": bucket}, context)
    except Exception:  # botocore's own path reports whatever this is, the usual way
        log.debug("Endpoint rules did not resolve s3://%s; its requests go through botocore", bucket, exc_info=True)
        return None
    scheme = (properties.get("authSchemes") or [{}])[0]
    signing = context.get("signing") or {}
    region = signing.get("region") or client.meta.region_name
    if headers or scheme.get("name") != "sigv4" or signing.get("signing_name", "s3") != "s3" or not region:
        return None
    return url, region


async def send_signed(client: Any, method: str, url: str, *, region: str, agent: str | None) -> Any:
    """Sign a body-less request with the client's SigV4 signer and send it through the client's pool.

    botocore has no public way to send a request it did not build. ``BaseClient._request_signer``
    ``.get_auth_instance`` gives the signer with the client's current credentials (refreshed when
    they expire); ``BaseClient._endpoint.http_session`` is the client's own HTTP session (its pool,
    timeouts, TLS and proxy settings, and its mapping of network errors to botocore's
    exceptions). The signer reads S3's payload-signing options from
    ``request.context["client_config"]``, as it does on botocore's own path.
    """
    from botocore.awsrequest import AWSRequest

    request = AWSRequest(method=method, url=url, headers={"User-Agent": agent} if agent else {})
    request.context["client_config"] = client.meta.config
    auth = await client._request_signer.get_auth_instance(
        signing_name="s3", region_name=region, signature_version="s3v4"
    )
    auth.add_auth(request)
    return await client._endpoint.http_session.send(request.prepare())
