"""Read docker-compose.yaml, the Dockerfile and .dockerignore the way Docker would, without Docker.

There is no Docker engine (nor compose plugin) where the tests run, so this module implements
the small parts of Docker's semantics that the static checks need: compose variable
interpolation (``${VAR:-default}``, ``$$``), Dockerfile instruction parsing (comments, line
continuations) and ``.dockerignore`` matching.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from tests import REPO

REPO = REPO
COMPOSE_FILE = REPO / "docker-compose.yaml"
DOCKERFILE = REPO / "Dockerfile"
DOCKERIGNORE = REPO / ".dockerignore"
COMPOSE_SCHEMA = Path(__file__).with_name("schema") / "compose-spec.json"

#: The Airflow components; with the LocalExecutor the scheduler is also the worker.
AIRFLOW_SERVICES = ("api-server", "scheduler", "dag-processor", "triggerer-1", "triggerer-2")
TRIGGERERS = ("triggerer-1", "triggerer-2")
#: Connection ids the compose file defines for the example DAGs.
CONN_IDS = ("s3_demo", "batch_api", "warehouse", "kafka_default")

_VARIABLE = re.compile(
    r"\$(?:(?P<escaped>\$)"
    r"|\{(?P<braced>[A-Za-z_][A-Za-z0-9_]*)(?:(?P<op>:?[-?+])(?P<arg>[^}]*))?\}"
    r"|(?P<named>[A-Za-z_][A-Za-z0-9_]*))"
)


class InterpolationError(ValueError):
    """A required variable (``${VAR:?message}``) is unset, or the syntax is not supported."""


def interpolate(text: str, env: Mapping[str, str] | None = None) -> str:
    """Expand compose variables in ``text`` as ``docker compose config`` does (no nesting)."""
    env = env or {}

    def expand(match: re.Match[str]) -> str:
        if match.group("escaped"):
            return "$"
        name = match.group("braced") or match.group("named")
        op, arg = match.group("op"), match.group("arg") or ""
        if "$" in arg:
            raise InterpolationError(f"nested interpolation is not supported: {match.group(0)!r}")
        value = env.get(name)
        if op is None:
            return value or ""
        unset = value is None or (op.startswith(":") and value == "")
        if op.endswith("-"):
            return arg if unset else str(value)
        if op.endswith("?"):
            if unset:
                raise InterpolationError(f"${{{name}}} is required: {arg}")
            return str(value)
        return "" if unset else arg  # ":+" / "+"

    expanded = _VARIABLE.sub(expand, text)
    if "${" in _VARIABLE.sub("", text.replace("$$", "")):
        raise InterpolationError(f"unsupported interpolation in {text!r}")
    return expanded


def interpolate_tree(node: Any, env: Mapping[str, str] | None = None) -> Any:
    """``interpolate`` every string (values only, as compose does) in a parsed YAML tree."""
    if isinstance(node, str):
        return interpolate(node, env)
    if isinstance(node, list):
        return [interpolate_tree(item, env) for item in node]
    if isinstance(node, dict):
        return {key: interpolate_tree(value, env) for key, value in node.items()}
    return node


def variables(text: str) -> dict[str, str | None]:
    """Every variable the text refers to, with its default (``None`` when it has none)."""
    found: dict[str, str | None] = {}
    for match in _VARIABLE.finditer(text):
        name = match.group("braced") or match.group("named")
        if name:
            op = match.group("op") or ""
            found[name] = match.group("arg") if op.endswith("-") else None
    return found


def raw_compose() -> dict[str, Any]:
    """The compose file as YAML (anchors and merge keys resolved), before interpolation."""
    data = yaml.safe_load(COMPOSE_FILE.read_text())
    assert isinstance(data, dict)
    return data


class _StrictLoader(yaml.SafeLoader):
    """A SafeLoader that refuses a mapping with the same key twice (merge keys aside)."""


def _construct_strict_mapping(loader: _StrictLoader, node: yaml.MappingNode) -> dict[Any, Any]:
    plain = [key.value for key, _ in node.value if key.tag != "tag:yaml.org,2002:merge"]
    duplicates = sorted({key for key in plain if plain.count(key) > 1})
    assert not duplicates, f"duplicate keys at line {node.start_mark.line + 1}: {duplicates}"
    loader.flatten_mapping(node)
    return dict(loader.construct_pairs(node, deep=True))


_StrictLoader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _construct_strict_mapping)


def strict_yaml_load(text: str) -> Any:
    """``yaml.safe_load`` that fails on duplicate keys, as compose does."""
    return yaml.load(text, Loader=_StrictLoader)  # a SafeLoader subclass: no arbitrary objects


def load_compose(env: Mapping[str, str] | None = None) -> dict[str, Any]:
    """The compose file as compose sees it with ``env`` (defaults when empty)."""
    data = interpolate_tree(raw_compose(), env)
    assert isinstance(data, dict)
    return data


def environment(service: Mapping[str, Any]) -> dict[str, str]:
    """A service's environment as a dict, from either the mapping or the list form."""
    env = service.get("environment") or {}
    if isinstance(env, list):
        pairs = (item.split("=", 1) for item in env)
        return {pair[0]: pair[1] if len(pair) > 1 else "" for pair in pairs}
    return {str(key): "" if value is None else str(value) for key, value in env.items()}


def connections(service: Mapping[str, Any]) -> dict[str, dict[str, Any]]:
    """The ``AIRFLOW_CONN_*`` connections of a service, parsed from their JSON form, by conn id."""
    found: dict[str, dict[str, Any]] = {}
    for key, value in environment(service).items():
        if key.startswith("AIRFLOW_CONN_"):
            found[key.removeprefix("AIRFLOW_CONN_").lower()] = json.loads(value)
    return found


def one_shot_services(services: Mapping[str, Any]) -> set[str]:
    """Services that run once: ``restart: "no"``, or waited on to *finish* by another service."""
    done = {name for name, service in services.items() if service.get("restart") == "no"}
    for service in services.values():
        depends = service.get("depends_on") or {}
        if isinstance(depends, dict):
            for target, spec in depends.items():
                if (spec or {}).get("condition") == "service_completed_successfully":
                    done.add(target)
    return done


def option_value(command: list[str], flag: str) -> str:
    """The value after ``flag`` in an exec-form command list."""
    index = command.index(flag)
    return command[index + 1]


# ------------------------------------------------------------------------------ Dockerfile
@dataclass(frozen=True)
class Instruction:
    keyword: str
    arguments: str


def dockerfile_instructions(text: str) -> list[Instruction]:
    """Instructions as the Dockerfile parser sees them: comment lines dropped, continuations joined."""
    instructions: list[Instruction] = []
    pending = ""
    for line in text.splitlines():
        stripped = line.strip()
        if stripped.startswith("#") or (not stripped and not pending):
            continue
        if stripped.endswith("\\"):
            pending += stripped[:-1].rstrip() + " "
            continue
        whole = (pending + stripped).strip()
        pending = ""
        if whole:
            keyword, _, arguments = whole.partition(" ")
            instructions.append(Instruction(keyword.upper(), arguments.strip()))
    if pending.strip():
        keyword, _, arguments = pending.strip().partition(" ")
        instructions.append(Instruction(keyword.upper(), arguments.strip()))
    return instructions


def copy_sources_and_target(arguments: str) -> tuple[list[str], str]:
    """``COPY [--flags] src... dest`` -> (sources, dest)."""
    parts = [part for part in arguments.split() if not part.startswith("--")]
    return parts[:-1], parts[-1]


# ---------------------------------------------------------------------------- .dockerignore
def _pattern_regex(pattern: str) -> re.Pattern[str]:
    out = []
    i = 0
    while i < len(pattern):
        char = pattern[i]
        if pattern.startswith("**/", i):
            out.append("(?:.*/)?")
            i += 3
            continue
        if pattern.startswith("**", i):
            out.append(".*")
            i += 2
            continue
        if char == "*":
            out.append("[^/]*")
        elif char == "?":
            out.append("[^/]")
        elif char == "[":
            end = pattern.index("]", i)
            out.append(pattern[i : end + 1])
            i = end + 1
            continue
        else:
            out.append(re.escape(char))
        i += 1
    return re.compile("".join(out) + r"\Z")


def dockerignore_rules(text: str) -> Iterator[tuple[bool, re.Pattern[str]]]:
    """(exclude?, regex) per non-comment line, in file order."""
    for line in text.splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        negated = line.startswith("!")
        pattern = line[1:] if negated else line
        pattern = pattern.strip().strip("/")
        yield (not negated), _pattern_regex(pattern)


def is_ignored(path: str, text: str) -> bool:
    """Whether ``path`` (relative, with /) is left out of the build context.

    As Docker does: the last rule matching the path or one of its parent folders decides.
    """
    parts = path.strip("/").split("/")
    candidates = ["/".join(parts[: i + 1]) for i in range(len(parts))]
    ignored = False
    for exclude, regex in dockerignore_rules(text):
        if any(regex.match(candidate) for candidate in candidates):
            ignored = exclude
    return ignored
