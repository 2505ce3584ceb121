"""A real Airflow on 127.0.0.1 (api-server, scheduler, triggerer, dag-processor; SQLite +
LocalExecutor) in a throw-away AIRFLOW_HOME, plus a small REST client to drive it.

Used by the end-to-end tests, the benchmarks and the demo. Its processes get the caller's
environment without any Airflow setting of the caller's own (see :func:`without_airflow_settings`),
and every process runs in its own session so ``stop()`` can end the whole group, also after Ctrl-C.
"""

from __future__ import annotations

import atexit
import contextlib
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from scripts.services import ServiceUnavailable, free_port, stop_process

COMPONENTS = ("api-server", "scheduler", "triggerer", "dag-processor")
TERMINAL = {"success", "failed", "skipped", "upstream_failed", "removed"}
#: Every variable Airflow reads from the environment starts with one of these: AIRFLOW_HOME,
#: AIRFLOW_CONFIG, AIRFLOW__SECTION__KEY (and its _CMD/_SECRET forms), AIRFLOW_CONN_*,
#: AIRFLOW_VAR_*, and the internal _AIRFLOW_* ones.
AIRFLOW_PREFIXES = ("AIRFLOW_", "_AIRFLOW")
#: The user the simple auth manager creates, and the file it writes that user's password to.
ADMIN_USER = "admin"
PASSWORDS_FILE = "simple_auth_manager_passwords.json.generated"


def without_airflow_settings(environ: Mapping[str, str]) -> dict[str, str]:
    """``environ`` minus every Airflow setting in it (PATH, locale, proxies, ... stay).

    An ``AIRFLOW__DATABASE__SQL_ALCHEMY_CONN`` exported in the caller's shell would otherwise make
    this throw-away Airflow migrate and use that database; an ``AIRFLOW_CONN_*`` would shadow or
    add connections.
    """
    return {name: value for name, value in environ.items() if not name.startswith(AIRFLOW_PREFIXES)}


@dataclass
class LocalAirflow:
    dags_folder: Path
    extra_env: Mapping[str, str] = field(default_factory=dict)
    home: Path = field(default_factory=lambda: Path(tempfile.mkdtemp(prefix="adk-airflow-")))
    port: int = field(default_factory=free_port)
    processes: dict[str, subprocess.Popen[bytes]] = field(default_factory=dict)
    _token: str | None = None
    #: A metadata DB URL (e.g. ``postgresql+psycopg2://...``); ``None`` keeps SQLite in ``home``.
    sql_alchemy_conn: str | None = None
    #: How many triggerer processes to start (named ``triggerer``, ``triggerer-2``, ...).
    triggerers: int = 1
    #: Extra environment of one process only, by its name (``"triggerer"``, ``"dag-processor"``):
    #: a host that differs from the others (fewer extras, code shipped to one component only).
    component_env: Mapping[str, Mapping[str, str]] = field(default_factory=dict)

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def metadata_url(self) -> str:
        """The metadata DB its components use (what ``airflow-deferrable-kit audit`` reads)."""
        return self.sql_alchemy_conn or f"sqlite:///{self.home / 'airflow.db'}"

    @property
    def env(self) -> dict[str, str]:
        """The environment of every Airflow process: the caller's without its Airflow settings,
        then this Airflow's own, then ``extra_env``."""
        env = without_airflow_settings(os.environ)
        env.update(
            {
                "AIRFLOW_HOME": str(self.home),
                "AIRFLOW__DATABASE__SQL_ALCHEMY_CONN": self.metadata_url,
                "AIRFLOW__CORE__DAGS_FOLDER": str(self.dags_folder),
                "AIRFLOW__CORE__LOAD_EXAMPLES": "False",
                "AIRFLOW__CORE__EXECUTOR": "LocalExecutor",
                "AIRFLOW__CORE__PARALLELISM": "4",
                "AIRFLOW__CORE__DAGS_ARE_PAUSED_AT_CREATION": "False",
                "AIRFLOW__DAG_PROCESSOR__REFRESH_INTERVAL": "5",
                "AIRFLOW__API__HOST": "127.0.0.1",
                "AIRFLOW__API__PORT": str(self.port),
                "AIRFLOW__API__BASE_URL": self.base_url,
                "AIRFLOW__CORE__EXECUTION_API_SERVER_URL": f"{self.base_url}/execution/",
                "AIRFLOW__API__WORKERS": "1",
                "AIRFLOW__LOGGING__WORKER_LOG_SERVER_PORT": str(free_port()),
                "AIRFLOW__LOGGING__TRIGGER_LOG_SERVER_PORT": str(free_port()),
                "AIRFLOW__SCHEDULER__SCHEDULER_HEARTBEAT_SEC": "2",
                "AIRFLOW__TRIGGERER__JOB_HEARTBEAT_SEC": "2",
            }
        )
        env.update(self.extra_env)
        return env

    def _airflow(self) -> str:
        candidate = Path(sys.executable).with_name("airflow")
        if candidate.exists():
            return str(candidate)
        found = shutil.which("airflow")
        if not found:
            raise ServiceUnavailable("the airflow command is not installed in this environment")
        return found

    # ------------------------------------------------------------------------- lifecycle
    def start(self, *, timeout: float = 180) -> None:
        self.home.mkdir(parents=True, exist_ok=True)
        clone_migrated(self.metadata_url, self.home, self.env, self._airflow())
        for component in COMPONENTS:
            self.start_component(component)
        for number in range(2, self.triggerers + 1):
            self.start_component("triggerer", name=f"triggerer-{number}")
        self.wait_healthy(timeout=timeout)

    def start_component(
        self, component: str, *, name: str | None = None, options: Sequence[str] = ()
    ) -> subprocess.Popen[bytes]:
        """Start one Airflow component in its own session, logged to ``home/<name>.log``, with
        ``options`` on its command line (``["--queues", "a,b"]``)."""
        name = name or component
        args = [self._airflow(), component, *options]
        if component in ("scheduler", "triggerer"):
            args.append("--skip-serve-logs")
        log = open(self.home / f"{name}.log", "wb")  # noqa: SIM115 - closed with the process
        env = {**self.env, **self.component_env.get(name, {})}
        self.processes[name] = subprocess.Popen(
            args, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
        )
        return self.processes[name]

    def stop_component(self, name: str, *, timeout: float = 30) -> None:
        """Stop one component as an operator would (SIGTERM, then SIGKILL after ``timeout``)."""
        stop_process(self.processes.pop(name), timeout=timeout)

    def wait_healthy(self, *, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        last: Any = None
        while time.monotonic() < deadline:
            for name, proc in self.processes.items():
                if proc.poll() is not None:
                    raise ServiceUnavailable(f"airflow {name} exited early:\n{self.log_tail(name)}")
            try:
                last = self._request("GET", "/api/v2/monitor/health", auth=False)
                needed = ("metadatabase", "scheduler", "triggerer", "dag_processor")
                if all((last.get(part) or {}).get("status") == "healthy" for part in needed):
                    return
            except (OSError, urllib.error.URLError, ValueError):
                pass
            time.sleep(0.5)
        raise ServiceUnavailable(f"Airflow did not become healthy within {timeout:.0f}s; last health: {last}")

    def stop(self) -> None:
        for proc in self.processes.values():
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGTERM)
        end = time.monotonic() + 10
        for proc in self.processes.values():
            try:
                proc.wait(timeout=max(end - time.monotonic(), 0.1))
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(timeout=10)
        self.processes.clear()

    def log_tail(self, component: str, chars: int = 3000) -> str:
        path = self.home / f"{component}.log"
        return path.read_text(errors="replace")[-chars:] if path.exists() else ""

    def worker_exits(self, dag_id: str, run_id: str) -> set[str]:
        """The tasks of a run whose worker exit the scheduler has taken in (its executor event).

        A wait that comes true before then can lose to Airflow's own bookkeeping: the late
        event of the worker that deferred, the same task-instance key as the resumed one's,
        makes the scheduler drop the resumed one from its executor and fail the task as
        "killed externally". The official sensors meet the same race; runs that resume at
        once wait for this instead of guessing a delay.
        """
        # Only an exit: the local executor also reports "running" when a worker starts.
        exits = set()
        for match in EXECUTOR_EVENT.finditer(self.log_tail("scheduler", 2_000_000)):
            if match["dag_id"] == dag_id and match["run_id"] == run_id:
                exits.add(match["task_id"])
        return exits

    def log_offsets(self) -> dict[str, int]:
        """How long each component's log is now: where :meth:`problems_since` starts reading."""
        return {path.stem: path.stat().st_size for path in self.home.glob("*.log")}

    def problems_since(self, offsets: Mapping[str, int] | None = None, *, lines: int = 60) -> str:
        """The warnings, errors and tracebacks each component logged since ``offsets``.

        What a failed end-to-end test prints beside its assertion: a task that Airflow itself
        ended (a scheduler's "state mismatch", a trigger that raised, an executor's failed
        workload) is explained by these lines, and they go with the deployment at teardown.
        """
        sections = []
        for path in sorted(self.home.glob("*.log")):
            with path.open("rb") as log:
                log.seek((offsets or {}).get(path.stem, 0))
                text = log.read().decode(errors="replace")
            found = notable_lines(text)
            if found:
                sections.append(f"--- {path.name}: {len(found)} line(s), the last {lines} ---")
                sections.extend(found[-lines:])
        return "\n".join(sections)

    # ------------------------------------------------------------------------------ REST
    def login(self) -> tuple[str, str]:
        """The UI and REST login: the user and the password the simple auth manager generated."""
        path = self.home / PASSWORDS_FILE
        return ADMIN_USER, str(json.loads(path.read_text())[ADMIN_USER])

    def _request(self, method: str, path: str, body: Any = None, *, auth: bool = True, attempts: int = 5) -> Any:
        """One REST call; idempotent GETs are retried when a busy api-server is slow or restarting."""
        headers = {"Content-Type": "application/json"}
        if auth:
            if self._token is None:
                self._token = self._fetch_token()
            headers["Authorization"] = f"Bearer {self._token}"
        data = None if body is None else json.dumps(body).encode()
        tries = attempts if method == "GET" else 1
        for attempt in range(1, tries + 1):
            request = urllib.request.Request(self.base_url + path, data=data, method=method, headers=headers)
            try:
                with urllib.request.urlopen(request, timeout=60) as response:
                    raw = response.read()
                return json.loads(raw) if raw else None
            except urllib.error.HTTPError as exc:
                if exc.code < 500 or attempt == tries:
                    raise
            except (TimeoutError, urllib.error.URLError, ConnectionError):
                if attempt == tries:
                    raise
            time.sleep(min(2.0 * attempt, 10.0))
        raise AssertionError("unreachable")

    def _fetch_token(self) -> str:
        user, password = self.login()
        body = {"username": user, "password": password}
        return str(self._request("POST", "/auth/token", body, auth=False)["access_token"])

    def api(self, method: str, path: str, body: Any = None) -> Any:
        return self._request(method, path, body)

    def wait_for_dag(self, dag_id: str, *, timeout: float = 90) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            with contextlib.suppress(urllib.error.HTTPError):
                dag = self.api("GET", f"/api/v2/dags/{dag_id}")
                if dag and not dag.get("has_import_errors"):
                    return
            time.sleep(1)
        errors = self.api("GET", "/api/v2/importErrors")
        raise AssertionError(f"DAG {dag_id} was not parsed within {timeout:.0f}s; import errors: {errors}")

    def trigger(self, dag_id: str, conf: Mapping[str, Any] | None = None) -> str:
        run = self.api("POST", f"/api/v2/dags/{dag_id}/dagRuns", {"logical_date": None, "conf": dict(conf or {})})
        return str(run["dag_run_id"])

    def task_instances(self, dag_id: str, run_id: str) -> dict[str, dict[str, Any]]:
        """Every task instance of the run, page after page (the API returns 50 at a time)."""
        found: dict[str, dict[str, Any]] = {}
        seen = 0  # rows, not task ids: the instances of a mapped task share one
        while True:
            path = f"/api/v2/dags/{dag_id}/dagRuns/{run_id}/taskInstances?limit=100&offset={seen}"
            page = self.api("GET", path)
            found.update((ti["task_id"], ti) for ti in page["task_instances"])
            seen += len(page["task_instances"])
            if not page["task_instances"] or seen >= page["total_entries"]:
                return found

    def watch_run(
        self,
        dag_id: str,
        run_id: str,
        *,
        timeout: float = 180,
        interval: float = 0.5,
        on_change: Callable[[str, str, str | None], None] | None = None,
        on_tick: Callable[[WatchedRun], None] | None = None,
    ) -> WatchedRun:
        """Poll the run until it ends, recording when each task was first seen in each state.

        ``on_change(task_id, new_state, old_state)`` reports every transition as it is seen;
        ``on_tick(watched)`` runs after every poll (to act on the run while it waits).
        """
        watched = WatchedRun(dag_id=dag_id, run_id=run_id)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            for task_id, ti in self.task_instances(dag_id, run_id).items():
                previous = watched.state(task_id)
                if watched.observe(task_id, ti) and on_change is not None:
                    on_change(task_id, watched.state(task_id) or "", previous)
            run = self.api("GET", f"/api/v2/dags/{dag_id}/dagRuns/{run_id}")
            watched.run_state = run["state"]
            if run["state"] in ("success", "failed"):
                for task_id, ti in self.task_instances(dag_id, run_id).items():
                    watched.observe(task_id, ti)
                return watched
            if on_tick is not None:
                on_tick(watched)
            time.sleep(interval)
        raise AssertionError(f"run {run_id} of {dag_id} did not finish within {timeout:.0f}s: {watched.states}")

    def xcom(self, dag_id: str, run_id: str, task_id: str, key: str = "return_value") -> Any:
        path = f"/api/v2/dags/{dag_id}/dagRuns/{run_id}/taskInstances/{task_id}/xcomEntries/{key}?deserialize=true"
        return self.api("GET", path)["value"]

    def task_log(self, dag_id: str, run_id: str, task_id: str, try_number: int = 1) -> str:
        path = f"/api/v2/dags/{dag_id}/dagRuns/{run_id}/taskInstances/{task_id}/logs/{try_number}?full_content=true"
        data = self.api("GET", path)
        content = data.get("content", "")
        if isinstance(content, list):
            return "\n".join((item.get("event", "") if isinstance(item, dict) else str(item)) for item in content)
        return str(content)


#: Log lines a healthy component writes over and over, left out of :meth:`LocalAirflow.problems_since`.
ROUTINE_LINES = ("triggers currently running", "watchers currently running", "reached the maximum capacity", "log end")
#: The scheduler's line for an executor event (scheduler_job_runner.process_executor_events).
EXECUTOR_EVENT = re.compile(
    r"Received executor event with state (?:success|failed) for task instance "
    r"TaskInstanceKey\(dag_id='(?P<dag_id>[^']*)', task_id='(?P<task_id>[^']*)', run_id='(?P<run_id>[^']*)'"
)
#: What makes a log line worth printing when a test fails: its level, or a traceback's lines.
NOTABLE = re.compile(r"\b(warning|error|critical|exception)\b|Traceback|^\s+File \"|^\w+(Error|Exception)\b", re.I)


def notable_lines(text: str) -> list[str]:
    """The lines of a component's log a failure is explained by: warnings, errors, tracebacks."""
    return [line for line in text.splitlines() if NOTABLE.search(line) and not any(r in line for r in ROUTINE_LINES)]


#: One migrated metadata database per kind of database server (SQLite, or one PostgreSQL server),
#: made once per process, with the AIRFLOW_HOME it was made in: ``airflow db migrate`` takes
#: 8-20 s, a copy of its result well under one.
_MIGRATED: dict[str, Path] = {}
TEMPLATE_DATABASE = "adk_airflow_metadata_template"


def clone_migrated(metadata_url: str, home: Path, env: Mapping[str, str], airflow: str) -> None:
    """Give ``metadata_url`` (an empty SQLite path or an empty PostgreSQL database) Airflow's
    migrated schema, and ``home`` the configuration file the migration wrote, both copied from a
    template migrated once per process and database server.

    Every deployment starts from the very database ``airflow db migrate`` makes; only the
    migration's run is shared. SQLite copies the file; PostgreSQL re-creates the database from a
    template database (``CREATE DATABASE ... TEMPLATE``) on the same server. The configuration
    file comes along with its paths moved to ``home``: without one, the components started
    together would each write their own with different generated secrets.
    """
    sqlite = metadata_url.startswith("sqlite:///")
    url = urllib.parse.urlsplit(metadata_url)
    key = "sqlite" if sqlite else f"{url.hostname}:{url.port}"
    admin = url._replace(scheme="postgresql", path="/postgres").geturl()
    template_home = _MIGRATED.get(key)
    if template_home is None:
        template_home = Path(tempfile.mkdtemp(prefix="adk-airflow-template-"))
        atexit.register(shutil.rmtree, template_home, ignore_errors=True)  # it lives as long as the process
        if sqlite:
            template_url = f"sqlite:///{template_home / 'airflow.db'}"
        else:
            _postgres(admin, f"DROP DATABASE IF EXISTS {TEMPLATE_DATABASE}", f"CREATE DATABASE {TEMPLATE_DATABASE}")
            template_url = url._replace(path=f"/{TEMPLATE_DATABASE}").geturl()
        _migrate(template_url, {**env, "AIRFLOW_HOME": str(template_home)}, airflow)
        _MIGRATED[key] = template_home
    if sqlite:
        shutil.copyfile(template_home / "airflow.db", Path(metadata_url.removeprefix("sqlite:///")))
    else:
        database = url.path.lstrip("/")
        clone = f"CREATE DATABASE {database} TEMPLATE {TEMPLATE_DATABASE}"
        _postgres(admin, f"DROP DATABASE IF EXISTS {database}", clone)
    config = (template_home / "airflow.cfg").read_text()
    (home / "airflow.cfg").write_text(config.replace(str(template_home), str(home)))


def _migrate(metadata_url: str, env: Mapping[str, str], airflow: str) -> None:
    env = {**env, "AIRFLOW__DATABASE__SQL_ALCHEMY_CONN": metadata_url}
    migrate = subprocess.run([airflow, "db", "migrate"], env=env, capture_output=True, text=True, check=False)
    if migrate.returncode != 0:
        raise ServiceUnavailable(f"airflow db migrate failed:\n{migrate.stderr[-3000:]}")


def _postgres(dsn: str, *statements: str) -> None:
    import psycopg2

    conn = psycopg2.connect(dsn)
    conn.autocommit = True  # CREATE DATABASE runs outside a transaction
    try:
        with conn.cursor() as cur:
            for statement in statements:
                cur.execute(statement)
    finally:
        conn.close()


@dataclass
class WatchedRun:
    """What was seen of a run: each task's states in order, with the wall time first seen."""

    dag_id: str
    run_id: str
    run_state: str | None = None
    timeline: dict[str, list[tuple[float, str]]] = field(default_factory=dict)
    last: dict[str, dict[str, Any]] = field(default_factory=dict)

    @property
    def states(self) -> dict[str, list[str]]:
        return {task_id: [state for _, state in seen] for task_id, seen in self.timeline.items()}

    def state(self, task_id: str) -> str | None:
        seen = self.timeline.get(task_id)
        return seen[-1][1] if seen else None

    def observe(self, task_id: str, ti: Mapping[str, Any]) -> bool:
        """Record the task's state; True if it changed."""
        self.last[task_id] = dict(ti)
        seen = self.timeline.setdefault(task_id, [])
        state = str(ti.get("state"))
        if seen and seen[-1][1] == state:
            return False
        seen.append((time.time(), state))
        return True

    def first_seen(self, task_id: str, state: str) -> float | None:
        return next((at for at, seen in self.timeline.get(task_id, []) if seen == state), None)

    def seconds_in(self, task_id: str, state: str, *, until: float | None = None) -> float:
        """Seconds the task was seen in ``state`` (to the poll interval's precision)."""
        seen = self.timeline.get(task_id, [])
        end = until if until is not None else time.time()
        total = 0.0
        for (at, current), (after, _) in zip(seen, [*seen[1:], (end, "")], strict=True):
            if current == state:
                total += after - at
        return total


@contextlib.contextmanager
def local_airflow(dags_folder: Path, extra_env: Mapping[str, str] | None = None) -> Iterator[LocalAirflow]:
    airflow = LocalAirflow(dags_folder=dags_folder, extra_env=dict(extra_env or {}))
    try:
        airflow.start()
        yield airflow
    finally:
        airflow.stop()
        shutil.rmtree(airflow.home, ignore_errors=True)
