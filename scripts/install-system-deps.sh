#!/usr/bin/env bash
# Make sure the system programs the tests run exist, installing Debian's packages when they are
# missing and we may use apt; otherwise say exactly what is missing and fail.
#
#   scripts/install-system-deps.sh            # PostgreSQL server binaries (initdb, pg_ctl) for the
#                                             # throw-away test cluster
#   scripts/install-system-deps.sh chromium   # and Chromium, for the e2e tier's browser test of the
#                                             # Waits page (Playwright never downloads a browser here)
set -euo pipefail

have_server_binaries() {
  local bindir
  if command -v pg_config >/dev/null 2>&1; then
    bindir=$(pg_config --bindir)
    [ -x "$bindir/initdb" ] && [ -x "$bindir/pg_ctl" ] && return 0
  fi
  compgen -G "/usr/lib/postgresql/*/bin/initdb" >/dev/null
}

# The path tests/e2e/test_waits_page_e2e.py launches.
have_chromium() {
  [ -x /usr/bin/chromium ]
}

want_chromium=false
for wanted in "$@"; do
  case "$wanted" in
    chromium) want_chromium=true ;;
    *) echo "unknown system dependency '$wanted': expected chromium" >&2; exit 2 ;;
  esac
done

all_present() {
  have_server_binaries && { [ "$want_chromium" = false ] || have_chromium; }
}

if all_present; then
  exit 0
fi
missing=()
have_server_binaries || missing+=(postgresql)
[ "$want_chromium" = false ] || have_chromium || missing+=(chromium)
if [ "$(id -u)" = "0" ] && command -v apt-get >/dev/null 2>&1; then
  echo "Not found: installing Debian's ${missing[*]}" >&2
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}" >/dev/null
  all_present && exit 0
fi
if ! have_server_binaries; then
  echo "ERROR: PostgreSQL server binaries (initdb, pg_ctl) are missing." >&2
  echo "Install them (Debian/Ubuntu: sudo apt-get install postgresql) or run the services with docker-compose." >&2
fi
if [ "$want_chromium" = true ] && ! have_chromium; then
  echo "ERROR: /usr/bin/chromium is missing (Debian/Ubuntu: sudo apt-get install chromium)." >&2
fi
exit 1
