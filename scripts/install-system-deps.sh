#!/usr/bin/env bash
# Make sure PostgreSQL server binaries (initdb, pg_ctl) exist for the throw-away test cluster.
# Installs Debian's postgresql package when they are missing and we may use apt; otherwise
# says exactly what is missing and fails.
set -euo pipefail

have_server_binaries() {
  local bindir
  if command -v pg_config >/dev/null 2>&1; then
    bindir=$(pg_config --bindir)
    [ -x "$bindir/initdb" ] && [ -x "$bindir/pg_ctl" ] && return 0
  fi
  compgen -G "/usr/lib/postgresql/*/bin/initdb" >/dev/null
}

if have_server_binaries; then
  exit 0
fi
if [ "$(id -u)" = "0" ] && command -v apt-get >/dev/null 2>&1; then
  echo "PostgreSQL server binaries not found: installing Debian's postgresql package" >&2
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq postgresql >/dev/null
  have_server_binaries && exit 0
fi
echo "ERROR: PostgreSQL server binaries (initdb, pg_ctl) are missing." >&2
echo "Install them (Debian/Ubuntu: sudo apt-get install postgresql) or run the services with docker-compose." >&2
exit 1
