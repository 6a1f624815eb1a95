#!/usr/bin/env bash
# Build the tiny kstatus checker (tools/kstatus) against a pinned sigs.k8s.io/cli-utils, the
# library Flux uses to compute health, fetching modules only from the Go module proxy, the same
# way scripts/build-k8s-binaries.sh builds the control plane.
#
# Output: ${NOTIFY_QUEUE_K8S_CACHE:-$HOME/.cache/notify-queue/k8s}/kstatus-<ver>/kstatus
#
# Usage:
#   scripts/build-kstatus.sh                  build it if missing; print its path
#   scripts/build-kstatus.sh --print-path     print its path; exit 0 iff it is built (never builds)
#
# Cold build on a 2-core machine: ~1-2 min (apimachinery is the bulk); warm: seconds.
set -euo pipefail

# Latest cli-utils on the module proxy when this was written. Its go.mod pins the apimachinery
# version it was tested with, which is what we build with (no upgrade of its requirements).
CLI_UTILS_VERSION="v0.37.2"

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
CACHE_DIR="${NOTIFY_QUEUE_K8S_CACHE:-$HOME/.cache/notify-queue/k8s}"
TARGET="${CACHE_DIR}/kstatus-${CLI_UTILS_VERSION}/kstatus"

if [[ "${1:-}" == "--print-path" ]]; then
  echo "$TARGET"
  [[ -x "$TARGET" ]]
  exit
fi
if [[ -x "$TARGET" ]]; then
  echo "$TARGET"
  exit 0
fi
command -v go >/dev/null || { echo "go not found in PATH" >&2; exit 1; }
mkdir -p "$(dirname "$TARGET")"
if command -v flock >/dev/null; then
  exec 9>"${CACHE_DIR}/.kstatus.lock"
  flock 9
  if [[ -x "$TARGET" ]]; then echo "$TARGET"; exit 0; fi
fi

WORK_DIR="$(mktemp -d "${TMPDIR:-/tmp}/notify-queue-kstatus.XXXXXX")"
trap 'rm -rf "$WORK_DIR"' EXIT
export CGO_ENABLED=0 GOTOOLCHAIN=local GOWORK=off GOFLAGS="-mod=mod -buildvcs=false"

cp "${HERE}/tools/kstatus/main.go" "$WORK_DIR/"
cd "$WORK_DIR"
go mod init notify-queue.local/kstatus >/dev/null 2>&1
go get "sigs.k8s.io/cli-utils@${CLI_UTILS_VERSION}" >&2
go mod tidy >&2
go build -trimpath -ldflags="-s -w" -o "${TARGET}.tmp" .
mv "${TARGET}.tmp" "$TARGET"
echo "$TARGET"
