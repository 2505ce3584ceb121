"""The official providers' event-trigger calls, ported: change the import, keep the call.

``from airflow_deferrable_kit.triggers.official_events import MessageQueueTrigger`` (or
``KafkaMessageQueueTrigger``, ``AwaitMessageTrigger``, ``KafkaSharedStreamTrigger``,
``HttpEventTrigger``) takes the official signature and builds this kit's event trigger:
:class:`~airflow_deferrable_kit.triggers.kafka_events.KafkaMessageEventTrigger` or
:class:`~airflow_deferrable_kit.triggers.http_events.HttpBatchReadyEventTrigger`. They are
functions, not classes, for the reason the official ``MessageQueueTrigger`` is a dispatcher whose
``serialize()`` names the trigger it picked: what runs in the triggerer, and what Airflow hashes
to identify the watcher, is the kit's trigger, with the kit's parameters only. So the kwargs
stored in the ``trigger`` table never hold an official name, and a watcher built from the
official call is the same watcher (same hash, same watermark) as the one built with the kit's
own names.

An official argument with no safe equivalent is refused when the DAG is parsed, with a
``TypeError`` naming the official trigger, the argument and what to write instead (as the
sensors refuse theirs); spelling out its official default asks for nothing different and is
accepted. Keyword arguments of the kit's trigger (``success=``, ``fire_on_change=``,
``backfill=``, ``value_format=`` ...) may be given too, to finish a port the official arguments
cannot express. docs/migration.md has the table, parameter by parameter.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping, Sequence
from typing import Any, Final
from urllib.parse import urlparse

from airflow_deferrable_kit.triggers.http_events import HttpBatchReadyEventTrigger
from airflow_deferrable_kit.triggers.kafka_events import KafkaMessageEventTrigger

_HEADERS: Final = (
    "put headers in the connection extras (each extra key other than the options is sent as a header, or an "
    "extra 'headers' object): trigger kwargs are stored in plain text in the trigger table, so a token there "
    "is readable by anyone who can read the metadata database"
)
_RESPONSE_CHECK: Final = (
    "pass response_check_path='pkg.module.function' (called with the requests.Response, sync or async), or say "
    "it as data: success=[{'path': 'state', 'equals': 'ready'}], or fire_on_change='id' to fire once per new "
    "value (a release id); a callable cannot be stored for the triggerer"
)
_KAFKA_SCHEMES: Final = ("kafka",)


def _refuse(official: str, name: str, message: str) -> TypeError:
    return TypeError(f"{official}: {name}= of the official trigger is not supported here: {message}")


def _kit_options(official: str, target: type, options: Mapping[str, Any]) -> dict[str, Any]:
    """The kit's own keyword arguments given next to the official ones; an unknown name is refused."""
    known = {field.name for field in dataclasses.fields(target) if field.init}
    unknown = sorted(set(options) - known)
    if unknown:
        raise TypeError(
            f"{official}() got unexpected keyword argument(s) {', '.join(unknown)}: neither the official "
            f"{official} nor {target.__name__} takes them (see docs/migration.md, 'Event triggers')"
        )
    return dict(options)


def _poll_timeout(official: str, value: Any) -> None:
    """How long one confluent ``poll()`` blocks: no outcome depends on it, so any duration is a no-op."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value < 0:
        raise ValueError(f"{official}: poll_timeout must be a number of seconds >= 0, got {value!r}")


# ----------------------------------------------------------------------------------- Kafka
def AwaitMessageTrigger(
    topics: Sequence[str],
    apply_function: str | None = None,
    kafka_config_id: str = "kafka_default",
    apply_function_args: Sequence[Any] | None = None,
    apply_function_kwargs: dict[str, Any] | None = None,
    poll_timeout: float = 1,
    poll_interval: float = 5,
    commit_offset: bool = True,
    **options: Any,
) -> KafkaMessageEventTrigger:
    """``airflow.providers.apache.kafka.triggers.await_message.AwaitMessageTrigger`` as a watcher.

    Fires one event per message ``apply_function`` answers truthy for (every message without
    one), from the watcher's watermark, never committing to a consumer group. ``commit_offset``
    is the watermark here: ``True`` (the official default) is accepted, ``False`` refused.
    Without ``value_format`` the values reach the function as they are (``bytes``); without a
    function every message fires with its value as text, as officially.
    """
    return _kafka_watcher(
        "AwaitMessageTrigger",
        topics=topics,
        apply_function=apply_function,
        kafka_config_id=kafka_config_id,
        apply_function_args=apply_function_args,
        apply_function_kwargs=apply_function_kwargs,
        poll_timeout=poll_timeout,
        poll_interval=poll_interval,
        commit_offset=commit_offset,
        options=options,
    )


def KafkaMessageQueueTrigger(
    *,
    topics: Sequence[str],
    kafka_config_id: str = "kafka_default",
    apply_function: str,
    apply_function_args: list[Any] | None = None,
    apply_function_kwargs: dict[str, Any] | None = None,
    poll_timeout: float = 1,
    poll_interval: float = 5,
    **options: Any,
) -> KafkaMessageEventTrigger:
    """``airflow.providers.apache.kafka.triggers.msg_queue.KafkaMessageQueueTrigger`` as a watcher.

    The official class is ``MessageQueueTrigger(scheme="kafka", ...)``; so is this.
    """
    return MessageQueueTrigger(
        scheme="kafka",
        topics=topics,
        kafka_config_id=kafka_config_id,
        apply_function=apply_function,
        apply_function_args=apply_function_args,
        apply_function_kwargs=apply_function_kwargs,
        poll_timeout=poll_timeout,
        poll_interval=poll_interval,
        **options,
    )


def MessageQueueTrigger(
    *,
    queue: str | None = None,
    scheme: str | None = None,
    trigger_queue: str | None = None,
    **kwargs: Any,
) -> KafkaMessageEventTrigger:
    """``airflow.providers.common.messaging.triggers.msg_queue.MessageQueueTrigger`` for Kafka, as a watcher.

    Both official forms: ``queue="kafka://host:port/topic1,topic2"`` (the topics from the URL's
    path unless ``topics=`` is given; the host is not used officially either, the brokers come
    from ``kafka_config_id``'s connection) and ``scheme="kafka", topics=[...]``. The rest are
    ``AwaitMessageTrigger``'s arguments (see :func:`AwaitMessageTrigger`). Other schemes (SQS,
    Redis) have no trigger in this kit and are refused.
    """
    official = "MessageQueueTrigger"
    if trigger_queue is not None:
        raise _refuse(
            official,
            "trigger_queue",
            "Airflow 3.3.2 routes no AssetWatcher trigger to a triggerer queue (BaseEventTrigger."
            "supports_triggerer_queue is False), so it would be silently ignored; remove it",
        )
    if queue is not None:
        if not isinstance(queue, str) or urlparse(queue).scheme not in _KAFKA_SCHEMES:
            raise _refuse(
                official,
                "queue",
                f"only Kafka queues ('kafka://host:port/topic') have a trigger here, got {queue!r}",
            )
        if "topics" not in kwargs:
            raw = urlparse(queue).path.lstrip("/")
            topics = [topic for topic in raw.split(",") if topic] if raw else []
            if not topics:
                example = "'kafka://host:port/topic1,topic2'"
                raise ValueError(f"{official}: queue={queue!r} names no topic; write {example} or pass topics=")
            kwargs["topics"] = topics
    elif scheme is None:
        raise ValueError(f"{official}: give queue='kafka://host:port/topic' or scheme='kafka' with topics=[...]")
    elif scheme not in _KAFKA_SCHEMES:
        raise _refuse(official, "scheme", f"only scheme='kafka' has a trigger here, got {scheme!r}")
    if "topics" not in kwargs:
        raise ValueError(f"{official}: scheme='kafka' needs topics=[...]")
    arguments = {
        name: kwargs.pop(name)
        for name in (
            "topics",
            "apply_function",
            "kafka_config_id",
            "apply_function_args",
            "apply_function_kwargs",
            "poll_timeout",
            "poll_interval",
            "commit_offset",
        )
        if name in kwargs
    }
    arguments.setdefault("kafka_config_id", "kafka_default")
    return _kafka_watcher(official, options=kwargs, **arguments)


def _kafka_watcher(
    official: str,
    *,
    topics: Any,
    apply_function: Any = None,
    kafka_config_id: Any = "kafka_default",
    apply_function_args: Any = None,
    apply_function_kwargs: Any = None,
    poll_timeout: Any = 1,
    poll_interval: Any = 5,
    commit_offset: Any = True,
    options: Mapping[str, Any],
) -> KafkaMessageEventTrigger:
    if commit_offset is not True:
        raise _refuse(
            official,
            "commit_offset",
            "a watcher here reads without a consumer group and keeps its position as a watermark in the asset "
            "state store, saved once its events are stored, so a downstream task's commit would not move it; "
            "remove commit_offset",
        )
    _poll_timeout(official, poll_timeout)
    _refuse_topic_list_typo(official, topics)
    extra = _kit_options(official, KafkaMessageEventTrigger, options)
    extra.setdefault("value_format", "bytes" if apply_function is not None else "text")
    return KafkaMessageEventTrigger(
        topics=list(topics) if isinstance(topics, (list, tuple)) else topics,
        kafka_config_id=kafka_config_id,
        apply_function=apply_function,
        apply_function_args=list(apply_function_args)
        if isinstance(apply_function_args, tuple)
        else apply_function_args,
        apply_function_kwargs=apply_function_kwargs,
        poll_interval=poll_interval,
        **extra,
    )


def _refuse_topic_list_typo(official: str, topics: Any) -> None:
    """``["a, b"]`` (one string) is one illegal topic name: say what was probably meant."""
    names = [topics] if isinstance(topics, str) else topics if isinstance(topics, (list, tuple)) else []
    for name in names:
        if isinstance(name, str) and "," in name:
            parts = [part.strip() for part in name.split(",") if part.strip()]
            raise ValueError(
                f"{official}: topics holds {name!r}, one string with a comma, which no Kafka topic is called; "
                f"list each topic: topics={parts!r}"
            )


def KafkaSharedStreamTrigger(
    *,
    topics: Sequence[str],
    kafka_config_id: str = "kafka_default",
    poll_timeout: float = 1.0,
    dlq_topic: str | None = None,
    **options: Any,
) -> KafkaMessageEventTrigger:
    """``airflow.providers.apache.kafka.triggers.shared_stream.KafkaSharedStreamTrigger`` as a watcher.

    One event per message on ``topics``, its value as text, as officially; watchers of the same
    topics and connection share one read, as officially. No consumer group, so the connection
    needs no ``enable.auto.commit=false``. ``dlq_topic`` is refused: nothing is rejected here.
    """
    official = "KafkaSharedStreamTrigger"
    if dlq_topic is not None:
        raise _refuse(
            official,
            "dlq_topic",
            "a watcher here rejects no message (one its conditions accept fires, any other is skipped) and "
            "commits nothing, so there is nothing to dead-letter; to copy messages to another topic, do it in "
            "the DAG the asset schedules",
        )
    _poll_timeout(official, poll_timeout)
    _refuse_topic_list_typo(official, topics)
    extra = _kit_options(official, KafkaMessageEventTrigger, options)
    extra.setdefault("value_format", "text")
    names: Any = list(topics) if isinstance(topics, (list, tuple)) else topics
    return KafkaMessageEventTrigger(topics=names, kafka_config_id=kafka_config_id, **extra)


# ------------------------------------------------------------------------------------ HTTP
def HttpEventTrigger(
    response_check_path: str | None = None,
    http_conn_id: str = "http_default",
    auth_type: Any = None,
    method: str = "GET",
    endpoint: str | None = None,
    headers: dict[str, str] | None = None,
    data: dict[str, Any] | str | None = None,
    extra_options: dict[str, Any] | None = None,
    poll_interval: float = 60.0,
    max_consecutive_failures: int = 10,
    **options: Any,
) -> HttpBatchReadyEventTrigger:
    """``airflow.providers.http.triggers.http.HttpEventTrigger`` as a watcher.

    ``response_check_path`` becomes the predicate, called with a ``requests.Response`` as
    officially (sync or async here); ``data`` with GET becomes ``query``. ``headers``,
    ``auth_type`` and ``extra_options`` belong in the connection and are refused (kwargs are
    stored in plain text); ``max_consecutive_failures`` is accepted and has nothing to do, since
    errors back off and never stop a watcher here.

    One difference to know: officially the trigger fires on *every* poll the check passes (the
    official docs keep the last release id in a Variable to avoid that); here it fires when the
    check goes from false to true, or, with ``fire_on_change="id"``, once per new value at that
    path, with the watermark in the asset state store.
    """
    official = "HttpEventTrigger"
    if headers:
        raise _refuse(official, "headers", _HEADERS)
    if auth_type is not None:
        raise _refuse(
            official,
            "auth_type",
            "set the connection's extra 'auth_type' ('basic', 'digest', 'bearer', ...) and its login/password",
        )
    if extra_options:
        raise _refuse(
            official,
            "extra_options",
            "set TLS and proxy in the connection extras ('verify', 'proxy' or 'proxies') and the request timeout "
            "with request_timeout=",
        )
    if response_check_path is not None and not isinstance(response_check_path, str):
        raise _refuse(official, "response_check_path", _RESPONSE_CHECK)
    if isinstance(max_consecutive_failures, bool) or not isinstance(max_consecutive_failures, int):
        raise ValueError(
            f"{official}: max_consecutive_failures must be an integer >= 1, got {max_consecutive_failures!r}"
        )
    if max_consecutive_failures < 1:
        raise ValueError("max_consecutive_failures must be greater or equal to 1")
    extra = _kit_options(official, HttpBatchReadyEventTrigger, options)
    if data is not None and data != {}:
        if not isinstance(method, str) or method.upper() != "GET" or not isinstance(data, dict):
            raise _refuse(
                official,
                "data",
                "with GET pass the query parameters as a dict (they become query=); a request body is sent as "
                "JSON with json_body= (the official trigger sends data form-encoded)",
            )
        if "query" in extra:
            raise TypeError(f"{official}: data= (GET) and query= are the same parameter; give one")
        extra["query"] = data
    if response_check_path is not None:
        if "predicate" in extra:
            raise TypeError(f"{official}: response_check_path= and predicate= are the same parameter; give one")
        extra["predicate"] = response_check_path
        extra.setdefault("predicate_receives", "response")
    return HttpBatchReadyEventTrigger(
        http_conn_id=http_conn_id, method=method, endpoint=endpoint or "", poll_interval=poll_interval, **extra
    )


__all__ = [
    "AwaitMessageTrigger",
    "HttpEventTrigger",
    "KafkaMessageQueueTrigger",
    "KafkaSharedStreamTrigger",
    "MessageQueueTrigger",
]
