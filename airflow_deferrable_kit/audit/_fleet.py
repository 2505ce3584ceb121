"""Waits on one upstream held by several triggerers: each of them makes the shared request.

Everything the kit shares between waits (a listing per S3 folder, a statement per Postgres
table or query, a reader per Kafka connection, a response per identical HTTP request) is shared
within one triggerer process. The ``trigger`` table says, now, which triggerer holds each wait,
so it shows where a shared request is made once per triggerer instead of once: the waits on one
upstream held by three triggerers make its listing three times per poll. Deferred tasks can be
routed to one pool of triggerers with ``trigger_queue``; watchers (``AssetWatcher``) cannot, as
Airflow 3.3.2 gives their triggers no queue.
"""

from __future__ import annotations

import hashlib
from collections.abc import Collection, Mapping
from dataclasses import dataclass, field
from typing import Any

import sqlalchemy as sa

from airflow_deferrable_kit._redact import redact, redact_url
from airflow_deferrable_kit.audit._triggers import KIT_TRIGGERS, decode_kwargs, kind_of
from airflow_deferrable_kit.audit.schema import ASSET_WATCHER, TI, TRIGGER

#: What the triggerer shares among the waits on one upstream, per wait kind.
SHARED: dict[str, str] = {
    "s3": "listing",
    "s3-unchanged": "listing",
    "http": "request",
    "postgres": "statement",
    "kafka": "reader",
}
RECIPE = "docs/operations.md#one-upstream-one-pool-of-triggerers"
#: Characters that start an S3 wildcard: the folder shared is the literal part before them.
WILDCARDS = "*?["


@dataclass(frozen=True)
class Upstream:
    """What the waits of one kind share in a triggerer: its kind, a name for it, the thing shared."""

    kind: str
    name: str
    shared: str


def _first(value: Any) -> str:
    if isinstance(value, (list, tuple)):
        return str(value[0]) if value else ""
    return "" if value is None else str(value)


def _s3_folder(kwargs: Mapping[str, Any]) -> str:
    """``s3://bucket/folder/`` of a wait's (first) key or prefix: the listing its triggerer shares."""
    key = _first(kwargs.get("bucket_key") or kwargs.get("prefix"))
    bucket = _first(kwargs.get("bucket_name"))
    if key.startswith("s3://"):
        bucket, _, key = key[len("s3://") :].partition("/")
    literal = key
    for wildcard in WILDCARDS:
        literal = literal.split(wildcard, 1)[0]
    folder = literal.rsplit("/", 1)[0] + "/" if "/" in literal else ""
    return f"s3://{bucket}/{folder}"


def upstream_of(kind: str, kwargs: Mapping[str, Any]) -> Upstream | None:
    """The upstream a kit wait shares with the others on it; ``None`` for a wait that shares none."""
    shared = SHARED.get(kind)
    if shared is None:
        return None
    if kind in ("s3", "s3-unchanged"):
        conn, name = kwargs.get("aws_conn_id"), _s3_folder(kwargs)
    elif kind == "http":
        method = str(kwargs.get("method") or "GET").upper()
        path, _, query = _first(kwargs.get("endpoint")).partition("?")
        conn, name = kwargs.get("http_conn_id"), f"{method} {path}{'?…' if query else ''}"
    elif kind == "postgres":
        conn = kwargs.get("postgres_conn_id")
        if kwargs.get("table"):
            name = f"table {kwargs['table']}"
        else:  # a query is named by its digest: its text may hold anything
            name = "query " + hashlib.sha256(str(kwargs.get("sql", "")).encode()).hexdigest()[:8]
    else:
        conn, name = kwargs.get("kafka_conn_id") or kwargs.get("kafka_config_id"), "Kafka connection"
    return Upstream(kind, redact(redact_url(f"{conn}: {name}" if conn else name)), shared)


@dataclass
class Spread:
    """The waits on one upstream held by more than one triggerer now."""

    upstream: Upstream
    waits: int = 0
    #: Of ``waits``: the watchers' triggers, which Airflow 3.3.2 routes by no queue.
    watchers: int = 0
    holders: set[int] = field(default_factory=set)
    queues: set[str] = field(default_factory=set)

    @property
    def triggerers(self) -> int:
        return len(self.holders)

    def advice(self) -> str:
        times = f"its {self.upstream.shared} is made {self.triggerers} times per poll, once per triggerer"
        tasks = self.waits - self.watchers
        if not tasks:
            return (
                f"{times}; these are watchers, which Airflow 3.3.2 routes by no queue: "
                "fewer triggerers without --queues hold them closer together"
            )
        if self.queues:
            queues = ", ".join(sorted(self.queues))
            return (
                f"{times}; already routed ({queues}): that pool has {self.triggerers} triggerers "
                "holding them (two keep failover, more multiply the request)"
            )
        routed = f"{tasks} deferred task(s)" + (f" (not the {self.watchers} watcher(s))" if self.watchers else "")
        return (
            f"{times}; give the {routed} one trigger_queue and run two triggerers with --queues <it>: "
            f"made twice at most, failover kept ({RECIPE})"
        )

    def as_dict(self) -> dict[str, Any]:
        return {
            "kind": self.upstream.kind,
            "upstream": self.upstream.name,
            "shared": self.upstream.shared,
            "waits": self.waits,
            "watchers": self.watchers,
            "triggerers": self.triggerers,
            "queues": sorted(self.queues),
            "advice": self.advice(),
        }


def spread_upstreams(connection: sa.Connection, dag_ids: Collection[str] | None = None) -> list[Spread]:
    """Every upstream whose waits more than one triggerer holds now, the most multiplied first.

    Reads each kit trigger held by a triggerer (classpath, kwargs, holder, queue, whether a
    watcher serves it) once; another provider's trigger is never decoded. With ``dag_ids``,
    only the triggers of those DAGs' task instances count (a watcher belongs to no one DAG).
    """
    watched = sa.exists().where(ASSET_WATCHER.c.trigger_id == TRIGGER.c.id)
    query = sa.select(
        TRIGGER.c.classpath, TRIGGER.c.kwargs, TRIGGER.c.triggerer_id, TRIGGER.c.queue, watched.label("watched")
    ).where(TRIGGER.c.triggerer_id.is_not(None), TRIGGER.c.classpath.startswith(KIT_TRIGGERS, autoescape=True))
    if dag_ids is not None:
        query = query.where(sa.exists().where(TI.c.trigger_id == TRIGGER.c.id, TI.c.dag_id.in_(sorted(dag_ids))))
    rows = connection.execute(query)
    spreads: dict[Upstream, Spread] = {}
    for row in rows:
        kwargs = decode_kwargs(row.kwargs)
        upstream = upstream_of(kind_of(row.classpath), kwargs) if kwargs is not None else None
        if upstream is None:
            continue
        spread = spreads.setdefault(upstream, Spread(upstream))
        spread.waits += 1
        spread.watchers += bool(row.watched)
        spread.holders.add(int(row.triggerer_id))
        if row.queue:
            spread.queues.add(str(row.queue))
    multiplied = [spread for spread in spreads.values() if spread.triggerers > 1]
    return sorted(multiplied, key=lambda s: (-s.triggerers, -s.waits, s.upstream.kind, s.upstream.name))
