"""The package's layout stays as docs/development.md draws it: imports run one way, one home each.

The import graph is read from the source (``ast``), every import counted: module level,
function level and ``TYPE_CHECKING`` alike, because a cycle hidden inside a function is still a
cycle a reader has to hold in their head. Public classpaths are what Airflow stores (trigger
rows, serialized DAGs), so the ones the previous layout shipped must keep importing.
"""

from __future__ import annotations

import ast
import importlib
import pathlib
from collections.abc import Iterator

import pytest

from tests import REPO
from tests.unit.triggers.test_every_trigger import EVENT_EXAMPLES, EXAMPLES

PACKAGE = "airflow_deferrable_kit"
ROOT = REPO / PACKAGE

#: Each module's layer, lowest first. A module imports only from its own layer or lower ones;
#: within a layer the graph has no cycle. Prefixes name packages (every module inside them).
LAYERS: tuple[tuple[str, ...], ...] = (
    # foundations: no knowledge of waits, payloads or clients
    (
        "",
        "errors",
        "extras",
        "_arguments",
        "_asset_state",
        "_backoff",
        "_collector",
        "_metrics",
        "_moments",
        "_per_loop",
        "_redact",
        "_shared_polls",
        "_tls",
        "_trigger_queues",
        "_wall_clock",
    ),
    # the shared concepts every wait uses
    ("payload", "conditions", "connections", "leases", "_event_streams"),
    # one private package per client library
    ("_http", "_kafka", "_postgres", "_s3"),
    # the trigger side: what the triggerer imports
    ("triggers",),
    # the worker side, and helpers for users' tests
    ("sensors", "operators", "testing", "testing_events"),
    # tools and metadata
    ("audit", "cli", "get_provider_info", "hooks"),
    # the UI plugin (the Waits page), which shows the audit's figures
    ("plugins",),
)

#: The private client packages: none imports another.
CLIENT_PACKAGES = ("_http", "_kafka", "_postgres", "_s3")

#: Every public class of the previous layout that Airflow may have stored by classpath (trigger
#: rows, serialized DAGs, ``AssetWatcher`` triggers), or that users import.
PUBLIC_CLASSPATHS = (
    "airflow_deferrable_kit.triggers.base.PollingTrigger",
    "airflow_deferrable_kit.triggers.events.ConditionEventTrigger",
    "airflow_deferrable_kit.triggers.events.EdgeEventTrigger",
    "airflow_deferrable_kit.triggers.events.EventTrigger",
    "airflow_deferrable_kit.triggers.s3.S3KeyTrigger",
    "airflow_deferrable_kit.triggers.s3_events.S3KeyEventTrigger",
    "airflow_deferrable_kit.triggers.http.HttpBatchReadyTrigger",
    "airflow_deferrable_kit.triggers.http_events.HttpBatchReadyEventTrigger",
    "airflow_deferrable_kit.triggers.postgres.PostgresBatchMarkerTrigger",
    "airflow_deferrable_kit.triggers.postgres_events.PostgresRowEventTrigger",
    "airflow_deferrable_kit.triggers.kafka.KafkaMessageTrigger",
    "airflow_deferrable_kit.triggers.kafka_events.KafkaMessageEventTrigger",
    "airflow_deferrable_kit.triggers.temporal.DateTimeTrigger",
    "airflow_deferrable_kit.sensors.base.DeferrableSensor",
    "airflow_deferrable_kit.sensors.s3.S3KeySensor",
    "airflow_deferrable_kit.sensors.http.HttpBatchReadySensor",
    "airflow_deferrable_kit.sensors.postgres.PostgresBatchMarkerSensor",
    "airflow_deferrable_kit.sensors.kafka.KafkaMessageSensor",
    "airflow_deferrable_kit.sensors.temporal.DateTimeSensor",
    "airflow_deferrable_kit.sensors.temporal.TimeDeltaSensor",
    "airflow_deferrable_kit.sensors.temporal.TimeSensor",
    "airflow_deferrable_kit.sensors.temporal.WaitSensor",
)


def module_names() -> dict[str, pathlib.Path]:
    """Dotted name (relative to the package, ``""`` for the package itself) -> file."""
    names = {}
    for path in sorted(ROOT.rglob("*.py")):
        parts = list(path.relative_to(ROOT).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        names[".".join(parts)] = path
    return names


def _imported(name: str, path: pathlib.Path, modules: dict[str, pathlib.Path]) -> Iterator[str]:
    """Every module of the package that ``name`` imports, wherever the import statement is."""
    package = name.split(".") if path.name == "__init__.py" else name.split(".")[:-1]
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package[: len(package) - node.level + 1] if node.level > 1 else package
                module = ".".join([PACKAGE, *[p for p in base if p], *([node.module] if node.module else [])])
            else:
                module = node.module or ""
            # "from x import y" imports the module x.y if there is one, else a name of x.
            targets = [f"{module}.{alias.name}" for alias in node.names]
        else:
            continue
        for target in targets:
            if target != PACKAGE and not target.startswith(PACKAGE + "."):
                continue
            relative = target[len(PACKAGE) + 1 :]
            while relative not in modules and relative:
                relative = relative.rsplit(".", 1)[0] if "." in relative else ""
            if relative != name:
                yield relative


def import_graph() -> dict[str, set[str]]:
    modules = module_names()
    return {name: set(_imported(name, path, modules)) for name, path in modules.items()}


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        for target in graph[node]:
            if target not in index:
                visit(target)
                low[node] = min(low[node], low[target])
            elif target in stack:
                low[node] = min(low[node], index[target])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return found


def layer_of(name: str) -> int:
    top = name.split(".")[0]
    for rank, members in enumerate(LAYERS):
        if (name if top == "" else top) in members:
            return rank
    raise AssertionError(f"module {name!r} has no layer: add it to LAYERS and to docs/development.md")


def test_the_graph_reader_sees_imports_inside_functions_and_type_checking_blocks(tmp_path: pathlib.Path) -> None:
    source = tmp_path / "probe.py"
    source.write_text(
        "from typing import TYPE_CHECKING\n"
        "if TYPE_CHECKING:\n    from airflow_deferrable_kit._kafka.reader import ConnectionReader\n"
        "def f():\n    from airflow_deferrable_kit import errors\n"
    )
    modules = {"probe": source, "_kafka.reader": source, "errors": source, "": source}
    assert set(_imported("probe", source, modules)) == {"_kafka.reader", "errors"}


def test_no_import_cycle_inside_the_package() -> None:
    assert cycles(import_graph()) == []


def test_cycle_detection_finds_a_cycle() -> None:
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


def test_every_module_imports_only_its_own_layer_or_lower_ones() -> None:
    upward = [
        f"{name} ({layer_of(name)}) imports {target} ({layer_of(target)})"
        for name, targets in sorted(import_graph().items())
        for target in sorted(targets)
        if layer_of(target) > layer_of(name)
    ]
    assert upward == []


def test_no_client_package_imports_another() -> None:
    crossing = [
        f"{name} imports {target}"
        for name, targets in import_graph().items()
        for target in targets
        if name.split(".")[0] in CLIENT_PACKAGES
        and target.split(".")[0] in CLIENT_PACKAGES
        and name.split(".")[0] != target.split(".")[0]
    ]
    assert crossing == []


@pytest.mark.parametrize("package", CLIENT_PACKAGES)
def test_each_client_package_maps_its_modules_and_exports_nothing(package: str) -> None:
    init = ROOT / package / "__init__.py"
    tree = ast.parse(init.read_text())
    docstring = ast.get_docstring(tree) or ""
    assert [type(node).__name__ for node in tree.body] == ["Expr"], "only a docstring"
    modules = sorted(p.stem for p in (ROOT / package).glob("*.py") if p.name != "__init__.py")
    assert modules and all(f"``{module}``" in docstring for module in modules), (modules, docstring)


def test_each_client_package_has_the_same_verbs() -> None:
    """Connection -> options is ``load_options`` in every client package, and each maps its
    library's errors to ours in one ``classify_*_error`` function."""
    for client in ("_http.client", "_kafka.client", "_postgres.client", "_s3.client"):
        module = importlib.import_module(f"{PACKAGE}.{client}")
        assert callable(getattr(module, "load_options", None)), client
    for client, classify in (
        ("_http.client", "classify_aiohttp_error"),
        ("_kafka.client", "classify_kafka_error"),
        ("_postgres.client", "classify_postgres_error"),
        ("_s3.client", "classify_s3_error"),
    ):
        assert callable(getattr(importlib.import_module(f"{PACKAGE}.{client}"), classify, None)), client


def test_no_sensor_module_imports_a_client_package() -> None:
    """The worker side asks a service only through its trigger class (which imports the client
    package): a sensor holds no knowledge of how to ask the service."""
    asking = [
        f"{name} imports {target}"
        for name, targets in sorted(import_graph().items())
        if name.split(".")[0] == "sensors"
        for target in sorted(targets)
        if target.split(".")[0] in CLIENT_PACKAGES
    ]
    assert asking == []


#: The libraries the client packages wrap: only they import them (at run time).
CLIENT_LIBRARIES = ("aiobotocore", "botocore", "boto3", "aiohttp", "yarl", "asyncpg", "aiokafka", "kafka")


def _runtime_imports(tree: ast.Module) -> Iterator[str]:
    """Top-level names a module imports when it runs (``if TYPE_CHECKING:`` blocks left out)."""

    def walk(node: ast.AST) -> Iterator[str]:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.If) and "TYPE_CHECKING" in ast.unparse(child.test):
                yield from (name for orelse in child.orelse for name in walk(orelse))
                continue
            if isinstance(child, ast.Import):
                yield from (alias.name.split(".")[0] for alias in child.names)
            elif isinstance(child, ast.ImportFrom) and child.level == 0 and child.module:
                yield child.module.split(".")[0]
            yield from walk(child)

    return walk(tree)


def test_only_the_client_packages_use_their_libraries() -> None:
    """A trigger, sensor or operator never imports a client library (nor its exception types):
    the client package maps the library's errors to ours once, at its door. Type-only imports
    (``TYPE_CHECKING``) are allowed: a signature may name the client it leases."""
    using = [
        f"{name} imports {library}"
        for name, path in module_names().items()
        if name.split(".")[0] in ("triggers", "sensors", "operators")
        for library in sorted(set(_runtime_imports(ast.parse(path.read_text()))))
        if library in CLIENT_LIBRARIES
    ]
    assert using == []


def test_the_library_rule_sees_imports_anywhere_but_type_checking_blocks() -> None:
    source = (
        "from typing import TYPE_CHECKING\nimport os\nif TYPE_CHECKING:\n    import asyncpg\n"
        "def f():\n    from botocore.exceptions import ClientError\n    import aiohttp.web\n"
    )
    assert sorted(set(_runtime_imports(ast.parse(source)))) == ["aiohttp", "botocore", "os", "typing"]


#: Past this many lines a module says at its top why it is one module.
LONG_MODULE_LINES = 700


def test_a_long_module_says_why_it_is_one() -> None:
    reason = f"Why one module past {LONG_MODULE_LINES} lines"
    unexplained = [
        f"{name} ({lines} lines)"
        for name, path in module_names().items()
        if (lines := len(path.read_text().splitlines())) > LONG_MODULE_LINES
        and reason not in (ast.get_docstring(ast.parse(path.read_text())) or "")
    ]
    assert unexplained == []


def test_no_module_says_it_was_cut_for_size() -> None:
    said = [
        name
        for name, path in module_names().items()
        if any(phrase in (ast.get_docstring(ast.parse(path.read_text())) or "") for phrase in ("for size", "half of"))
    ]
    assert said == []


def test_payload_re_exports_no_error_class() -> None:
    payload = importlib.import_module(f"{PACKAGE}.payload")
    errors = importlib.import_module(f"{PACKAGE}.errors")
    assert not set(payload.__all__) & set(errors.__all__)


@pytest.mark.parametrize("classpath", PUBLIC_CLASSPATHS)
def test_public_classpaths_of_the_previous_layout_still_import_and_rebuild(classpath: str) -> None:
    module_name, _, name = classpath.rpartition(".")
    cls = getattr(importlib.import_module(module_name), name)
    assert f"{cls.__module__}.{cls.__qualname__}" == classpath
    kwargs = EXAMPLES.get(name) or EVENT_EXAMPLES.get(name)
    if kwargs is None:
        return  # a base class or a sensor: importing it by its path is the contract
    trigger = cls(**kwargs)
    stored_path, stored_kwargs = trigger.serialize()
    assert stored_path == classpath
    assert cls(**stored_kwargs) == trigger
