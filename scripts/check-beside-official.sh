#!/usr/bin/env bash
# Prove that the kit with every extra installs beside the official providers users already run
# (amazon, http, apache-kafka, standard, common-sql, postgres) with `pip check` clean, in either
# install order, on the apache-airflow floor pyproject.toml declares and on the tested version.
#
# The first half of each case is built with uv (fast); the second half is what a user types,
# `pip install`, into that environment. The trap it guards: aiobotocore pins botocore to a narrow
# range, and pip leaves an installed boto3 that needs a newer botocore broken unless boto3 is part
# of the resolution (the `s3` extra names it for that reason).
#
#   scripts/check-beside-official.sh                  # the floor and 3.3.2, both orders
#   AIRFLOW_VERSIONS="3.3.2" scripts/check-beside-official.sh
#   KIT_DIST=/tmp/dist scripts/check-beside-official.sh  # the wheel already built there (make test)
#
# The kit is installed from its wheel, as users install it (built here once, as a release
# would: the sdist, then the wheel from it, unless KIT_DIST names a directory that holds it).
# Needs .venv (make venv) for its python and uv.
set -euo pipefail
cd "$(dirname "$0")/.."

PYTHON="${PYTHON:-.venv/bin/python}"
UV="${UV:-.venv/bin/uv}"
floor="$("$PYTHON" scripts/airflow_floor.py)"
versions="${AIRFLOW_VERSIONS:-$floor 3.3.2}"
official=(
  apache-airflow-providers-amazon
  apache-airflow-providers-http
  apache-airflow-providers-apache-kafka
  apache-airflow-providers-standard
  apache-airflow-providers-common-sql
  apache-airflow-providers-postgres
)
work="$(mktemp -d "${TMPDIR:-/tmp}/adk-beside-official-XXXXXX")"
trap 'rm -rf "$work"' EXIT
dist="${KIT_DIST:-$work/dist}"
if [ -z "${KIT_DIST:-}" ]; then
  "$UV" build --quiet --out-dir "$dist" .
fi
wheels=("$dist"/airflow_deferrable_kit-*.whl)
kit="${wheels[0]}[all]"
failed=0
for version in $versions; do
  for order in official-first kit-first; do
    started=$SECONDS
    venv="$work/$version-$order"
    "$UV" venv --quiet --no-python-downloads --python "$PYTHON" "$venv"
    pin="apache-airflow==$version"
    if [ "$order" = official-first ]; then
      "$UV" pip install --quiet --python "$venv/bin/python" pip "$pin" "${official[@]}"
      "$venv/bin/python" -m pip install --quiet --disable-pip-version-check "$pin" "$kit"
    else
      "$UV" pip install --quiet --python "$venv/bin/python" pip "$pin" "$kit"
      "$venv/bin/python" -m pip install --quiet --disable-pip-version-check "$pin" "${official[@]}"
    fi
    versions_seen="$("$venv/bin/python" -m pip list --disable-pip-version-check 2>/dev/null \
      | awk 'tolower($1) ~ /^(boto3|botocore|aiobotocore|apache-airflow|apache-airflow-providers-amazon)$/ {printf "%s %s; ", $1, $2}')"
    if "$venv/bin/python" -m pip check --disable-pip-version-check >"$venv.check" 2>&1; then
      echo "== apache-airflow $version, $order: pip check clean in $((SECONDS - started)) s ($versions_seen)"
    else
      echo "== apache-airflow $version, $order: pip check FAILED ($versions_seen)"
      cat "$venv.check"
      failed=1
    fi
    rm -rf "$venv"
  done
done
exit "$failed"
