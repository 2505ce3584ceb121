"""``airflow-deferrable-kit audit`` on the command line: outputs, the default database, bad input."""

from __future__ import annotations

import csv
import datetime as dt
import hashlib
import io
import json
from pathlib import Path

import pytest
import sqlalchemy as sa

from airflow_deferrable_kit import audit as audit_module
from airflow_deferrable_kit.audit import SQL_ALCHEMY_CONN_ENV, AuditError, open_engine, run_audit
from airflow_deferrable_kit.cli import ProgressPrinter, main
from scripts import services
from tests.integration.audit.conftest import MetadataDB
from tests.integration.audit.scenario import KIT, RANKED, populate

UTC = dt.timezone.utc


@pytest.fixture
def recent(sqlite_db: MetadataDB) -> MetadataDB:
    """The scenario a day before the real now, since the command line has no --now."""
    populate(sqlite_db, base=dt.datetime.now(UTC) - dt.timedelta(days=1))
    return sqlite_db


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(["audit", *argv])
    out, err = capsys.readouterr()
    return code, out, err


def test_json_output(recent: MetadataDB, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = run(capsys, "--sql-alchemy-conn", recent.url, "--format", "json", "--price", "2.5")
    assert code == 0, err
    data = json.loads(out)
    assert [c["task_id"] for c in data["candidates"]] == RANKED
    poke = next(r for r in data["rows"] if r["task_id"] == "wait_poke")
    assert poke["cost"] == pytest.approx(2.5)
    assert poke["kit_equivalent"] == KIT + "s3.S3KeySensor"
    assert err == ""  # stderr is not a terminal: no progress unless asked


def test_csv_output_by_operator(recent: MetadataDB, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run(capsys, "--sql-alchemy-conn", recent.url, "--format", "csv", "--by", "operator")
    assert code == 0
    records = {r["operator"]: r for r in csv.DictReader(io.StringIO(out))}
    assert float(records["S3KeySensor"]["worker_held_hours"]) == pytest.approx(3601.5 / 3600, abs=1e-6)
    assert records["HttpSensor"]["modes"] == "reschedule"


def test_table_output_and_days(recent: MetadataDB, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run(capsys, "--sql-alchemy-conn", recent.url, "--top", "1")
    assert code == 0
    assert "wait_poke" in out and "Sensors worth migrating" in out and "6 more not shown" in out
    assert "wait_old" not in out
    code, out, _ = run(capsys, "--sql-alchemy-conn", recent.url, "--days", "30")
    assert code == 0 and "wait_old" in out


def test_run_id_narrows_the_audit_to_that_dag_run(recent: MetadataDB, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = run(
        capsys, "--sql-alchemy-conn", recent.url, "--days", "30", "--run-id", "run_old", "--format", "json"
    )
    assert code == 0, err
    assert [row["task_id"] for row in json.loads(out)["rows"]] == ["wait_old"]
    code, out, _ = run(capsys, "--sql-alchemy-conn", recent.url, "--run-id", "run_1", "--run-id", "run_old")
    assert code == 0 and "wait_poke" in out and "wait_old" not in out  # run_old is older than 7 days


def test_progress_on_request(recent: MetadataDB, capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = run(capsys, "--sql-alchemy-conn", recent.url, "--format", "json", "--progress")
    assert code == 0
    assert err.splitlines()[-1] == "audit: 2/2 DAGs, 14 task tries read"


def test_progress_rewrites_one_line_on_a_terminal() -> None:
    class Terminal(io.StringIO):
        def isatty(self) -> bool:
            return True

    stream = Terminal()
    printer = ProgressPrinter(stream, interval=0)
    printer(audit_module.Progress(1, 3, 10))
    printer(audit_module.Progress(3, 3, 25))
    printer.close()
    assert stream.getvalue() == "\raudit: 1/3 DAGs, 10 task tries read\raudit: 3/3 DAGs, 25 task tries read\n"


def test_default_database_from_airflows_environment_variable(
    recent: MetadataDB, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(SQL_ALCHEMY_CONN_ENV, recent.url)
    code, out, _ = run(capsys, "--format", "json")
    assert code == 0
    assert json.loads(out)["database"] == recent.url


def test_default_database_from_airflows_configuration(
    recent: MetadataDB, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    from airflow.configuration import conf

    monkeypatch.delenv(SQL_ALCHEMY_CONN_ENV, raising=False)
    asked: list[tuple[str, str]] = []
    original = conf.get

    def get(section: str, key: str, *args: object, **kwargs: object) -> object:
        asked.append((section, key))
        if (section, key) == ("database", "sql_alchemy_conn"):
            return recent.url
        return original(section, key, *args, **kwargs)

    monkeypatch.setattr(conf, "get", get)
    code, out, _ = run(capsys, "--format", "json")
    assert code == 0
    assert ("database", "sql_alchemy_conn") in asked
    assert json.loads(out)["database"] == recent.url


@pytest.mark.parametrize(
    ("argv", "argument", "reason"),
    [
        (["--days", "-3"], "--days", "positive number of days"),
        (["--days", "0"], "--days", "positive number of days"),
        (["--days", "week"], "--days", "must be a number of days"),
        (["--price-per-slot-hour", "cheap"], "--price-per-slot-hour", "must be a number"),
        (["--price", "-1"], "--price-per-slot-hour", "non-negative"),
        (["--price", "nan"], "--price-per-slot-hour", "non-negative"),
        (["--check-seconds", "x"], "--check-seconds", "must be a number of seconds"),
        (["--top", "-1"], "--top", "zero or more"),
        (["--by", "team"], "--by", "invalid choice"),
        (["--format", "xml"], "--format", "invalid choice"),
        (["--sql-alchemy-conn", "foo://db/airflow"], "--sql-alchemy-conn", "unknown database URL scheme 'foo'"),
        (["--sql-alchemy-conn", "not a url"], "--sql-alchemy-conn", "not a database URL"),
        (["--sql-alchemy-conn", "sqlite:////nonexistent/airflow.db"], "--sql-alchemy-conn", "no SQLite database"),
        (["--sql-alchemy-conn", "sqlite://"], "--sql-alchemy-conn", "in-memory"),
    ],
)
def test_bad_input_names_the_argument_and_exits_2(
    argv: list[str], argument: str, reason: str, capsys: pytest.CaptureFixture[str]
) -> None:
    code, out, err = run(capsys, *argv)
    assert code == 2
    assert out == ""
    assert f"argument {argument}" in err
    assert reason in err


def test_not_an_airflow_database_exits_1(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "other.db"
    engine = sa.create_engine(f"sqlite:///{path}")
    with engine.begin() as connection:
        connection.execute(sa.text("CREATE TABLE task_instance (dag_id TEXT)"))
    engine.dispose()
    code, _, err = run(capsys, "--sql-alchemy-conn", f"sqlite:///{path}")
    assert code == 1
    assert "is not an Airflow 3 metadata database" in err and "task_instance lacks" in err


def test_unreachable_database_exits_1_without_showing_the_password(capsys: pytest.CaptureFixture[str]) -> None:
    url = f"postgresql+psycopg2://airflow:s3cret-pw@127.0.0.1:{services.free_port()}/airflow"
    code, _, err = run(capsys, "--sql-alchemy-conn", url)
    assert code == 1
    assert "could not connect to postgresql+psycopg2://airflow:***@127.0.0.1" in err
    assert "s3cret-pw" not in err


def test_help_and_missing_command(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["audit", "--help"]) == 0
    assert "--sql-alchemy-conn" in capsys.readouterr().out
    assert main([]) == 2
    assert "audit" in capsys.readouterr().err


def test_the_audit_never_writes(recent: MetadataDB, metadata_db: MetadataDB) -> None:
    path = Path(recent.url.removeprefix("sqlite:///"))
    before = hashlib.sha256(path.read_bytes()).hexdigest()
    run_audit(recent.url)
    assert hashlib.sha256(path.read_bytes()).hexdigest() == before
    # Even a deliberate write through the audit's engine is refused, on either database.
    engine = open_engine(metadata_db.url)
    try:
        with engine.connect() as connection, pytest.raises(sa.exc.DBAPIError, match=r"(?i)read.?only"):
            connection.execute(sa.text("CREATE TABLE audit_wrote_here (i integer)"))
    finally:
        engine.dispose()


def test_library_errors_are_typed(tmp_path: Path) -> None:
    with pytest.raises(AuditError, match="no SQLite database"):
        run_audit(f"sqlite:///{tmp_path}/missing.db")
    with pytest.raises(AuditError, match="--days"):
        run_audit("sqlite://", days=-1)
