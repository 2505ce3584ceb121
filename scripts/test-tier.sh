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
# e2e runs three pytest processes side by side, one per deployment, each running its tests one
# after another in file order: the event deployment's tests (marker `event_deployment`), the HA
# deployment's (marker `ha_deployment`) and the others (the showcase deployment); each deployment
# starts once. release is small and
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
  # One process per deployment, their output kept apart and printed whole when each ends.
  declare -A selects=([e2e-events]="event_deployment" [e2e-ha]="ha_deployment"
    [e2e]="not event_deployment and not ha_deployment")
  declare -A titles=([e2e-events]="the event deployment" [e2e-ha]="the HA deployment"
    [e2e]="the showcase deployment")
  declare -A pids=()
  for report in e2e-events e2e-ha e2e; do
    (
      report_status=0
      run "$report" "${paths[@]}" -m "${selects[$report]}" "$@" >".test-reports/$report.log" 2>&1 || report_status=$?
      echo "$((SECONDS - started))" >".test-reports/$report.seconds"
      exit "$report_status"
    ) &
    pids[$report]=$!
  done
  for report in e2e e2e-ha e2e-events; do
    report_status=0
    wait "${pids[$report]}" || report_status=$?
    echo "== e2e: ${titles[$report]} (exit $report_status, $(cat ".test-reports/$report.seconds") s)"
    cat ".test-reports/$report.log"
    # pytest exits 5 when -m selects nothing (a path holding only other deployments' tests).
    [ "$report_status" = 5 ] && report_status=0
    [ "$status" != 0 ] || status=$report_status
  done
else
  run "$tier" "${parallel[@]}" "${paths[@]}" "$@" || status=$?
fi
echo "== tier $tier: exit $status in $((SECONDS - started)) s"
exit "$status"
