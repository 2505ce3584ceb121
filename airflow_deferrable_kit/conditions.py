"""Conditions as data: acceptors, evaluated the same way in the trigger and in the poke path.

A callable cannot cross from the worker to the triggerer (trigger kwargs are JSON), so a wait's
"ready" test is a list of *acceptors*, after botocore's waiter model::

    {"state": "success", "matcher": "path", "argument": "state", "comparator": "equals",
     "expected": "ready"}

``matcher`` says what to look at (an HTTP status, a JSON path, a row column, a Kafka key or
header; each wait declares the matchers it supports), ``argument`` which one, ``comparator``
how (``equals``, ``in``, ``exists``), and ``state`` what a match means: ``success`` ends the
wait, ``failure`` ends it with an error, ``retry`` means "not yet". Acceptors are tried in
order; the first match decides; no match means "not yet".

Sensor arguments may group acceptors by outcome, as friendlier sugar over the same model::

    success=[{"path": "state", "equals": "ready"}],
    failure=[{"path": "state", "in": ["failed", "cancelled"]}]

For the rare test data cannot express, an importable predicate (``"pkg.module:function"``,
sync or async) can be named; it is imported and run in the triggerer without blocking its loop.
"""

from __future__ import annotations

import asyncio
import importlib
import inspect
import re
import weakref
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final

STATES: Final = ("success", "failure", "retry")
COMPARATORS: Final = ("equals", "in", "exists")
#: What :func:`lookup` returns for a path that is not in the document.
MISSING: Final = object()


# ------------------------------------------------------------------------------ JSON paths
_NAME = re.compile(r"[^.\[\]]+")
_BRACKET = re.compile(r"""\[(?:(?P<index>-?\d+)|"(?P<quoted>[^"]*)")\]""")


def parse_path(path: str, *, argument: str = "path") -> tuple[str | int, ...]:
    """Split ``a.b[0]["x.y"]`` into ``("a", "b", 0, "x.y")``; a malformed path is a ValueError."""
    if not isinstance(path, str) or not path.strip():
        raise ValueError(f"{argument} must be a non-empty JSON path such as 'data.items[0].state', got {path!r}")
    parts: list[str | int] = []
    pos = 0
    while pos < len(path):
        match: re.Match[str] | None
        if path[pos] == "[":
            match = _BRACKET.match(path, pos)
        elif path[pos] == "." and parts:
            pos += 1
            match = _NAME.match(path, pos)
        else:
            match = None if parts else _NAME.match(path, pos)
        if match is None:
            raise ValueError(f"{argument} {path!r} is not a valid JSON path (problem at character {pos + 1})")
        if match.re is _NAME:
            parts.append(match.group(0))
        elif match.group("index") is not None:
            parts.append(int(match.group("index")))
        else:
            parts.append(match.group("quoted"))
        pos = match.end()
    return tuple(parts)


def lookup(document: Any, path: str | Sequence[str | int]) -> Any:
    """The value at ``path`` in a JSON document, or :data:`MISSING` if any step is absent."""
    parts = parse_path(path) if isinstance(path, str) else path
    current = document
    for part in parts:
        if isinstance(part, int):
            if not isinstance(current, list) or not -len(current) <= part < len(current):
                return MISSING
            current = current[part]
        else:
            if not isinstance(current, Mapping) or part not in current:
                return MISSING
            current = current[part]
    return current


# ------------------------------------------------------------------------------- acceptors
def _json_equal(left: Any, right: Any) -> bool:
    """Equality with JSON's types: ``True`` is not ``1`` and ``"1"`` is not ``1``."""
    if isinstance(left, bool) or isinstance(right, bool):
        return isinstance(left, bool) and isinstance(right, bool) and left is right
    if isinstance(left, (int, float)) and isinstance(right, (int, float)):
        return left == right
    return type(left) is type(right) and bool(left == right)


@dataclass(frozen=True)
class Acceptor:
    """One rule: when ``matcher``/``argument`` compares true to ``expected``, the wait is ``state``."""

    state: str
    matcher: str
    comparator: str
    expected: Any = None
    argument: str | None = None

    def as_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"state": self.state, "matcher": self.matcher, "comparator": self.comparator}
        if self.argument is not None:
            out["argument"] = self.argument
        if self.comparator != "exists" or self.expected is not True:
            out["expected"] = self.expected
        return out

    def matches(self, actual: Any) -> bool:
        if self.comparator == "exists":
            return (actual is not MISSING) is bool(self.expected)
        if actual is MISSING:
            return False
        if self.comparator == "equals":
            return _json_equal(actual, self.expected)
        return any(_json_equal(actual, option) for option in self.expected)

    def label(self) -> str:
        return self.matcher if self.argument is None else f"{self.matcher}:{self.argument}"


@dataclass(frozen=True)
class Decision:
    """What decided a wait: the acceptor that matched and the value it saw."""

    acceptor: Acceptor
    actual: Any

    @property
    def state(self) -> str:
        return self.acceptor.state

    def as_dict(self) -> dict[str, Any]:
        return {**self.acceptor.as_dict(), "actual": None if self.actual is MISSING else self.actual}


def _canonical(raw: Mapping[str, Any], *, where: str, matchers: Mapping[str, bool]) -> Acceptor:
    if not isinstance(raw, Mapping):
        raise ValueError(f"{where} must be an object such as {{'path': 'state', 'equals': 'ready'}}, got {raw!r}")
    state = raw.get("state")
    if state not in STATES:
        raise ValueError(f"{where}: state must be one of {', '.join(STATES)}, got {state!r}")
    matcher = raw.get("matcher")
    if not isinstance(matcher, str) or matcher not in matchers:
        raise ValueError(f"{where}: matcher must be one of {', '.join(sorted(matchers))}, got {matcher!r}")
    comparator = raw.get("comparator", "equals")
    if comparator not in COMPARATORS:
        raise ValueError(f"{where}: comparator must be one of {', '.join(COMPARATORS)}, got {comparator!r}")
    takes_argument = matchers[matcher]
    argument = raw.get("argument")
    if takes_argument:
        if not isinstance(argument, str) or not argument:
            raise ValueError(f"{where}: matcher {matcher!r} needs a non-empty string argument, got {argument!r}")
        if matcher == "path":
            parse_path(argument, argument=f"{where}: argument")
    elif argument is not None:
        raise ValueError(f"{where}: matcher {matcher!r} takes no argument, got {argument!r}")
    expected = raw.get("expected", True if comparator == "exists" else MISSING)
    if expected is MISSING:
        raise ValueError(f"{where}: comparator {comparator!r} needs an expected value")
    if comparator == "in" and (not isinstance(expected, list) or not expected):
        raise ValueError(f"{where}: comparator 'in' needs a non-empty list of expected values, got {expected!r}")
    if comparator == "exists" and not isinstance(expected, bool):
        raise ValueError(f"{where}: comparator 'exists' takes true or false, got {expected!r}")
    unknown = set(raw) - {"state", "matcher", "comparator", "argument", "expected"}
    if unknown:
        raise ValueError(f"{where}: unknown keys {sorted(unknown)}")
    return Acceptor(state=state, matcher=matcher, comparator=comparator, expected=expected, argument=argument)


def _from_sugar(raw: Mapping[str, Any], state: str, *, where: str, matchers: Mapping[str, bool]) -> Acceptor:
    if not isinstance(raw, Mapping):
        raise ValueError(f"{where} must be an object such as {{'path': 'state', 'equals': 'ready'}}, got {raw!r}")
    if "matcher" in raw:
        return _canonical({**raw, "state": raw.get("state", state)}, where=where, matchers=matchers)
    named = [name for name in matchers if name in raw]
    if len(named) != 1:
        raise ValueError(f"{where} must name exactly one of {', '.join(sorted(matchers))}, got keys {sorted(raw)}")
    matcher = named[0]
    comparators = [name for name in COMPARATORS if name in raw]
    unknown = set(raw) - {matcher, *COMPARATORS}
    if unknown or len(comparators) > 1:
        raise ValueError(f"{where}: unexpected keys {sorted(unknown or comparators)}")
    canonical: dict[str, Any] = {"state": state, "matcher": matcher}
    if matchers[matcher]:
        canonical["argument"] = raw[matcher]
        if not comparators:
            raise ValueError(f"{where} needs one of {', '.join(COMPARATORS)} next to {matcher!r}")
        canonical["comparator"] = comparators[0]
        canonical["expected"] = raw[comparators[0]]
    elif comparators:
        canonical["comparator"] = comparators[0]
        canonical["expected"] = raw[comparators[0]]
    else:
        value = raw[matcher]
        canonical["comparator"] = "in" if isinstance(value, list) else "equals"
        canonical["expected"] = value
    return _canonical(canonical, where=where, matchers=matchers)


def build_acceptors(
    *,
    matchers: Mapping[str, bool],
    acceptors: Iterable[Mapping[str, Any]] | None = None,
    success: Iterable[Mapping[str, Any]] | None = None,
    failure: Iterable[Mapping[str, Any]] | None = None,
    retry: Iterable[Mapping[str, Any]] | None = None,
) -> list[dict[str, Any]]:
    """Validate and normalise acceptors into their canonical JSON form (what triggers carry).

    ``matchers`` maps each matcher the wait supports to whether it takes an argument. Grouped
    sugar is ordered failure, then retry, then success, after any explicit ``acceptors``.
    Raises ``ValueError`` naming the offending argument and entry.
    """
    result: list[Acceptor] = []
    for name, group in (("acceptors", acceptors), ("failure", failure), ("retry", retry), ("success", success)):
        if group is None:
            continue
        if isinstance(group, (str, bytes, Mapping)) or not isinstance(group, Iterable):
            raise ValueError(f"{name} must be a list of conditions, got {type(group).__name__}")
        for i, raw in enumerate(group):
            where = f"{name}[{i}]"
            if name == "acceptors":
                result.append(_canonical(raw, where=where, matchers=matchers))
            else:
                result.append(_from_sugar(raw, name, where=where, matchers=matchers))
    return [acceptor.as_dict() for acceptor in result]


def load_acceptors(raw: Iterable[Mapping[str, Any]], *, matchers: Mapping[str, bool]) -> list[Acceptor]:
    """Rebuild :class:`Acceptor` objects from their canonical JSON form."""
    return [_canonical(item, where=f"acceptors[{i}]", matchers=matchers) for i, item in enumerate(raw)]


def decide(
    acceptors: Sequence[Acceptor], value_of: Callable[[Acceptor], Any]
) -> tuple[Decision | None, dict[str, Any]]:
    """Try the acceptors in order; return the first that matched and every value looked at.

    ``value_of(acceptor)`` returns what the acceptor's matcher/argument points at in the
    subject, or :data:`MISSING`. The observed values are keyed ``"matcher:argument"``.
    """
    observed: dict[str, Any] = {}
    for acceptor in acceptors:
        actual = value_of(acceptor)
        observed[acceptor.label()] = None if actual is MISSING else actual
        if acceptor.matches(actual):
            return Decision(acceptor, actual), observed
    return None, observed


# ------------------------------------------------------------------------------ predicates
_predicates: dict[str, Callable[..., Any]] = {}
_sync_slots: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, asyncio.Semaphore] = weakref.WeakKeyDictionary()


def validate_predicate_path(path: str, *, argument: str = "predicate") -> None:
    """Check the shape of ``"pkg.module:function"`` (or ``pkg.module.function``) without importing."""
    if not isinstance(path, str) or not re.fullmatch(r"[A-Za-z_][\w.]*[:.][A-Za-z_]\w*", path):
        raise ValueError(f"{argument} must be a dotted path like 'my_pkg.checks:is_ready', got {path!r}")


def import_predicate(path: str, *, argument: str = "predicate") -> Callable[..., Any]:
    """Import the callable named by ``path`` (cached); a clear ValueError if it is not there."""
    if path in _predicates:
        return _predicates[path]
    validate_predicate_path(path, argument=argument)
    module_name, _, attribute = path.partition(":") if ":" in path else path.rpartition(".")
    try:
        target = getattr(importlib.import_module(module_name), attribute)
    except (ImportError, AttributeError) as exc:
        raise ValueError(f"{argument} {path!r} cannot be imported: {exc}") from exc
    if not callable(target):
        raise ValueError(f"{argument} {path!r} is not callable")
    _predicates[path] = target
    return target


async def run_predicate(path: str, subject: Any) -> str:
    """Run the predicate on ``subject`` without blocking the loop; return a state.

    ``True``/``"success"`` means success, ``"failure"`` failure, anything falsy or ``"retry"``
    not yet. A sync predicate runs in a worker thread (at most four at once), never on the loop.
    """
    if path in _predicates:
        function = _predicates[path]
    else:
        function = await asyncio.to_thread(import_predicate, path)
    if inspect.iscoroutinefunction(function):
        result = await function(subject)
    else:
        loop = asyncio.get_running_loop()
        slots = _sync_slots.get(loop)
        if slots is None:
            slots = _sync_slots[loop] = asyncio.Semaphore(4)
        async with slots:
            result = await asyncio.to_thread(function, subject)
    if result is True or result == "success":
        return "success"
    if result == "failure":
        return "failure"
    return "retry"
