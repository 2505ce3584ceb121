"""Packaging: the sdist and the wheel, really built, carry what an installed provider needs.

The build is the one a release makes (``python -m build``: the sdist first, then the wheel from
that sdist), run on a copy of the repository so nothing lands in the work tree. Building the wheel
from the sdist proves the sdist is complete; the listings prove it carries nothing that cannot run
from it (the tests need the repository's docs, scripts and services, so they stay out).
"""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
import tarfile
import zipfile
from email.message import Message
from email.parser import Parser
from pathlib import Path

import pytest

import airflow_deferrable_kit
from scripts.airflow_floor import airflow_floor
from tests import REPO

ROOT = REPO
PACKAGE = "airflow_deferrable_kit"
# What a fresh clone would not have: local environments, caches and earlier build output.
NOT_IN_A_CLONE = shutil.ignore_patterns(
    ".git", ".venv", "__pycache__", "*.egg-info", "build", "dist", "site", ".services", ".hypothesis", ".*_cache"
)


class Built:
    def __init__(self, sdist: Path, wheel: Path) -> None:
        self.sdist = sdist
        self.wheel = wheel
        with tarfile.open(sdist) as tar:
            top = f"{sdist.name.removesuffix('.tar.gz')}/"
            self.sdist_files = {m.name.removeprefix(top) for m in tar.getmembers() if m.isfile()}
        with zipfile.ZipFile(wheel) as whl:
            self.wheel_files = set(whl.namelist())
            self.dist_info = next(n.split("/")[0] for n in self.wheel_files if n.split("/")[0].endswith(".dist-info"))
            self.metadata: Message = Parser().parsestr(whl.read(f"{self.dist_info}/METADATA").decode())
            self.entry_points = whl.read(f"{self.dist_info}/entry_points.txt").decode()


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> Built:
    base = tmp_path_factory.mktemp("packaging")
    source = base / "source"
    shutil.copytree(ROOT, source, ignore=NOT_IN_A_CLONE)
    out = base / "dist"
    result = subprocess.run(
        [sys.executable, "-m", "build", "--no-isolation", "--outdir", str(out), str(source)],
        capture_output=True,
        text=True,
        check=False,
        timeout=120,
    )
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    (sdist,) = out.glob("*.tar.gz")
    (wheel,) = out.glob("*.whl")
    return Built(sdist, wheel)


def _package_modules() -> set[str]:
    return {p.relative_to(ROOT).as_posix() for p in (ROOT / PACKAGE).rglob("*.py")}


def test_the_wheel_carries_every_module_py_typed_and_the_license(built: Built) -> None:
    assert f"{PACKAGE}/py.typed" in built.wheel_files
    assert f"{built.dist_info}/licenses/LICENSE" in built.wheel_files
    modules = {n for n in built.wheel_files if n.endswith(".py")}
    assert modules == _package_modules()
    assert {n.split("/")[0] for n in built.wheel_files} == {PACKAGE, built.dist_info}


def test_the_wheel_metadata_is_a_providers(built: Built) -> None:
    metadata = built.metadata
    assert metadata["Name"] == "airflow-deferrable-kit"
    assert metadata["Version"] == airflow_deferrable_kit.__version__
    assert metadata["License-Expression"] == "Apache-2.0"
    assert metadata.get_all("License-File") == ["LICENSE"]
    urls = dict(u.split(", ", 1) for u in metadata.get_all("Project-URL") or [])
    assert set(urls) == {"Documentation", "Source", "Changelog"}
    assert "[apache_airflow_provider]" in built.entry_points
    assert "provider_info = airflow_deferrable_kit.get_provider_info:get_provider_info" in built.entry_points
    floor = re.escape(airflow_floor())
    assert any(re.fullmatch(rf"apache-airflow>={floor}", r) for r in metadata.get_all("Requires-Dist") or [])


def test_the_sdist_carries_the_package_and_its_documents_only(built: Built) -> None:
    top_level = {name.split("/")[0] for name in built.sdist_files}
    assert top_level == {
        PACKAGE,
        f"{PACKAGE}.egg-info",
        "PKG-INFO",
        "setup.cfg",
        "pyproject.toml",
        "MANIFEST.in",
        "README.md",
        "LICENSE",
        "CHANGELOG.md",
    }
    modules = {n for n in built.sdist_files if n.startswith(f"{PACKAGE}/") and n.endswith(".py")}
    assert modules == _package_modules()
    assert f"{PACKAGE}/py.typed" in built.sdist_files
    assert not [n for n in built.sdist_files if re.search(r"(^|/)(tests?|conftest)[/._]", n)]


def test_readme_and_quickstart_state_the_declared_airflow_floor() -> None:
    expected = f"apache-airflow>={airflow_floor()}"
    for doc in ("README.md", "docs/quickstart.md"):
        text = (ROOT / doc).read_text()
        assert expected in text, f"{doc} does not state {expected}"
        assert not set(re.findall(r"apache-airflow>=[0-9.]+", text)) - {expected}, doc
