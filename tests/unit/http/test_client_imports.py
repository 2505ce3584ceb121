"""aiohttp's lazy import: a half-made module is never handed out."""

from __future__ import annotations

import importlib.machinery
import subprocess
import sys
import types

import pytest

from airflow_deferrable_kit._http.client import classify_aiohttp_error, loaded_module


def test_a_module_whose_import_is_under_way_is_not_loaded(monkeypatch: pytest.MonkeyPatch) -> None:
    half = types.ModuleType("adk_half_made")
    half.__spec__ = importlib.machinery.ModuleSpec("adk_half_made", None)
    half.__spec__._initializing = True  # type: ignore[attr-defined]  # as importlib marks it meanwhile
    monkeypatch.setitem(sys.modules, "adk_half_made", half)
    assert loaded_module("adk_half_made") is None
    half.__spec__._initializing = False  # type: ignore[attr-defined]
    assert loaded_module("adk_half_made") is half
    assert loaded_module("adk_never_imported") is None


def test_the_classifier_leaves_an_error_alone_while_aiohttp_is_half_made(monkeypatch: pytest.MonkeyPatch) -> None:
    half = types.ModuleType("aiohttp")  # no ClientError yet, as in the middle of its import
    half.__spec__ = importlib.machinery.ModuleSpec("aiohttp", None)
    half.__spec__._initializing = True  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "aiohttp", half)
    assert classify_aiohttp_error(OSError("refused")) is None


FRESH_PROCESS = """
import asyncio, sys
from airflow_deferrable_kit._http import client

async def main():
    assert "aiohttp" not in sys.modules

    async def one():
        module = await client._import_aiohttp()
        return bool(module.TCPConnector and module.ClientConnectorCertificateError)

    print(all(await asyncio.gather(*(one() for _ in range(200)))))

asyncio.run(main())
"""


def test_two_hundred_waits_importing_aiohttp_at_once_each_get_the_whole_module() -> None:
    """In a fresh triggerer process the first waits all ask at once (before this was fixed, all but
    the first took the half-made module from ``sys.modules``: no ``TCPConnector``)."""
    done = subprocess.run([sys.executable, "-c", FRESH_PROCESS], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip().splitlines()[-1] == "True"
