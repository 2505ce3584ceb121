"""The aiobotocore S3 client behind the S3 wait: settings from an Airflow connection, built off the loop.

Building an aiobotocore client is mostly synchronous work: importing botocore (~0.3 s), parsing
its JSON models (``endpoints.json`` alone is 1.2 MB), reading ``~/.aws`` files and, for the
default credential chain, asking the instance metadata service. All of it, and the
assembly of the client itself (~50 ms of CPU), runs in a worker thread
(one long-lived builder thread), once per shared client; the models are parsed once per process
into one loader that every client reuses. The event loop only receives the finished client.

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
import json
import os
import threading
from collections import OrderedDict
from collections.abc import Mapping
from typing import Any

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


async def close_client(client: Any) -> None:
    """Close the client's connection pool (the last lease calls this)."""
    await client.close()
