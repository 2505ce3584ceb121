"""Static checks of docker-compose.yaml, the Dockerfile and .dockerignore (no Docker engine here).

The compose file is validated against the Compose Specification JSON schema (vendored in
``schema/``, Apache-2.0, from the compose-spec project via check-jsonschema 0.39.0) and then
against the rules this project sets: images and commands, health checks, loopback-only ports,
one image for every Airflow component, connections that point at real services, no secrets.
"""

from __future__ import annotations

import json
import re
import urllib.parse
from pathlib import Path
from typing import Any

import jsonschema
import pytest

from tests.release.compose_file import (
    AIRFLOW_SERVICES,
    COMPOSE_FILE,
    COMPOSE_SCHEMA,
    CONN_IDS,
    DOCKERFILE,
    DOCKERIGNORE,
    REPO,
    TRIGGERERS,
    InterpolationError,
    connections,
    copy_sources_and_target,
    dockerfile_instructions,
    dockerignore_rules,
    environment,
    interpolate,
    is_ignored,
    load_compose,
    one_shot_services,
    option_value,
    raw_compose,
    strict_yaml_load,
    variables,
)

#: Credentials that are obviously local demo values; anything else must not be in the files.
DEMO_CREDENTIALS = {"airflow", "demo", "demo-secret", "local-demo-token"}
SECRETISH = re.compile(r"PASSWORD|PASSWD|SECRET|TOKEN|FERNET|JWT|ACCESS_KEY|API_KEY|PRIVATE_KEY", re.IGNORECASE)
#: Airflow's own secrets: generated at first start into the config volume, never in the file.
AIRFLOW_SECRETS = ("AIRFLOW__CORE__FERNET_KEY", "AIRFLOW__API_AUTH__JWT_SECRET", "AIRFLOW__API__SECRET_KEY")
INTERPOLATED_DEMO = re.compile(r"\$\{ADK_[A-Z0-9_]+:-(?P<default>[^}]*)\}")
LOOPBACK_PORT = re.compile(r"127\.0\.0\.1:(?P<host>\d+):(?P<container>\d+)(?:/tcp)?")


@pytest.fixture(scope="module")
def compose() -> dict[str, Any]:
    return load_compose()


@pytest.fixture(scope="module")
def services(compose: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return compose["services"]


def command_of(service: dict[str, Any]) -> list[str]:
    command = service["command"]
    return command if isinstance(command, list) else command.split()


# ------------------------------------------------------------------------- the helpers
def test_interpolation_follows_compose_rules() -> None:
    env = {"SET": "value", "EMPTY": ""}
    assert interpolate("${SET:-d} ${UNSET:-d} ${EMPTY:-d} ${EMPTY-d} $SET $$HOME $${X}", env) == (
        "value d d  value $HOME ${X}"
    )
    assert interpolate("${SET:+alt}|${UNSET:+alt}", env) == "alt|"
    with pytest.raises(InterpolationError):
        interpolate("${UNSET:?needs a value}", env)
    with pytest.raises(InterpolationError):
        interpolate("${NESTED:-${INNER}}", env)


def test_dockerignore_matching_follows_docker_rules() -> None:
    rules = "*\n!keep.txt\n!pkg/\n**/__pycache__\n"
    assert is_ignored("other.txt", rules)
    assert not is_ignored("keep.txt", rules)
    assert not is_ignored("pkg/mod.py", rules)
    assert is_ignored("pkg/__pycache__/mod.cpython-311.pyc", rules)
    assert is_ignored(".git/config", rules)


# ---------------------------------------------------------------------- the compose file
def test_compose_file_matches_the_compose_specification() -> None:
    schema = json.loads(COMPOSE_SCHEMA.read_text())
    validator = jsonschema.validators.validator_for(schema)(schema)
    errors = [f"{'/'.join(map(str, e.absolute_path))}: {e.message}" for e in validator.iter_errors(load_compose())]
    assert errors == []


def test_schema_check_catches_a_broken_file() -> None:
    """The schema is strict enough to be worth running: a misspelt key is an error."""
    schema = json.loads(COMPOSE_SCHEMA.read_text())
    broken = load_compose()
    broken["services"]["triggerer-1"]["healthchek"] = broken["services"]["triggerer-1"].pop("healthcheck")
    broken["services"]["scheduler"]["depends_on"]["api-server"]["condition"] = "service_ready"
    errors = list(jsonschema.validators.validator_for(schema)(schema).iter_errors(broken))
    assert len(errors) >= 2


def test_the_file_has_the_production_shape(services: dict[str, dict[str, Any]]) -> None:
    assert {
        "metadata-db",
        "airflow-init",
        *AIRFLOW_SERVICES,
        "s3",
        "kafka",
        "postgres-demo",
        "batch-api",
    } <= set(services)
    commands = {name: command_of(services[name]) for name in AIRFLOW_SERVICES}
    assert commands == {
        "api-server": ["api-server"],
        "scheduler": ["scheduler"],
        "dag-processor": ["dag-processor"],
        "triggerer-1": ["triggerer"],
        "triggerer-2": ["triggerer"],
    }
    assert [name for name, service in services.items() if command_of(service) == ["triggerer"]] == list(TRIGGERERS)


def test_every_service_has_an_image_or_build_and_an_explicit_command(services: dict[str, dict[str, Any]]) -> None:
    for name, service in services.items():
        assert service.get("image") or service.get("build"), name
        assert service.get("command"), f"{name} has no explicit command"


def test_long_running_services_have_health_checks_and_one_shots_do_not_restart(
    services: dict[str, dict[str, Any]],
) -> None:
    one_shots = one_shot_services(services)
    assert one_shots == {"airflow-init", "s3-init", "kafka-init"}
    for name, service in services.items():
        if name in one_shots:
            assert service.get("restart") == "no", name
            assert "healthcheck" not in service and "ports" not in service, name
            continue
        check = service.get("healthcheck") or {}
        test = check.get("test")
        assert test and test != ["NONE"] and not check.get("disable"), f"{name} has no health check"
        assert test[0] in ("CMD", "CMD-SHELL") and len(test) > 1, name
        assert service.get("restart") in ("always", "unless-stopped", "on-failure"), name


def test_every_one_shot_is_awaited_by_a_long_running_service(services: dict[str, dict[str, Any]]) -> None:
    """``docker compose up --wait`` fails on an exited container that no running service waits for."""
    one_shots = one_shot_services(services)
    adopted = {
        target
        for name, service in services.items()
        if name not in one_shots
        for target, spec in (service.get("depends_on") or {}).items()
        if spec["condition"] == "service_completed_successfully"
    }
    assert one_shots - adopted == set()


def test_published_ports_bind_loopback_only(services: dict[str, dict[str, Any]]) -> None:
    published = {}
    for name, service in services.items():
        assert service.get("network_mode") != "host", name
        for port in service.get("ports", []):
            if isinstance(port, dict):
                assert port.get("host_ip") == "127.0.0.1", f"{name}: {port}"
                continue
            match = LOOPBACK_PORT.fullmatch(str(port))
            assert match, f"{name} publishes {port!r}, not 127.0.0.1:HOST:CONTAINER"
            published[name] = (int(match["host"]), int(match["container"]))
    assert published == {
        "api-server": (8080, 8080),
        "s3": (9000, 5000),
        "kafka": (9094, 9094),
        "postgres-demo": (5433, 5432),
        "batch-api": (8000, 8000),
    }
    host_ports = [host for host, _ in published.values()]
    assert len(host_ports) == len(set(host_ports))


def test_overriding_a_port_keeps_loopback() -> None:
    services = load_compose({"ADK_AIRFLOW_PORT": "18080", "ADK_KAFKA_PORT": "19094"})["services"]
    assert services["api-server"]["ports"] == ["127.0.0.1:18080:8080"]
    assert services["kafka"]["ports"] == ["127.0.0.1:19094:9094"]
    # Kafka must advertise the port the host actually reaches it on.
    advertised = services["kafka"]["environment"]["KAFKA_ADVERTISED_LISTENERS"]
    assert "EXTERNAL://127.0.0.1:19094" in advertised.split(",")


def test_airflow_components_share_one_image_settings_and_volumes(services: dict[str, dict[str, Any]]) -> None:
    reference = services["scheduler"]  # LocalExecutor: the worker image
    for name in ("airflow-init", *AIRFLOW_SERVICES):
        service = services[name]
        assert service["image"] == reference["image"], name
        assert service["build"] == reference["build"], name
        assert environment(service) == environment(reference), name
        assert service["volumes"] == reference["volumes"], name
    build = reference["build"]
    assert (REPO / build["context"] / build.get("dockerfile", "Dockerfile")).resolve() == DOCKERFILE
    assert reference["image"] == "airflow-deferrable-kit:local"
    # The batch API reuses that image too (it needs only aiohttp, which the image has).
    assert (services["batch-api"]["image"], services["batch-api"]["build"]) == (reference["image"], build)


def test_triggerers_wait_for_the_database_the_api_and_the_example_setup(services: dict[str, dict[str, Any]]) -> None:
    for name in TRIGGERERS:
        assert services[name]["depends_on"] == {
            "metadata-db": {"condition": "service_healthy"},
            "airflow-init": {"condition": "service_completed_successfully"},
            "api-server": {"condition": "service_healthy"},
            "s3-init": {"condition": "service_completed_successfully"},
            "kafka-init": {"condition": "service_completed_successfully"},
        }
        assert "TriggererJob" in " ".join(services[name]["healthcheck"]["test"])


def test_depends_on_targets_exist_are_healthy_or_done_and_form_no_cycle(
    services: dict[str, dict[str, Any]],
) -> None:
    graph: dict[str, list[str]] = {}
    for name, service in services.items():
        depends = service.get("depends_on") or {}
        assert isinstance(depends, dict), f"{name}: use depends_on with conditions"
        graph[name] = list(depends)
        for target, spec in depends.items():
            assert target in services, f"{name} depends on unknown service {target}"
            assert target != name
            condition = spec["condition"]
            assert condition in ("service_healthy", "service_completed_successfully"), f"{name} -> {target}"
            if condition == "service_healthy":
                assert "healthcheck" in services[target], f"{name} waits for {target} to be healthy: no check"

    def visit(node: str, path: tuple[str, ...]) -> None:
        assert node not in path, f"dependency cycle: {' -> '.join((*path, node))}"
        for target in graph[node]:
            visit(target, (*path, node))

    for name in graph:
        visit(name, ())


def test_airflow_settings_point_at_the_right_services(services: dict[str, dict[str, Any]]) -> None:
    env = environment(services["scheduler"])
    assert env["AIRFLOW__CORE__EXECUTOR"] == "LocalExecutor"
    db = urllib.parse.urlsplit(env["AIRFLOW__DATABASE__SQL_ALCHEMY_CONN"])
    assert db.scheme.startswith("postgresql") and (db.hostname, db.port) == ("metadata-db", 5432)
    metadata_env = environment(services["metadata-db"])
    assert (db.username, db.password, db.path.lstrip("/")) == (
        metadata_env["POSTGRES_USER"],
        metadata_env["POSTGRES_PASSWORD"],
        metadata_env["POSTGRES_DB"],
    )
    execution = urllib.parse.urlsplit(env["AIRFLOW__CORE__EXECUTION_API_SERVER_URL"])
    assert (execution.hostname, execution.port, execution.path) == ("api-server", 8080, "/execution/")
    assert services["api-server"]["ports"][0].endswith(":8080")
    assert env["AIRFLOW__OPERATORS__DEFAULT_DEFERRABLE"] == "true"
    assert env["AIRFLOW__CORE__LOAD_EXAMPLES"] == "false"

    volumes = services["scheduler"]["volumes"]
    assert f"./dags:{env['AIRFLOW__CORE__DAGS_FOLDER']}:ro" in volumes
    config_dir = str(Path(env["AIRFLOW_CONFIG"]).parent)
    config_volume = next(v.split(":")[0] for v in volumes if v.split(":")[1] == config_dir)
    assert config_volume in raw_compose()["volumes"], "airflow.cfg must live on a named volume all components share"
    assert env["AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_PASSWORDS_FILE"].startswith(config_dir + "/")


def test_airflow_init_generates_the_config_then_migrates(services: dict[str, dict[str, Any]]) -> None:
    script = services["airflow-init"]["command"][-1]
    assert script.index("airflow config list") < script.index("airflow db migrate")
    assert services["airflow-init"]["depends_on"] == {"metadata-db": {"condition": "service_healthy"}}


def test_named_volumes_and_configs_are_declared(compose: dict[str, Any]) -> None:
    declared_volumes = set(compose.get("volumes") or {})
    declared_configs = set(compose.get("configs") or {})
    used_volumes: set[str] = set()
    for name, service in compose["services"].items():
        for volume in service.get("volumes", []):
            source = volume.split(":")[0]
            if not source.startswith((".", "/")):
                used_volumes.add(source)
            else:
                assert (REPO / source).exists() or source == "./dags", f"{name} mounts missing {source}"
        for config in service.get("configs", []):
            assert config["source"] in declared_configs, name
    assert used_volumes == declared_volumes


# --------------------------------------------------------------------------- connections
def test_connections_are_defined_for_the_examples_on_every_airflow_component(
    services: dict[str, dict[str, Any]],
) -> None:
    for name in ("airflow-init", *AIRFLOW_SERVICES):
        assert set(connections(services[name])) == set(CONN_IDS), name


def test_connections_point_at_the_example_services(services: dict[str, dict[str, Any]]) -> None:
    conns = connections(services["triggerer-1"])

    s3 = conns["s3_demo"]
    endpoint = urllib.parse.urlsplit(s3["extra"]["endpoint_url"])
    assert s3["conn_type"] == "aws" and endpoint.hostname == "s3"
    assert endpoint.port == int(option_value(command_of(services["s3"]), "-p"))
    # Virtual-host addressing would ask DNS for <bucket>.s3, which does not exist on the network.
    assert s3["extra"]["config_kwargs"]["s3"]["addressing_style"] == "path"
    assert (s3["login"], s3["password"]) == (
        environment(services["s3-init"])["AWS_ACCESS_KEY_ID"],
        environment(services["s3-init"])["AWS_SECRET_ACCESS_KEY"],
    )

    api = conns["batch_api"]
    assert (api["conn_type"], api["host"]) == ("http", "batch-api")
    assert api["port"] == int(option_value(command_of(services["batch-api"]), "--port"))
    assert api["extra"]["auth_type"] == "bearer"
    assert api["password"] == environment(services["batch-api"])["BATCH_API_TOKEN"]

    pg = conns["warehouse"]
    pg_env = environment(services["postgres-demo"])
    assert (pg["conn_type"], pg["host"], pg["port"]) == ("postgres", "postgres-demo", 5432)
    assert (pg["login"], pg["password"], pg["schema"]) == (
        pg_env["POSTGRES_USER"],
        pg_env["POSTGRES_PASSWORD"],
        pg_env["POSTGRES_DB"],
    )

    kafka = conns["kafka_default"]
    kafka_env = environment(services["kafka"])
    listeners = dict(item.split("://") for item in kafka_env["KAFKA_ADVERTISED_LISTENERS"].split(","))
    assert kafka["conn_type"] == "kafka"
    assert kafka["extra"]["bootstrap.servers"] == listeners["PLAINTEXT"] == "kafka:9092"
    assert "PLAINTEXT://:9092" in kafka_env["KAFKA_LISTENERS"].split(",")
    assert "--bootstrap-server kafka:9092" in services["kafka-init"]["command"][-1]


def kafka_init_topics(services: dict[str, dict[str, Any]]) -> list[str]:
    script = services["kafka-init"]["command"][-1]
    loop = re.search(r"for topic in ([^;]+);", script)
    assert loop and '--topic "$topic"' in script, script
    return loop.group(1).split()


def test_kafka_init_creates_the_topics_the_examples_read(services: dict[str, dict[str, Any]]) -> None:
    created = kafka_init_topics(services)
    assert "batch-events" in created
    topics_arg = re.compile(r"\btopics\s*=\s*(\[[^\]]*\]|\"[^\"]*\"|'[^']*')")
    named: set[str] = set()
    for path in sorted((REPO / "dags").glob("**/*.py")):
        for literal in topics_arg.findall(path.read_text()):
            named.update(re.findall(r"[\"']([^\"'{}]+)[\"']", literal))
    assert sorted(named - set(created)) == []


def test_overridden_credentials_reach_both_ends() -> None:
    """One variable changes a credential for the service and for its Airflow connection alike."""
    env = {"ADK_BATCH_API_TOKEN": "t0k", "ADK_POSTGRES_DEMO_PASSWORD": "pw", "ADK_METADATA_DB_PASSWORD": "mpw"}
    services = load_compose(env)["services"]
    conns = connections(services["scheduler"])
    assert conns["batch_api"]["password"] == environment(services["batch-api"])["BATCH_API_TOKEN"] == "t0k"
    assert conns["warehouse"]["password"] == environment(services["postgres-demo"])["POSTGRES_PASSWORD"] == "pw"
    db = urllib.parse.urlsplit(environment(services["scheduler"])["AIRFLOW__DATABASE__SQL_ALCHEMY_CONN"])
    assert db.password == environment(services["metadata-db"])["POSTGRES_PASSWORD"] == "mpw"


def test_example_dags_use_only_defined_connection_ids() -> None:
    """Every literal ``*_conn_id="..."`` in dags/ names a connection the compose file defines."""
    pattern = re.compile(r"\b\w+_conn_id\s*=\s*[\"']([A-Za-z0-9_]+)[\"']")
    used = {
        (path.name, conn_id)
        for path in sorted((REPO / "dags").glob("**/*.py"))
        for conn_id in pattern.findall(path.read_text())
    }
    assert [(name, conn_id) for name, conn_id in used if conn_id not in CONN_IDS] == []


# ------------------------------------------------------------------------------- secrets
def _secret_values(service_name: str, env: dict[str, str]) -> list[tuple[str, str]]:
    """(where, raw value) of every credential-looking value in a service's raw environment."""
    found = []
    for key, value in env.items():
        if key.endswith("_FILE"):
            continue  # where a secret is kept (a path), not a secret
        if key.startswith("AIRFLOW_CONN_"):
            conn = json.loads(value)
            items = {"password": conn.get("password"), **{k: v for k, v in (conn.get("extra") or {}).items()}}
            found += [(f"{service_name}.{key}.{k}", str(v)) for k, v in items.items() if v and SECRETISH.search(k)]
        elif key.endswith("SQL_ALCHEMY_CONN"):
            found.append((f"{service_name}.{key}", urllib.parse.urlsplit(value).password or ""))
        elif SECRETISH.search(key):
            found.append((f"{service_name}.{key}", value))
    return found


def test_credentials_are_overridable_local_demo_values_only() -> None:
    raw_services = raw_compose()["services"]
    checked = []
    for name, service in raw_services.items():
        env = environment(service)
        for secret in AIRFLOW_SECRETS:
            assert secret not in env, f"{name} sets {secret}: airflow-init generates it into the config volume"
        for where, value in _secret_values(name, env):
            match = INTERPOLATED_DEMO.fullmatch(value)
            assert match, f"{where} must be ${{ADK_...:-demo value}}, got {value!r}"
            assert match["default"] in DEMO_CREDENTIALS, f"{where} default {match['default']!r} is not a demo value"
            checked.append(where)
    # The check above is not vacuous: it saw every credential the file has.
    assert {w.split(".", 1)[1] for w in checked} >= {
        "AIRFLOW__DATABASE__SQL_ALCHEMY_CONN",
        "AIRFLOW_CONN_S3_DEMO.password",
        "AIRFLOW_CONN_BATCH_API.password",
        "AIRFLOW_CONN_WAREHOUSE.password",
        "POSTGRES_PASSWORD",
        "BATCH_API_TOKEN",
        "AWS_SECRET_ACCESS_KEY",
    }


def test_no_credential_literal_hides_in_commands_or_files() -> None:
    text = COMPOSE_FILE.read_text()
    for needle in ("aws_secret_access_key=", "password=", "token=", "fernet_key", "jwt_secret", "BEGIN PRIVATE KEY"):
        assert needle not in text.lower(), needle


# ----------------------------------------------------------------------------- Dockerfile
@pytest.fixture(scope="module")
def dockerfile() -> list[Any]:
    return dockerfile_instructions(DOCKERFILE.read_text())


def test_dockerfile_parser_joins_continuations_and_drops_comments() -> None:
    parsed = dockerfile_instructions("FROM x\n# note\nRUN a \\\n# inside\n    b\nUSER y\n")
    assert [(i.keyword, i.arguments) for i in parsed] == [("FROM", "x"), ("RUN", "a b"), ("USER", "y")]


def test_dockerfile_extends_the_official_image(dockerfile: list[Any]) -> None:
    assert [i.arguments for i in dockerfile if i.keyword == "FROM"] == ["apache/airflow:3.3.2"]
    users = [i.arguments for i in dockerfile if i.keyword == "USER"]
    assert users and users[-1] == "airflow", "the image must run as the airflow user, as the official one does"


def test_dockerfile_installs_the_package_source_with_all_extras(dockerfile: list[Any]) -> None:
    copied: dict[str, str] = {}
    for instruction in dockerfile:
        if instruction.keyword in ("COPY", "ADD"):
            sources, target = copy_sources_and_target(instruction.arguments)
            for source in sources:
                copied[source] = target
    assert {"pyproject.toml", "airflow_deferrable_kit"} <= set(copied)
    source_dir = copied["pyproject.toml"].rstrip("/")
    runs = " ".join(i.arguments for i in dockerfile if i.keyword == "RUN")
    install = re.search(r"pip install [^;]*", runs)
    assert install, "no pip install in the Dockerfile"
    assert f'"{source_dir}[all]"' in install.group(0)
    # Pin Airflow in the same resolve so installing our extras can never move Airflow itself.
    assert '"apache-airflow==${AIRFLOW_VERSION}"' in install.group(0)
    assert copied["airflow_deferrable_kit"].rstrip("/") == f"{source_dir}/airflow_deferrable_kit"


def test_dockerfile_bakes_in_no_secret(dockerfile: list[Any]) -> None:
    for instruction in dockerfile:
        if instruction.keyword in ("ENV", "ARG", "LABEL"):
            names = re.findall(r"([A-Za-z_][A-Za-z0-9_.-]*)\s*=", instruction.arguments) or [
                instruction.arguments.split()[0]
            ]
            assert not [n for n in names if SECRETISH.search(n) or n.startswith("AIRFLOW_CONN_")], instruction
        if instruction.keyword == "RUN":
            # The Airflow CLI would write airflow.cfg (fernet key, JWT secret) or a DB into a layer.
            assert not re.search(r"(^|[;&|]\s*)airflow\s", instruction.arguments), instruction
        if instruction.keyword in ("COPY", "ADD"):
            sources, _ = copy_sources_and_target(instruction.arguments)
            assert not [s for s in sources if s in (".", "./") or ".env" in s], instruction
    text = DOCKERFILE.read_text().lower()
    assert "airflow_conn_" not in text and "password=" not in text and "token=" not in text


def test_dockerignore_keeps_the_context_to_the_package() -> None:
    text = DOCKERIGNORE.read_text()
    assert list(dockerignore_rules(text)), ".dockerignore is empty"
    for needed in (
        "pyproject.toml",
        "README.md",
        "LICENSE",
        "airflow_deferrable_kit/__init__.py",
        "airflow_deferrable_kit/py.typed",
    ):
        assert not is_ignored(needed, text), needed
    for unwanted in (
        ".env",
        "airflow_deferrable_kit/.env",
        ".venv/bin/python",
        ".git/config",
        "tests/conftest.py",
        "dags/example.py",
        "airflow_deferrable_kit/__pycache__/payload.cpython-312.pyc",
        "airflow_deferrable_kit.egg-info/PKG-INFO",
    ):
        assert is_ignored(unwanted, text), unwanted
    for instruction in dockerfile_instructions(DOCKERFILE.read_text()):
        if instruction.keyword == "COPY":
            for source in copy_sources_and_target(instruction.arguments)[0]:
                assert (REPO / source).exists() and not is_ignored(source, text), source


# ------------------------------------------------------------------------------ the docs
def test_docs_cover_services_ports_connections_and_variables(services: dict[str, dict[str, Any]]) -> None:
    docs = (REPO / "docs" / "docker-compose.md").read_text()
    for name in services:
        assert f"`{name}`" in docs, f"docs/docker-compose.md does not mention service {name}"
    for conn_id in CONN_IDS:
        assert f"`{conn_id}`" in docs, conn_id
    for name, default in variables(COMPOSE_FILE.read_text()).items():
        if name.startswith("ADK_"):
            assert f"`{name}`" in docs, f"docs/docker-compose.md does not document {name}"
            if default and not SECRETISH.search(name):
                assert default in docs, f"the default of {name} ({default}) is not in the docs"


def test_compose_yaml_has_no_duplicate_keys() -> None:
    """PyYAML keeps the last of two equal keys silently; compose rejects them. Catch it here."""
    assert strict_yaml_load(COMPOSE_FILE.read_text())["services"]
    with pytest.raises(AssertionError, match="duplicate keys at line 2"):
        strict_yaml_load("a:\n  b: 1\n  b: 2\n")
    # Keys brought in by a merge (<<) may be overridden: that is how the anchors are used.
    assert strict_yaml_load("x: &x {b: 1}\na:\n  <<: *x\n  b: 2\n")["a"] == {"b": 2}
