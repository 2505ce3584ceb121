"""Known secrets never leave the kit: not in payloads, error messages or the log lines it writes.

A server may echo what it was sent (a 401 body quoting the ``Authorization`` header, a 500 page
dumping the request), and a URL in a connection may carry ``user:password@``. Whatever a wait
resolves from its connection that could be a credential is registered here when it is resolved,
in every form it may travel in (plain, base64, HTTP basic auth, URL-quoted), and
:func:`redact` replaces each with ``***``. Registered values are also handed to Airflow's own
secrets masker, so Airflow's log pipeline hides them in lines the kit did not write.

A URL a *server* chose (a redirect's ``Location``, the URL the answer finally came from) may
carry credentials the kit never saw before: a pre-signed download URL holds ``X-Amz-Signature``
and ``X-Amz-Credential``, a SAS URL ``sig``, an OAuth callback ``access_token``. They cannot be
registered in advance, so :func:`redact_url` masks them by the *name* of their parameter
(:func:`is_secret_param`), keeping the name so a reader sees one was there.

Some client libraries log credentials themselves at DEBUG: botocore writes the canonical request
it signs (session token included) and the headers it sends. :func:`guard_loggers` puts a
:class:`RedactingFilter` on such loggers, so turning them on to debug a wait shows ``***``
wherever a registered secret would be, with or without Airflow's log pipeline. A logger's
filters run only for records it actually emits, so a guarded logger costs nothing while its
level keeps DEBUG off.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import logging
import re
from collections.abc import Iterable, Mapping
from typing import Any
from urllib.parse import quote, unquote_plus, urlsplit

#: What a redacted value becomes.
MASK = "***"
#: Shorter values are not secrets worth masking (and would mask ordinary words); Airflow's own
#: masker uses the same floor (``[logging] min_length_masked_secret``, default 5).
MIN_SECRET_CHARS = 5
#: Keys of a connection's extra whose values are secrets (matched as substrings, lowercase,
#: with ``-`` read as ``_``), after Airflow's own list of sensitive field names.
SENSITIVE_KEYS = (
    "password",
    "passwd",
    "passphrase",
    "secret",
    "token",
    "api_key",
    "apikey",
    "authorization",
    "private_key",
    "credential",
    "sasl_plain",
    "session",
    "auth",
    "cookie",
    "signature",
)

#: Query and fragment parameter names whose values are credentials in a URL a server chose,
#: matched as substrings of the lowercased name (``X-Amz-Signature``, ``access_token``,
#: ``apiKey``, ``sig``), besides every key :func:`is_sensitive_key` knows.
SECRET_PARAM_MARKERS = (
    "signature",
    "sig",
    "credential",
    "token",
    "key",
    "pass",
    "pwd",
    "secret",
    "auth",
    "session",
    "cookie",
    "jwt",
    "hmac",
)
#: Cloud signing parameters, all masked: S3's ``X-Amz-*`` and GCS's ``X-Goog-*``.
SECRET_PARAM_PREFIXES = ("x-amz-", "x-goog-")
#: Short names matched whole (as substrings they would hit every word): Azure SAS's expiry,
#: start, permissions and signing-key fields (its ``sig`` is a marker), an OAuth ``code``.
SECRET_PARAM_NAMES = frozenset({"se", "st", "sp", "skoid", "sktid", "skt", "ske", "sks", "skv", "code"})

#: ``name=value`` after ``?``, ``&``, ``;`` or ``#`` (a query or fragment parameter, in a URL
#: or in a message quoting one); a value ends at a separator, whitespace, a quote or a bracket.
_URL_PARAM = re.compile(r"(?P<lead>[?&;#])(?P<name>[^=&;#?\s'\"<>]+)=(?P<value>[^&;#\s'\"<>]+)")
#: ``scheme://user:password@``: the password.
_URL_PASSWORD = re.compile(r"(?P<head>[A-Za-z][A-Za-z0-9+.-]*://[^/@:\s'\"<>]*:)[^/@\s'\"<>]+@")

_secrets: set[str] = set()
_pattern: re.Pattern[str] | None = None


def _forms(secret: str, login: str | None) -> set[str]:
    """Every form ``secret`` may travel in."""
    forms = {secret, quote(secret, safe=""), quote(secret), base64.b64encode(secret.encode()).decode("ascii")}
    if login:
        pair = f"{login}:{secret}"
        forms |= {pair, base64.b64encode(pair.encode()).decode("ascii"), f"{quote(login, safe='')}:{quote(secret)}"}
    return {form for form in forms if len(form) >= MIN_SECRET_CHARS}


def register(secret: Any, *, login: str | None = None) -> bool:
    """Remember ``secret`` (and its encodings) for :func:`redact`; ``True`` if it was new."""
    global _pattern
    if not isinstance(secret, str) or len(secret) < MIN_SECRET_CHARS or secret in _secrets:
        return False
    new = _forms(secret, login) - _secrets
    _secrets.update(new)
    _secrets.add(secret)
    _pattern = None
    _tell_airflow(new)
    return True


def register_connection(conn: Any, extra: Mapping[str, Any] | None = None) -> None:
    """Register the secrets of an Airflow connection: its password, sensitive extras, URL passwords."""
    login = getattr(conn, "login", None) or None
    register(getattr(conn, "password", None), login=login)
    for text in (getattr(conn, "host", None), getattr(conn, "schema", None)):
        register_url_password(text)
    for key, value in _walk(extra or {}):
        if isinstance(value, str):
            register_url_password(value)
            if is_sensitive_key(key):
                register(value, login=login)


def register_url_password(text: Any) -> None:
    """A URL's ``user:password@`` password, if ``text`` is such a URL."""
    if not isinstance(text, str) or "@" not in text or "://" not in text:
        return
    with contextlib.suppress(ValueError):
        parts = urlsplit(text)
        if parts.password:
            register(parts.password, login=parts.username)


def is_sensitive_key(key: str) -> bool:
    """Whether a field or header named ``key`` carries a credential (``X-Api-Key``, ``sasl.password``)."""
    name = key.lower().replace("-", "_").replace(".", "_")
    return any(marker in name for marker in SENSITIVE_KEYS) or name.endswith("key")


def is_secret_param(name: str) -> bool:
    """Whether a URL query or fragment parameter named ``name`` carries a credential.

    Case-insensitive, on the decoded name: a substring of :data:`SECRET_PARAM_MARKERS`, a prefix
    of :data:`SECRET_PARAM_PREFIXES`, one of :data:`SECRET_PARAM_NAMES`, or a sensitive key.
    """
    lowered = unquote_plus(name).strip().lower()
    return (
        any(marker in lowered for marker in SECRET_PARAM_MARKERS)
        or lowered.startswith(SECRET_PARAM_PREFIXES)
        or lowered in SECRET_PARAM_NAMES
        or is_sensitive_key(lowered)
    )


def redact_url(text: str) -> str:
    """``text`` (a URL, or a message quoting URLs) with each secret-looking parameter's value masked.

    Every query or fragment parameter whose name :func:`is_secret_param` flags keeps its name and
    gets :data:`MASK` for a value (``?X-Amz-Signature=***&part=1``), and a ``user:password@``
    password becomes :data:`MASK`. For URLs a server chose, whose secrets were never registered.
    """
    if not text or ("=" not in text and "@" not in text):
        return text
    text = _URL_PASSWORD.sub(lambda match: f"{match['head']}{MASK}@", text)

    def mask(match: re.Match[str]) -> str:
        if not is_secret_param(match["name"]):
            return match[0]
        return f"{match['lead']}{match['name']}={MASK}"

    return _URL_PARAM.sub(mask, text)


def redact(text: str) -> str:
    """``text`` with every registered secret replaced by :data:`MASK`."""
    global _pattern
    if not _secrets or not text:
        return text
    if _pattern is None:
        _pattern = re.compile("|".join(re.escape(form) for form in sorted(_secrets, key=len, reverse=True)))
    return _pattern.sub(MASK, text)


def redact_value(value: Any) -> Any:
    """A JSON value with every string in it (keys included) redacted."""
    if not _secrets:
        return value
    if isinstance(value, str):
        return redact(value)
    if isinstance(value, dict):
        return {redact(key): redact_value(item) for key, item in value.items()}
    if isinstance(value, list):
        return [redact_value(item) for item in value]
    return value


class RedactingFilter(logging.Filter):
    """Rewrites a record whose text holds a registered secret into the redacted text."""

    def filter(self, record: logging.LogRecord) -> bool:
        if _secrets:
            text = record.getMessage()
            masked = redact(text)
            if masked != text:
                record.msg, record.args = masked, None
        return True


_FILTER = RedactingFilter()


def guard_loggers(names: Iterable[str]) -> None:
    """Redact registered secrets from what the loggers ``names`` write (idempotent)."""
    for name in names:
        logger = logging.getLogger(name)
        if _FILTER not in logger.filters:
            logger.addFilter(_FILTER)


def _walk(mapping: Mapping[str, Any], prefix: str = "") -> Iterable[tuple[str, Any]]:
    for key, value in mapping.items():
        name = f"{prefix}.{key}" if prefix else str(key)
        if isinstance(value, Mapping):
            yield from _walk(value, name)
        else:
            yield name, value


def _tell_airflow(forms: Iterable[str]) -> None:
    """Hand the forms to Airflow's secrets masker for its own log pipeline (best effort).

    Airflow's masker recompiles one regular expression of every secret it knows on each
    addition (tens of milliseconds in a fresh process): inside an event loop that work goes to
    a worker thread, never onto the loop.
    """
    forms = tuple(forms)
    try:
        loop = asyncio.get_running_loop()
    except RuntimeError:
        _add_to_airflow(forms)
        return
    pending = loop.run_in_executor(None, _add_to_airflow, forms)
    _handing_over.add(pending)
    pending.add_done_callback(_handing_over.discard)


_handing_over: set[asyncio.Future[None]] = set()


def _add_to_airflow(forms: tuple[str, ...]) -> None:
    with contextlib.suppress(Exception):
        from airflow.sdk._shared.secrets_masker import _secrets_masker

        masker = _secrets_masker()
        for form in forms:
            masker.add_mask(form)


__all__ = [
    "MASK",
    "RedactingFilter",
    "guard_loggers",
    "is_secret_param",
    "is_sensitive_key",
    "redact",
    "redact_url",
    "redact_value",
    "register",
    "register_connection",
    "register_url_password",
]
