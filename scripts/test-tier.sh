#!/usr/bin/env bash
# Run one test tier as `make test` does: its wall time and slowest tests printed, a junit report
# written to .test-reports/<tier>.xml, and the tier's own parallelism and timeout.
#
#   scripts/test-tier.sh unit                       # tests/unit, spread over the CPUs
#   scripts/test-tier.sh integration tests/integration/s3    # one room of a tier
#   scripts/test-tier.sh e2e -k failover            # any further pytest arguments
#
# unit and integration run under pytest-xdist, a test file per worker at a time (`--dist
# loadfile`: a file's module fixtures are built once) and every service started once per worker;
# e2e runs its Airflow deployments one after another in one process; release is small and runs in
# one process. Every test has a timeout (pyproject.toml: 120 s; tests/e2e/conftest.py: 900 s), so a hung test fails
# by name instead of holding the run.
set -euo pipefail
cd "$(dirname "$0")/.."

tier="${1:?usage: scripts/test-tier.sh unit|integration|e2e|release [paths] [pytest args]}"
shift
case "$tier" in
  unit) parallel=(-n "${TEST_WORKERS:-auto}" --dist loadfile) ;;
  integration) parallel=(-n "${TEST_WORKERS:-3}" --dist loadfile) ;;
  e2e) parallel=(-n "${TEST_WORKERS:-2}" --dist loadgroup) ;;
  release) parallel=() ;;
  *) echo "unknown tier '$tier': expected unit, integration, e2e or release" >&2; exit 2 ;;
esac
paths=()
while [ "$#" -gt 0 ] && [[ "$1" == tests/* ]]; do paths+=("$1"); shift; done
[ "${#paths[@]}" -gt 0 ] || paths=("tests/$tier")

PYTEST="${PYTEST:-.venv/bin/pytest}"
mkdir -p .test-reports
echo "== tier $tier: ${paths[*]}"
started=$SECONDS
status=0
"$PYTEST" -q -p no:cacheprovider --durations=15 --junitxml=".test-reports/$tier.xml" \
  "${parallel[@]}" "${paths[@]}" "$@" || status=$?
echo "== tier $tier: exit $status in $((SECONDS - started)) s"
exit "$status"
