#!/usr/bin/env bash
# Copy the CRDs (crds/*.yaml, the one source of truth) into the Helm chart
# (charts/notify-queue/crds/, which Helm installs before the chart's templates) and into the
# Python package (src/notify_queue/crds/, package data, so `notify-queue up --kubernetes` finds
# them in any install, not only in a checkout).
# Run it after changing a CRD; tests/shipping/test_chart_render.py fails while they differ.
#
# Usage: scripts/sync-chart-crds.sh           copy
#        scripts/sync-chart-crds.sh --check   exit 1 (and say which) when they differ
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
SRC="${ROOT}/crds"
COPIES=("${ROOT}/charts/notify-queue/crds" "${ROOT}/src/notify_queue/crds")

case "${1:-}" in
  --check)
    status=0
    for dst in "${COPIES[@]}"; do
      if ! diff -r -x '__pycache__' -x '__init__.py' "$SRC" "$dst" >&2; then
        echo "${dst#"$ROOT"/} differs from crds/; run scripts/sync-chart-crds.sh" >&2
        status=1
      fi
    done
    exit "$status" ;;
  "") ;;
  *) echo "usage: $0 [--check]" >&2; exit 2 ;;
esac

for dst in "${COPIES[@]}"; do
  mkdir -p "$dst"
  # Remove copies of CRDs that no longer exist, then copy the current ones.
  find "$dst" -maxdepth 1 -name '*.yaml' -type f -delete
  cp "$SRC"/*.yaml "$dst"/
  echo "copied $(ls "$SRC"/*.yaml | wc -l) CRDs into ${dst#"$ROOT"/}/" >&2
done
