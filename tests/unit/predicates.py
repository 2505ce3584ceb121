"""Predicates the condition-rule tests name by dotted path (they must be importable)."""

from __future__ import annotations

from typing import Any


def returns(subject: dict[str, Any]) -> Any:
    """Return whatever the subject says to return: lets one predicate give every kind of answer.

    The subject is the wait's own: a row (Postgres), ``{"json": body, ...}`` (HTTP) or
    ``{"value": value, ...}`` (Kafka).
    """
    for wrapper in ("json", "value"):
        if isinstance(subject.get(wrapper), dict):
            subject = subject[wrapper]
    return subject["returns"]


async def returns_async(subject: dict[str, Any]) -> Any:
    return returns(subject)


def raises(subject: dict[str, Any]) -> Any:
    raise RuntimeError(f"cannot judge {subject.get('state')!r}")


class _Ambiguous:
    def __bool__(self) -> bool:
        raise ValueError("the truth value of an array with more than one element is ambiguous")


def ambiguous(subject: dict[str, Any]) -> Any:
    return _Ambiguous()
