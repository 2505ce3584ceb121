"""The one TLS builder: an ``ssl.SSLContext`` from CA, client certificate and key files.

Loading certificate files is disk I/O, so :func:`build_ssl_context` runs in a worker thread,
never on the triggerer's loop, and contexts are cached per set of settings: a thousand waits on
one connection load its files once. Every wait that speaks TLS (HTTP's CA bundle, Kafka's SSL and
SASL_SSL) builds its context here; a bad file is one ``tls`` error naming the setting.

:func:`read_refusal` tells a server that rejected our client certificate from an outage: with
TLS 1.3 the server judges the client's certificate after the client has finished its side of
the handshake, so its alert reaches the client library as a connection closed in the middle of
its start-up, which every retry rule reads as the network's fault.
"""

from __future__ import annotations

import asyncio
import socket
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


#: Seconds a refusal probe may take; it runs only after a server dropped a TLS connection mid-start.
PROBE_TIMEOUT = 5.0


def _refusal(host: str, port: int, context: ssl.SSLContext, preamble: bytes, expect: bytes) -> str | None:
    with socket.create_connection((host, port), timeout=PROBE_TIMEOUT) as raw:
        if preamble:
            raw.sendall(preamble)
            if raw.recv(len(expect)) != expect:
                return None
        try:
            with context.wrap_socket(raw, server_hostname=host) as tls:
                tls.settimeout(1.0)  # a refusal is the first record; silence means we were let in
                tls.recv(1)
        except ssl.SSLCertVerificationError:
            return None  # the server's certificate, not ours: the client library says so itself
        except ssl.SSLError as exc:
            return str(exc.reason or exc).replace("_", " ").lower()
        except TimeoutError:
            return None
    return None


async def read_refusal(
    host: str, port: int, context: ssl.SSLContext, *, preamble: bytes = b"", expect: bytes = b""
) -> str | None:
    """The TLS alert a server answers our handshake with (``"tlsv1 alert unknown ca"``), if any.

    One blocking handshake with ``context`` in a worker thread (``preamble`` first, for protocols
    that upgrade a plain connection, answered by ``expect``). ``None`` when the server lets us in,
    cannot be reached, or fails otherwise: then the client library's own error stands.
    """
    try:
        return await asyncio.wait_for(
            asyncio.to_thread(_refusal, host, port, context, preamble, expect), PROBE_TIMEOUT + 1
        )
    except (asyncio.TimeoutError, OSError):
        return None


__all__ = ["TlsFiles", "build_ssl_context", "read_refusal"]
