#!/usr/bin/env bash
# Run one test tier as `make test` does: its wall time and slowest tests printed, a junit report
# written to .test-reports/<tier>.xml, and the tier's own parallelism and timeout.
#
#   scripts/test-tier.sh unit                                # tests/unit, spread over the CPUs
#   scripts/test-tier.sh integration tests/integration/s3    # one room of a tier
#   scripts/test-tier.sh e2e -k failover                     # any further pytest arguments
#
# unit and integration run under pytest-xdist, a test file per worker at a time (`--dist
# loadfile`: a file's module fixtures are built once), every service started once per worker.
# e2e runs two pytest processes side by side, each running its tests one after another in file
# order: the tests of the event deployment (marker `event_deployment`) and the others (the
# showcase deployment, the uneven-host one); each deployment starts once. release is small and
# runs in one process. Every test has a timeout (pyproject.toml: 120 s; tests/e2e/conftest.py:
# 900 s), so a hung test fails by name instead of holding the run.
set -euo pipefail
cd "$(dirname "$0")/.."

tier="${1:?usage: scripts/test-tier.sh unit|integration|e2e|release [paths] [pytest args]}"
shift
case "$tier" in
  unit) parallel=(-n "${TEST_WORKERS:-auto}" --dist loadfile) ;;
  integration) parallel=(-n "${TEST_WORKERS:-3}" --dist loadfile) ;;
  e2e | release) parallel=() ;;
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
run() {  # run <report name> [pytest args...]
  local report="$1"
  shift
  "$PYTEST" -q -p no:cacheprovider --durations=15 --junitxml=".test-reports/$report.xml" "$@"
}
if [ "$tier" = e2e ]; then
  # Two processes, their output kept apart and printed whole when each ends.
  run e2e-events "${paths[@]}" -m event_deployment "$@" >.test-reports/e2e-events.log 2>&1 &
  events=$!
  run e2e "${paths[@]}" -m "not event_deployment" "$@" >.test-reports/e2e.log 2>&1 &
  others=$!
  wait "$others" || status=$?
  echo "== e2e: the showcase and uneven-host deployments (exit $status, $((SECONDS - started)) s)"
  cat .test-reports/e2e.log
  events_status=0
  wait "$events" || events_status=$?
  echo "== e2e: the event deployment (exit $events_status, $((SECONDS - started)) s)"
  cat .test-reports/e2e-events.log
  # pytest exits 5 when -m selects nothing (a path holding only one deployment's tests).
  [ "$status" = 5 ] && status=0
  [ "$events_status" = 5 ] && events_status=0
  [ "$status" != 0 ] || status=$events_status
else
  run "$tier" "${parallel[@]}" "${paths[@]}" "$@" || status=$?
fi
echo "== tier $tier: exit $status in $((SECONDS - started)) s"
exit "$status"
