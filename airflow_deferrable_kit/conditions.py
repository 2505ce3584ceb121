"""Conditions as data: acceptors, evaluated the same way in the trigger and in the poke path.

A callable cannot cross from the worker to the triggerer (trigger kwargs are JSON), so a wait's
"ready" test is a list of *acceptors*, after botocore's waiter model::

    {"state": "success", "matcher": "path", "argument": "state", "comparator": "equals",
     "expected": "ready"}

``matcher`` says what to look at (an HTTP status, a JSON path, a row column, a Kafka key or
header; each wait declares the matchers it supports), ``argument`` which one, ``comparator``
how (``equals``, ``in``, ``exists``), and ``state`` what a match means: ``success`` ends the
wait, ``failure`` ends it with an error, ``retry`` means "not yet".

Sensor arguments may group acceptors by outcome, as friendlier sugar over the same model::

    success=[{"path": "state", "equals": "ready"}],
    failure=[{"path": "state", "in": ["failed", "cancelled"]}]

For the rare test data cannot express, an importable predicate (``"pkg.module:function"``,
sync or async) can be named; it is imported and run in the triggerer without blocking its loop.

One rule combines them, the same for every wait (:meth:`ConditionSet.evaluate`):

1. No acceptor and no predicate: the wait's own default decides (HTTP: a 2xx answer; Postgres:
   a row whose first cell is truthy in query mode, or the marker row; Kafka: any message).
2. Otherwise the acceptors are tried in order and the first that matches decides: ``failure``
   ends the wait with an error, ``retry`` means not yet, ``success`` means ready, unless a
   predicate is set, in which case the success acceptors only pick the candidates and the
   predicate decides.
3. No acceptor matched: with success acceptors, not yet; without them, the predicate decides.

A predicate's answer follows Python truthiness, as Airflow's ``check_fn`` / ``response_check``
do (a count of 0, ``None``, ``[]`` mean not yet; ``5``, ``"yes"`` mean ready), except that the
strings ``"failure"`` and ``"retry"`` say so explicitly. A predicate that raises ends the wait
with a ``predicate_error`` naming it. A set of acceptors with no success acceptor and no
predicate could never succeed, so it is refused when the wait is built.
"""

from __future__ import annotations

import asyncio
import importlib
import inspect
import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Final

from airflow_deferrable_kit._per_loop import PerLoop
from airflow_deferrable_kit.errors import ConditionFailed, ErrorType, FatalError
from airflow_deferrable_kit.payload import Found, PayloadError, cap_value, json_safe

STATES: Final = ("success", "failure", "retry")
COMPARATORS: Final = ("equals", "in", "exists")
#: What :func:`lookup` returns for a path that is not in the document.
MISSING: Final = object()


# ------------------------------------------------------------------------------ JSON paths
_NAME = re.compile(r"[^.\[\]]+")
_BRACKET = re.compile(r"""\[(?:(?P<index>-?\d+)|"(?P<quoted>[^"]*)"|'(?P<single>[^']*)')\]""")
#: The path syntax :func:`parse_path` reads, for messages that refuse anything else.
PATH_SYNTAX: Final = (
    'names joined by dots, [index] and ["key"] steps, optionally after a leading $ '
    "(e.g. '$.data.items[0].state' or 'data.items[0].state')"
)
#: JSONPath features beyond plain steps, named so a refusal says which one was used.
_UNSUPPORTED: Final = (
    (re.compile(r"(?<=\.)\."), "recursive descent '..'"),
    (re.compile(r"\[\s*\?"), "a filter '[?(...)]'"),
    (re.compile(r"\[\s*\*\s*\]"), "a wildcard '[*]'"),
    (re.compile(r"\[[^\]\"']*[:,]"), "a slice or union ('[a:b]', '[a,b]')"),
)
#: A whole step that is JSONPath syntax, not a key: write such a key as ["*"] or ["@"].
_OPERATOR_STEPS: Final = {"*": "a wildcard '*'", "@": "the current node '@'"}


def parse_path(path: str, *, argument: str = "path") -> tuple[str | int, ...]:
    """Split ``a.b[0]["x.y"]`` into ``("a", "b", 0, "x.y")``; a malformed path is a ValueError.

    A leading ``$`` (``$``, ``$.state``, ``$[0]``) is JSONPath's root and adds no step, so
    paths copied from JSONPath tools work; ``$ref`` is still the key ``"$ref"``. JSONPath's
    other features (wildcards, recursive descent, filters, slices) select many values, not
    one, and are refused naming the feature, as is a lone ``*`` or ``@`` step.
    """
    if not isinstance(path, str) or not path.strip():
        raise ValueError(f"{argument} must be a non-empty JSON path such as 'data.items[0].state', got {path!r}")
    parts: list[str | int] = []
    rooted = path.startswith("$") and path[1:2] in ("", ".", "[")
    pos = 1 if rooted else 0
    while pos < len(path):
        match: re.Match[str] | None
        if path[pos] == "[":
            match = _BRACKET.match(path, pos)
        elif path[pos] == "." and (parts or rooted):
            pos += 1
            match = _NAME.match(path, pos)
        else:
            match = None if parts or rooted else _NAME.match(path, pos)
        if match is None:
            raise _path_error(path, pos, argument)
        if match.re is _NAME:
            if match.group(0) in _OPERATOR_STEPS:
                raise _path_error(path, pos, argument, feature=_OPERATOR_STEPS[match.group(0)])
            parts.append(match.group(0))
        elif match.group("index") is not None:
            parts.append(int(match.group("index")))
        else:
            parts.append(match.group("quoted") if match.group("quoted") is not None else match.group("single"))
        pos = match.end()
    return tuple(parts)


def _path_error(path: str, pos: int, argument: str, *, feature: str | None = None) -> ValueError:
    """Say what is wrong at ``pos``: a JSONPath feature by name, else the character."""
    if feature is None:
        feature = next((name for pattern, name in _UNSUPPORTED if pattern.match(path, pos)), None)
    problem = f"{feature} is not supported" if feature else f"problem at character {pos + 1}"
    return ValueError(f"{argument} {path!r} is not a valid JSON path ({problem}); use {PATH_SYNTAX}")


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
    #: ``argument`` parsed once, for the ``path`` matcher (compiled when the acceptor is built).
    parts: tuple[str | int, ...] = field(default=(), compare=False, repr=False)

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


#: A wait's own rule for one acceptor (HTTP: a status is an HTTP status code), run as each
#: acceptor is built with the label of the entry the user wrote (``"success[0]"``). It returns
#: the acceptor, normalised if need be (``"404"`` -> ``404``), or raises ValueError naming it.
Refine = Callable[[Acceptor, str], Acceptor]


def _canonical(
    raw: Mapping[str, Any], *, where: str, matchers: Mapping[str, bool], refine: Refine | None = None
) -> Acceptor:
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
    parts: tuple[str | int, ...] = ()
    if takes_argument:
        if not isinstance(argument, str) or not argument:
            raise ValueError(f"{where}: matcher {matcher!r} needs a non-empty string argument, got {argument!r}")
        if matcher == "path":
            parts = parse_path(argument, argument=f"{where}: argument")
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
    acceptor = Acceptor(
        state=state, matcher=matcher, comparator=comparator, expected=expected, argument=argument, parts=parts
    )
    return acceptor if refine is None else refine(acceptor, where)


def _from_sugar(
    raw: Mapping[str, Any], state: str, *, where: str, matchers: Mapping[str, bool], refine: Refine | None
) -> Acceptor:
    if not isinstance(raw, Mapping):
        raise ValueError(f"{where} must be an object such as {{'path': 'state', 'equals': 'ready'}}, got {raw!r}")
    if "matcher" in raw:
        return _canonical({**raw, "state": raw.get("state", state)}, where=where, matchers=matchers, refine=refine)
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
    return _canonical(canonical, where=where, matchers=matchers, refine=refine)


def build_acceptors(
    *,
    matchers: Mapping[str, bool],
    acceptors: Iterable[Mapping[str, Any]] | None = None,
    success: Iterable[Mapping[str, Any]] | None = None,
    failure: Iterable[Mapping[str, Any]] | None = None,
    retry: Iterable[Mapping[str, Any]] | None = None,
    refine: Refine | None = None,
) -> list[dict[str, Any]]:
    """Validate and normalise acceptors into their canonical JSON form (what triggers carry).

    ``matchers`` maps each matcher the wait supports to whether it takes an argument; ``refine``
    applies the wait's own rules to each acceptor (see :data:`Refine`). Grouped sugar is ordered
    failure, then retry, then success, after any explicit ``acceptors``. Raises ``ValueError``
    naming the offending argument and entry as the user wrote it (``success[0]``).
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
                result.append(_canonical(raw, where=where, matchers=matchers, refine=refine))
            else:
                result.append(_from_sugar(raw, name, where=where, matchers=matchers, refine=refine))
    return [acceptor.as_dict() for acceptor in result]


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
#: At most four sync predicates run at once per loop, each in a worker thread.
_sync_slots: PerLoop[asyncio.Semaphore] = PerLoop(lambda: asyncio.Semaphore(4))
#: Explicit answers a predicate may give besides truthiness.
_EXPLICIT: Final = {"success": "success", "failure": "failure", "retry": "retry"}


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


def predicate_state(result: Any) -> str:
    """What a predicate's return value means: ``"success"``, ``"failure"`` or ``"retry"``.

    Python truthiness, as Airflow's own ``check_fn`` and ``response_check`` use, except that the
    strings ``"success"``, ``"failure"`` and ``"retry"`` say so explicitly.
    """
    if isinstance(result, str) and result in _EXPLICIT:
        return _EXPLICIT[result]
    try:
        return "success" if result else "retry"
    except Exception as exc:  # an object whose truth value is ambiguous (a numpy array, a frame)
        raise TypeError(f"returned {type(result).__name__}, whose truth value is ambiguous: {exc}") from exc


async def call_predicate(
    path: str,
    subject: Any,
    *,
    argument: str = "predicate",
    args: Sequence[Any] = (),
    kwargs: Mapping[str, Any] | None = None,
) -> tuple[str, Any]:
    """Run the predicate on ``subject`` without blocking the loop; return ``(state, returned)``.

    A sync predicate runs in a worker thread (at most four at once per loop), never on the loop.
    A predicate that cannot be imported, raises, or returns something with no truth value ends
    the wait: a :class:`FatalError` of type ``predicate_error`` naming it. ``args`` and
    ``kwargs`` are bound as ``functools.partial`` binds them: ``f(*args, subject, **kwargs)``,
    the call the official Kafka sensors make with ``apply_function_args`` / ``_kwargs``.
    """
    extra = dict(kwargs or {})
    try:
        function = _predicates.get(path)
        if function is None:
            function = await asyncio.to_thread(import_predicate, path, argument=argument)
        if inspect.iscoroutinefunction(function):
            result = await function(*args, subject, **extra)
        else:
            async with _sync_slots.get():
                result = await asyncio.to_thread(function, *args, subject, **extra)
        return predicate_state(result), result
    except asyncio.CancelledError:
        raise
    except Exception as exc:
        raise FatalError(
            f"{argument} {path!r} failed: {type(exc).__name__}: {exc}", error_type=ErrorType.PREDICATE_ERROR
        ) from exc


# --------------------------------------------------------------------------------- the rule
#: The verdict when no condition spoke: the wait's own default decides.
DEFAULT: Final = "default"
#: What the acceptor stage says when the predicate must decide.
ASK_PREDICATE: Final = "predicate"
#: Longest ``repr`` of a predicate's answer kept in a verdict.
_RETURNED_CHARS: Final = 200


@dataclass(frozen=True)
class Verdict:
    """The outcome of one evaluation and why: the ``decided_by`` explanation goes into payloads."""

    state: str
    decided_by: dict[str, Any] | None = None
    observed: dict[str, Any] = field(default_factory=dict)
    #: What the predicate returned, as it returned it (``None`` when no predicate decided).
    returned: Any = None

    def explain(self) -> str:
        """One line for messages: ``path state equals 'failed' (saw 'failed')``."""
        return explain(self.decided_by)


def explain(decided_by: Mapping[str, Any] | None) -> str:
    """Describe a decision (an acceptor with what it saw, a predicate, or the default) in words."""
    if not decided_by:
        return "no condition decided"
    matcher = decided_by.get("matcher")
    if matcher == "predicate":
        return f"predicate {decided_by.get('argument')} returned {decided_by.get('returned')}"
    if matcher == DEFAULT:
        return "the default condition"
    where = f"{matcher} {decided_by['argument']}" if decided_by.get("argument") is not None else str(matcher)
    expected = decided_by.get("expected", True)
    return f"{where} {decided_by.get('comparator')} {expected!r} (saw {decided_by.get('actual')!r})"


class ConditionSet:
    """A wait's compiled conditions: its acceptors and predicate, combined by the one rule.

    Built once per trigger from the canonical JSON its kwargs carry (:meth:`load`), or from a
    sensor's arguments including the ``success=`` / ``failure=`` / ``retry=`` shorthand
    (:meth:`canonicalise`); loading refuses a set that could never succeed.
    """

    def __init__(self, acceptors: Sequence[Acceptor], predicate: str | None = None) -> None:
        self.acceptors: tuple[Acceptor, ...] = tuple(acceptors)
        self.predicate = predicate
        self.has_success = any(acceptor.state == "success" for acceptor in self.acceptors)

    @classmethod
    def load(
        cls,
        canonical: Any,
        predicate: str | None,
        *,
        matchers: Mapping[str, bool],
        argument: str = "acceptors",
        refine: Refine | None = None,
    ) -> ConditionSet:
        """Rebuild from trigger kwargs: canonical acceptors and a predicate path (or ``None``)."""
        if isinstance(canonical, (str, bytes, Mapping)) or not isinstance(canonical, list):
            raise ValueError(f"{argument} must be a list of conditions, got {type(canonical).__name__}")
        if predicate is not None:
            validate_predicate_path(predicate)
        acceptors = [
            _canonical(item, where=f"{argument}[{i}]", matchers=matchers, refine=refine)
            for i, item in enumerate(canonical)
        ]
        conditions = cls(acceptors, predicate)
        conditions.refuse_never_succeeding()
        return conditions

    #: The shorthand and canonical forms merged into the canonical JSON triggers carry (the one
    #: place the ``success=`` / ``failure=`` / ``retry=`` shorthand is turned into acceptors).
    canonicalise = staticmethod(build_acceptors)

    def refuse_never_succeeding(self) -> None:
        """A set with acceptors, none of them success, and no predicate can never be met."""
        if self.acceptors and not self.has_success and self.predicate is None:
            raise ValueError(
                "the conditions say only when to fail or keep waiting, so the wait could never succeed; "
                "add a success condition (e.g. success=[{'path': 'state', 'equals': 'ready'}]) or a predicate"
            )

    def __bool__(self) -> bool:
        return bool(self.acceptors) or self.predicate is not None

    def screen(self, value_of: Callable[[Acceptor], Any]) -> tuple[str, Decision | None, dict[str, Any]]:
        """The acceptor stage of the rule alone, synchronous (a Kafka fan-out screens each message).

        Returns ``(state, decision, observed)``: ``state`` is final (``success``, ``failure``,
        ``retry``), :data:`DEFAULT` (no conditions at all), or :data:`ASK_PREDICATE` (the
        predicate decides; ``decision`` is the success acceptor that picked the candidate, if any).
        """
        if not self:
            return DEFAULT, None, {}
        decision, observed = decide(self.acceptors, value_of)
        if decision is not None and (decision.state != "success" or self.predicate is None):
            return decision.state, decision, observed
        if self.predicate is None or (decision is None and self.has_success):
            return "retry", None, observed
        return ASK_PREDICATE, decision, observed

    async def judge(
        self,
        subject: Any,
        candidate: Decision | None = None,
        *,
        args: Sequence[Any] = (),
        kwargs: Mapping[str, Any] | None = None,
    ) -> Verdict:
        """The predicate stage: run the predicate on ``subject`` (and any bound ``args`` /
        ``kwargs``, see :func:`call_predicate`) and explain its answer."""
        assert self.predicate is not None
        state, returned = await call_predicate(self.predicate, subject, args=args, kwargs=kwargs)
        decided_by: dict[str, Any] = {
            "state": state,
            "matcher": "predicate",
            "argument": self.predicate,
            "returned": _short_repr(returned),
        }
        if candidate is not None:
            decided_by["candidate"] = candidate.as_dict()
        return Verdict(state, decided_by, returned=returned)

    async def evaluate(self, value_of: Callable[[Acceptor], Any], subject: Callable[[], Any]) -> Verdict:
        """Apply the whole rule to one subject (a response, a row, a message).

        ``value_of(acceptor)`` returns what the acceptor looks at, or :data:`MISSING`;
        ``subject()`` builds what the predicate receives (only called if it runs).
        """
        state, decision, observed = self.screen(value_of)
        if state == DEFAULT:
            return Verdict(DEFAULT, {"state": "success", "matcher": DEFAULT})
        if state != ASK_PREDICATE:
            return Verdict(state, decision.as_dict() if decision is not None else None, observed)
        verdict = await self.judge(subject(), decision)
        return Verdict(verdict.state, verdict.decided_by, observed)


# ------------------------------------------------------------------------------ settling
def capped_decision(decided_by: Mapping[str, Any] | None, limit: int) -> dict[str, Any] | None:
    """A verdict's explanation as a payload carries it: the value the deciding acceptor saw (and
    a predicate's candidate) cut to ``limit`` bytes of JSON. Every wait caps it here."""
    if decided_by is None:
        return None
    out = dict(decided_by)
    if out.get("actual") is not None:
        out["actual"] = cap_value(out["actual"], limit)
    candidate = out.get("candidate")
    if isinstance(candidate, Mapping):
        out["candidate"] = capped_decision(candidate, limit)
    return out


def settle(state: str, data: Mapping[str, Any], failure: Callable[[], str]) -> Found | None:
    """A final verdict state as the wait's outcome, the same for every wait: ``success`` is found
    (``data`` becomes the payload), ``failure`` ends the wait with a ``condition_failed`` error
    carrying ``data`` (``failure()`` says why in words), ``retry`` is not yet (``None``)."""
    if state == "success":
        return Found(data)
    if state == "failure":
        raise ConditionFailed(failure(), details=dict(data))
    if state == "retry":
        return None
    raise ValueError(f"not a final verdict state: {state!r}")


def answer_as_data(value: Any) -> Any:
    """A predicate's answer as JSON data, for payloads that carry it (the official Kafka triggers
    fire the ``apply_function``'s answer itself): the value when JSON can hold it (bytes as
    base64, dates as ISO text, as every payload), else its ``repr``, cut."""
    try:
        return json_safe(value)
    except PayloadError:
        return _short_repr(value)


def _short_repr(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= _RETURNED_CHARS else text[:_RETURNED_CHARS] + "..."
