"""The one TLS builder: an ``ssl.SSLContext`` from CA, client certificate and key files.

Loading certificate files is disk I/O, so :func:`build_ssl_context` runs in a worker thread,
never on the triggerer's loop, and contexts are cached per set of settings: a thousand waits on
one connection load its files once. Every wait that speaks TLS (HTTP's CA bundle, Kafka's SSL and
SASL_SSL) builds its context here; a bad file is one ``tls`` error naming the setting.
"""

from __future__ import annotations

import asyncio
import ssl
from typing import NamedTuple

from airflow_deferrable_kit.errors import ErrorType, FatalError


class TlsFiles(NamedTuple):
    """What a context is built from (the key password stays in memory, never in kwargs)."""

    cafile: str | None = None
    certfile: str | None = None
    keyfile: str | None = None
    password: str | None = None
    check_hostname: bool = True


_contexts: dict[TlsFiles, ssl.SSLContext] = {}


def _create(files: TlsFiles) -> ssl.SSLContext:
    context = ssl.create_default_context(purpose=ssl.Purpose.SERVER_AUTH, cafile=files.cafile)
    if files.certfile:
        context.load_cert_chain(files.certfile, files.keyfile, files.password)
    if not files.check_hostname:
        context.check_hostname = False
    return context


async def build_ssl_context(files: TlsFiles, *, where: str) -> ssl.SSLContext:
    """The context for ``files``, built once off the loop; a file that will not load is fatal."""
    context = _contexts.get(files)
    if context is None:
        try:
            context = await asyncio.to_thread(_create, files)
        except (OSError, ssl.SSLError, ValueError) as exc:
            raise FatalError(f"{where}: cannot load the TLS settings: {exc}", error_type=ErrorType.TLS) from exc
        _contexts[files] = context
    return context


__all__ = ["TlsFiles", "build_ssl_context"]
