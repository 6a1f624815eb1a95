#!/usr/bin/env bash
# The Debian packages some tests run as real processes, installed when missing:
#   pgbouncer   tests/pooling (the product through a transaction-mode PgBouncer)
# Idempotent and quick when everything is there (no apt call at all). Needs root or sudo to
# install; without either it prints the apt command and exits 0, and those tests skip with one
# line naming this script. `make test` runs it first.
set -euo pipefail

missing=()
command -v pgbouncer >/dev/null 2>&1 || [ -x /usr/sbin/pgbouncer ] || missing+=(pgbouncer)
[ ${#missing[@]} -eq 0 ] && exit 0

if [ "$(id -u)" -eq 0 ]; then
    sudo=()
elif command -v sudo >/dev/null 2>&1 && sudo -n true 2>/dev/null; then
    sudo=(sudo -n)
else
    echo "install-test-packages: missing ${missing[*]}; install with:" >&2
    echo "  sudo apt-get update && sudo apt-get install -y --no-install-recommends ${missing[*]}" >&2
    exit 0
fi
if ! command -v apt-get >/dev/null 2>&1; then
    echo "install-test-packages: no apt-get here; install ${missing[*]} yourself" >&2
    exit 0
fi
echo "install-test-packages: apt-get install ${missing[*]}" >&2
export DEBIAN_FRONTEND=noninteractive
"${sudo[@]}" apt-get update -qq
# The package's own service is not wanted: the tests start pgbouncer with their own ini.
"${sudo[@]}" apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
if command -v systemctl >/dev/null 2>&1 && [ -d /run/systemd/system ]; then
    "${sudo[@]}" systemctl disable --now pgbouncer >/dev/null 2>&1 || true
fi
