"""A trigger row as the page shows it: the kit's wait kind and its target, never the raw kwargs.

Trigger kwargs are stored in the ``trigger`` table (JSON on Airflow 3's deferral path, Fernet
on others) and may hold anything a trigger author put there. The page shows, for the kit's own
triggers only, the few named fields that say *what* is awaited (bucket and key, endpoint, table,
topics, moment) and the connection id, each one redacted; every other field, and every field of
another provider's trigger, stays out of the page. The trigger class itself is shown for every
row: it is a classpath, not data.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

from airflow_deferrable_kit._redact import redact, redact_url
from airflow_deferrable_kit.audit._triggers import KINDS, KIT_TRIGGERS, decode_kwargs, kind_of

UTC = dt.timezone.utc
#: What the kind filter offers: every kit kind, ``kit`` (any of the kit's triggers) and
#: ``other`` (every other provider's trigger).
KIND_CHOICES = ("s3", "s3-unchanged", "http", "postgres", "kafka", "datetime", "kit", "other")
#: Longest target text shown; longer ones end with an ellipsis.
MAX_TARGET_CHARS = 160


@dataclass(frozen=True)
class Wait:
    """What a trigger waits for, as the page shows it: ``kind`` empty for another provider's."""

    kind: str
    target: str
    deadline: dt.datetime | None = None


def classpaths_prefixes(kind: str) -> list[str]:
    """Classpath prefixes (``LIKE 'x%'``) of the triggers of one kind, for filtering in SQL."""
    if kind == "kit":
        return [KIT_TRIGGERS]
    return [f"{KIT_TRIGGERS}{module}." for module, named in KINDS.items() if named == kind]


def _text(value: Any) -> str:
    if isinstance(value, (list, tuple)):
        items = [str(item) for item in value]
        if not items:
            return ""
        return items[0] if len(items) == 1 else f"{items[0]} (+{len(items) - 1} more)"
    return "" if value is None else str(value)


def _endpoint(value: Any) -> str:
    """An endpoint with its query's values dropped: a token may ride in a query string."""
    text = _text(value)
    path, _, query = text.partition("?")
    path = redact_url(path)  # a user:password@ in a full URL
    if not urlsplit(text).query:
        return path
    names = [pair.split("=", 1)[0] for pair in query.split("&") if pair]
    return path + "?" + "&".join(f"{name}=…" for name in names)


def _s3(kwargs: Mapping[str, Any]) -> str:
    key = _text(kwargs.get("bucket_key") or kwargs.get("prefix"))
    bucket = kwargs.get("bucket_name")
    if bucket and not key.startswith("s3://"):
        return f"s3://{bucket}/{key}"
    return key


def _target(kind: str, kwargs: Mapping[str, Any]) -> str:
    """The named fields of one kit wait that say what it waits for, and its connection id."""
    if kind in ("s3", "s3-unchanged"):
        text, conn = _s3(kwargs), kwargs.get("aws_conn_id")
    elif kind == "http":
        method = kwargs.get("method") or "GET"
        text, conn = f"{method} {_endpoint(kwargs.get('endpoint'))}", kwargs.get("http_conn_id")
    elif kind == "postgres":
        text = f"table {kwargs['table']}" if kwargs.get("table") else "custom SQL"
        conn = kwargs.get("postgres_conn_id")
    elif kind == "kafka":
        text = "topic " + _text(kwargs.get("topics"))
        conn = kwargs.get("kafka_conn_id") or kwargs.get("kafka_config_id")
    elif kind == "datetime":
        text, conn = _text(kwargs.get("target_time") or kwargs.get("rule")), None
    else:
        return ""
    text = f"{conn}: {text}" if conn else text
    text = redact(text if kind == "http" else redact_url(text))  # http: query values already dropped
    return text if len(text) <= MAX_TARGET_CHARS else text[: MAX_TARGET_CHARS - 1] + "…"


def _deadline(kwargs: Mapping[str, Any]) -> dt.datetime | None:
    value = kwargs.get("deadline")
    if not isinstance(value, str):
        return None
    try:
        moment = dt.datetime.fromisoformat(value)
    except ValueError:
        return None
    return moment.astimezone(UTC) if moment.tzinfo else moment.replace(tzinfo=UTC)


def describe(classpath: str, stored_kwargs: str | None) -> Wait:
    """The wait behind one trigger row: its kit kind and target, and the kit's own deadline.

    Another provider's trigger is described by its class alone: its kwargs are never decoded.
    """
    kind = kind_of(classpath)
    if not kind:
        return Wait("", "")
    kwargs = decode_kwargs(stored_kwargs)
    if kwargs is None:
        return Wait(kind, "")
    return Wait(kind, _target(kind, kwargs), _deadline(kwargs))
