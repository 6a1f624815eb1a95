#!/usr/bin/env bash
# Copy the CRDs (crds/*.yaml, the one source of truth) into the Helm chart
# (charts/notify-queue/crds/), which Helm installs before the chart's templates.
# Run it after changing a CRD; tests/shipping/test_chart_render.py fails while the two differ.
#
# Usage: scripts/sync-chart-crds.sh           copy
#        scripts/sync-chart-crds.sh --check   exit 1 (and say which) when they differ
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
SRC="${ROOT}/crds"
DST="${ROOT}/charts/notify-queue/crds"

case "${1:-}" in
  --check)
    if ! diff -r "$SRC" "$DST" >&2; then
      echo "charts/notify-queue/crds differs from crds/; run scripts/sync-chart-crds.sh" >&2
      exit 1
    fi
    exit 0 ;;
  "") ;;
  *) echo "usage: $0 [--check]" >&2; exit 2 ;;
esac

mkdir -p "$DST"
# Remove copies of CRDs that no longer exist, then copy the current ones.
find "$DST" -maxdepth 1 -name '*.yaml' -type f -delete
cp "$SRC"/*.yaml "$DST"/
echo "copied $(ls "$SRC"/*.yaml | wc -l) CRDs into charts/notify-queue/crds/" >&2
