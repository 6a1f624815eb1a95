#!/usr/bin/env bash
# Make a Prometheus server available for the dashboard test (tests/shipping/test_dashboard_prometheus.py):
# Debian's `prometheus` package, installed with apt-get when missing. Like
# scripts/build-k8s-binaries.sh, `make test` calls it so that a fresh CI machine has what the
# suite needs; it is idempotent and takes a lock, so parallel suites install once.
#
# Usage:
#   scripts/install-prometheus.sh          install when missing (needs root or sudo); exit 0 when
#                                          a prometheus binary is on PATH afterwards
#   scripts/install-prometheus.sh --path   print the binary's path; exit 1 when there is none
#
# Only the binary is used: the package's service is never started (the test runs its own server
# on a free port with its own configuration and data directory). Where apt-get is missing or not
# permitted the script says so on one line and exits 0, and the test skips with that reason.
set -euo pipefail

find_prometheus() { command -v prometheus || { [[ -x /usr/bin/prometheus ]] && echo /usr/bin/prometheus; }; }

if [[ "${1:-}" == "--path" ]]; then
  find_prometheus || exit 1
  exit 0
fi

find_prometheus >/dev/null && exit 0

if ! command -v apt-get >/dev/null; then
  echo "install-prometheus: no apt-get here; the Prometheus dashboard test will skip" >&2
  exit 0
fi
SUDO=""
if [[ $(id -u) -ne 0 ]]; then
  if command -v sudo >/dev/null && sudo -n true 2>/dev/null; then SUDO="sudo -n"; else
    echo "install-prometheus: not root and no sudo; the Prometheus dashboard test will skip" >&2
    exit 0
  fi
fi

LOCK="${TMPDIR:-/tmp}/notify-queue-install-prometheus.lock"
exec 9>"$LOCK"
command -v flock >/dev/null && flock 9
find_prometheus >/dev/null && exit 0

# policy-rc.d exit 101: the package must not start its service (there may be no init system,
# and the test wants none running on port 9090). Removed again on exit.
POLICY=/usr/sbin/policy-rc.d
OWN_POLICY=0
if [[ ! -e "$POLICY" ]]; then
  printf '#!/bin/sh\nexit 101\n' | $SUDO tee "$POLICY" >/dev/null
  $SUDO chmod +x "$POLICY"
  OWN_POLICY=1
fi
trap '[[ $OWN_POLICY -eq 1 ]] && $SUDO rm -f "$POLICY"' EXIT

export DEBIAN_FRONTEND=noninteractive
if ! $SUDO apt-get install -y -q --no-install-recommends prometheus >/dev/null; then
  $SUDO apt-get update -q >/dev/null || true
  $SUDO apt-get install -y -q --no-install-recommends prometheus >/dev/null ||
    { echo "install-prometheus: apt-get install prometheus failed; the dashboard test will skip" >&2; exit 0; }
fi
find_prometheus >/dev/null
