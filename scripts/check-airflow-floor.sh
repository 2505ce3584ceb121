#!/usr/bin/env bash
# Prove the lowest apache-airflow that pyproject.toml declares. It builds the package as a release
# would (the sdist, then the wheel from that sdist), installs the wheel with its test extra next to
# exactly that Airflow in a throw-away venv outside the repository (resolved without a constraints
# file, as a user's pip would), imports every sensor and trigger module from the installed wheel,
# and runs the fast unit tests on that venv.
#
#   scripts/check-airflow-floor.sh                   # the floor, the unit tier
#   scripts/check-airflow-floor.sh tests/unit/s3 -x    # other pytest arguments
#   AIRFLOW_VERSION=3.2.2 scripts/check-airflow-floor.sh   # another version the package allows
#   FLOOR_PYTHON=python3.10 scripts/check-airflow-floor.sh # the venv on another installed Python
#   KIT_DIST=/tmp/dist scripts/check-airflow-floor.sh  # the wheel already built there (make test)
#
# Needs .venv (make venv) for its python and uv.
set -euo pipefail
cd "$(dirname "$0")/.."

PYTHON="${PYTHON:-.venv/bin/python}"
UV="${UV:-.venv/bin/uv}"
floor="$("$PYTHON" scripts/airflow_floor.py)"
version="${AIRFLOW_VERSION:-$floor}"
if [ "$#" -eq 0 ]; then
  # The unit tier, whole; a test of what only a later Airflow has (event triggers need 3.3's
  # shared streams and asset state store) says so with the `airflow_3_3` marker, and on an
  # earlier Airflow it is deselected here, by its own declaration, not by a list kept here.
  set -- tests/unit -n 2 --dist loadfile
  if ! "$PYTHON" -c 'import sys; v = tuple(map(int, sys.argv[1].split(".")[:2])); sys.exit(v < (3, 3))' "$version"; then
    set -- "$@" -m "not airflow_3_3"
  fi
fi

work="$(mktemp -d "${TMPDIR:-/tmp}/adk-airflow-${version}-XXXXXX")"
trap 'rm -rf "$work"' EXIT
started=$SECONDS
echo "== apache-airflow ${version} (floor declared in pyproject.toml: ${floor}) in ${work}"

dist="${KIT_DIST:-$work/dist}"
if [ -z "${KIT_DIST:-}" ]; then
  "$UV" build --quiet --out-dir "$dist" .
fi
wheels=("$dist"/airflow_deferrable_kit-*.whl)
"$UV" venv --quiet --no-python-downloads --python "${FLOOR_PYTHON:-$PYTHON}" "$work/venv"
"$UV" pip install --quiet --python "$work/venv/bin/python" "apache-airflow==${version}" "${wheels[0]}[test]"
echo "== installed in $((SECONDS - started)) s"

# Import from outside the repository, so the modules come from the installed wheel.
(cd "$work" && AIRFLOW_HOME="$work/airflow-home" "$work/venv/bin/python" - "$version" <<'PY'
import importlib
import pkgutil
import sys

import airflow

import airflow_deferrable_kit.sensors as sensors
import airflow_deferrable_kit.triggers as triggers

assert airflow.__version__ == sys.argv[1], f"installed apache-airflow {airflow.__version__}, wanted {sys.argv[1]}"
assert "site-packages" in sensors.__file__, f"not the installed wheel: {sensors.__file__}"
failed = []
for package in (sensors, triggers):
    for module in pkgutil.iter_modules(package.__path__):
        name = f"{package.__name__}.{module.name}"
        try:
            importlib.import_module(name)
        except Exception as exc:
            failed.append(f"{name}: {type(exc).__name__}: {exc}")
print("\n".join(failed) if failed else f"every sensor and trigger module imports on apache-airflow {airflow.__version__}")
sys.exit(1 if failed else 0)
PY
)

"$work/venv/bin/python" -m pytest -q -p no:cacheprovider "$@"
echo "== apache-airflow ${version}: passed in $((SECONDS - started)) s"
