"""The lowest apache-airflow this package declares, read from pyproject.toml (its one home).

``scripts/check-airflow-floor.sh`` installs exactly this version to prove it, and the packaging
tests check that the built wheel and the install docs state the same floor.

Command line: ``python scripts/airflow_floor.py`` prints it.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

if sys.version_info >= (3, 11):
    import tomllib
else:  # pytest brings tomli on Python 3.10
    import tomli as tomllib

PYPROJECT = Path(__file__).resolve().parent.parent / "pyproject.toml"


def airflow_floor(pyproject: Path = PYPROJECT) -> str:
    """The ``X`` of the ``apache-airflow>=X`` requirement; anything else there is a mistake."""
    dependencies = tomllib.loads(pyproject.read_text())["project"]["dependencies"]
    floors = [m.group(1) for d in dependencies if (m := re.fullmatch(r"apache-airflow>=([0-9][0-9.]*)", d))]
    if len(floors) != 1:
        raise ValueError(f"{pyproject}: expected one plain 'apache-airflow>=X' dependency, found {dependencies}")
    return floors[0]


if __name__ == "__main__":
    print(airflow_floor())
