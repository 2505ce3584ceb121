"""The client contract of docs/development.md, kept by a complete example and by every client package.

The example (``tests/unit/contract/_files``) is what a newcomer copies: these tests run it as a
wait, so the guide's example cannot rot.
"""

from __future__ import annotations

import asyncio
import dataclasses
import functools
import importlib
import inspect
import json
from pathlib import Path

import pytest

from airflow_deferrable_kit.leases import held_keys
from airflow_deferrable_kit.testing import run_trigger
from tests.unit.contract._files.client import FilesOptions, classify_files_error, load_options
from tests.unit.contract.files_trigger import FileArrivedTrigger


@pytest.fixture
def directory(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    (tmp_path / "landing").mkdir()
    conn = {"conn_type": "fs", "host": str(tmp_path), "password": "s3cr3t-files"}
    monkeypatch.setenv("AIRFLOW_CONN_FILES", json.dumps(conn))
    return tmp_path


def trigger(**kwargs: object) -> FileArrivedTrigger:
    return FileArrivedTrigger(**{"files_conn_id": "files", "folder": "landing", "name": "_SUCCESS", **kwargs})


def test_the_example_waits_for_its_file_on_one_shared_reader(directory: Path) -> None:
    async def scenario() -> list[dict[str, object]]:
        waits = [asyncio.ensure_future(run_trigger(trigger(), timeout=10)) for _ in range(3)]
        await asyncio.sleep(0.2)
        assert not any(wait.done() for wait in waits)
        assert list(held_keys().values()) == [3]  # three waits, one reader
        (directory / "landing" / "_SUCCESS").write_text("done")
        events = await asyncio.gather(*waits)
        assert held_keys() == {}  # the last wait out closed it
        return [event.payload for event in events]

    payloads = asyncio.run(scenario())
    assert [p["status"] for p in payloads] == ["success"] * 3
    assert payloads[0]["name"] == "_SUCCESS"


def test_the_library_error_reaches_the_payload_as_the_vocabulary_says(directory: Path) -> None:
    payload = asyncio.run(run_trigger(trigger(folder="missing"), timeout=10)).payload
    assert (payload["status"], payload["error_type"]) == ("error", "not_found")


def test_each_library_error_maps_to_one_type_and_others_are_left_to_the_caller() -> None:
    mapped = {
        "not_found": classify_files_error(FileNotFoundError(2, "No such file", "/x")),
        "authorization": classify_files_error(PermissionError(13, "Permission denied", "/x")),
        "unavailable": classify_files_error(OSError(5, "I/O error")),
    }
    assert {name: error.error_type if error else None for name, error in mapped.items()} == {
        name: name for name in mapped
    }
    assert classify_files_error(ValueError("not the library's")) is None


def test_the_options_are_frozen_hashable_and_keep_the_token_out_of_repr(directory: Path) -> None:
    options = asyncio.run(load_options("files"))
    assert options == FilesOptions(root=str(directory), token="s3cr3t-files")
    assert hash(options) == hash(FilesOptions(root=str(directory), token="s3cr3t-files"))
    assert "s3cr3t" not in repr(options)
    with pytest.raises(AttributeError):
        options.root = "/elsewhere"  # type: ignore[misc]


#: Each client package's door: the module with ``load_options`` and the classifier, and the
#: module with its one pair of open / close verbs (S3's poller opens from the options the client
#: module makes, one floor above it).
DOORS = {
    "airflow_deferrable_kit._s3": ("client", "poller"),
    "airflow_deferrable_kit._http": ("client", "client"),
    "airflow_deferrable_kit._postgres": ("client", "client"),
    "airflow_deferrable_kit._kafka": ("client", "client"),
    "tests.unit.contract._files": ("client", "client"),
}


@pytest.mark.parametrize("package", DOORS)
def test_every_client_package_has_the_same_three_verbs(package: str) -> None:
    """``load_options(conn_id) -> frozen options`` with a ``lease_key``; one ``open_<client>(options)``
    with its ``close_<client>``; one ``classify_<lib>_error``."""
    options_module, open_module = (importlib.import_module(f"{package}.{name}") for name in DOORS[package])
    load = options_module.load_options
    assert inspect.iscoroutinefunction(load)
    assert next(iter(inspect.signature(load).parameters)).endswith("conn_id")
    options = getattr(options_module, str(load.__annotations__["return"]))  # annotations are strings here
    assert dataclasses.is_dataclass(options) and options.__dataclass_params__.frozen, options  # type: ignore[attr-defined]
    assert isinstance(inspect.getattr_static(options, "lease_key"), (property, functools.cached_property)), options

    opens = [
        name
        for name, value in vars(open_module).items()
        if name.startswith("open_") and inspect.iscoroutinefunction(value) and value.__module__ == open_module.__name__
    ]
    assert len(opens) == 1 or package.endswith("_postgres"), opens  # Postgres: the pool and the batching engine
    for name in opens:
        verb = getattr(open_module, name)
        [parameter] = inspect.signature(verb).parameters
        assert verb.__annotations__[parameter] == options.__name__, (name, verb.__annotations__)
        assert inspect.iscoroutinefunction(getattr(importlib.import_module(verb.__module__), "close_" + name[5:]))

    classifiers = [name for name in vars(options_module) if name.startswith("classify_") and name.endswith("_error")]
    assert len(classifiers) == 1, classifiers
