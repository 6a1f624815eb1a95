#!/usr/bin/env bash
# Build pinned Kubernetes control-plane binaries (etcd, kube-apiserver,
# kubectl, helm) from source with the local Go toolchain, fetching sources
# only from the Go module proxy (no Docker, no release downloads needed).
#
# Output layout (outside the checkout, keyed by version):
#   ${NOTIFY_QUEUE_K8S_CACHE:-$HOME/.cache/notify-queue/k8s}/
#     etcd-<ver>/etcd
#     kubernetes-<ver>/kube-apiserver
#     kubernetes-<ver>/kubectl
#     helm-<ver>/helm
#     bin/{etcd,kube-apiserver,kubectl,helm}   -> relative symlinks to the above
#
# Usage:
#   scripts/build-k8s-binaries.sh                  build whatever is missing (idempotent)
#   scripts/build-k8s-binaries.sh etcd helm        build only these (etcd|kube-apiserver|kubectl|helm)
#   scripts/build-k8s-binaries.sh --print-bin-dir  print the bin dir; exit 0 iff all four
#                                                  pinned binaries are present (never builds)
#   scripts/build-k8s-binaries.sh --force [names]  rebuild even if cached
#
# Time on a 2-core machine with cold Go build/module caches (measured, see
# docs/test-cluster.md): etcd 50 s, kube-apiserver 211 s, kubectl 30 s
# (reuses kube-apiserver's compiled packages), helm 90 s: ~6.5 min in all.
# With a warm GOCACHE (e.g. a wiped k8s cache dir) all four rebuild in ~12 s,
# and the output is byte-for-byte reproducible.
#
# Go caches: we deliberately use Go's *default* GOMODCACHE and GOCACHE rather
# than a GOPATH inside the k8s cache dir:
#   * the module cache is written read-only by Go, so nesting it under the k8s
#     cache would make a plain `rm -rf ~/.cache/notify-queue/k8s` fail for
#     non-root users (it needs `go clean -modcache`);
#   * the default caches are shared with every other Go build on the machine
#     (the project's own Go work, a re-run after bumping a pinned version), so
#     a second run reuses both the downloads and the compiled packages;
#   * callers can still isolate everything by exporting GOMODCACHE/GOCACHE.
set -euo pipefail

# ---------------------------------------------------------------------------
# Pinned versions. Bump here; the cache is keyed by these, so a bump simply
# builds into a new directory and re-points bin/.
#   - etcd: latest v3.6 patch available on the module proxy.
#   - kubernetes: latest v1.34 patch whose k8s.io/kubernetes *and* all staging
#     modules (k8s.io/api, ... at v0.34.N) are available on the module proxy.
#   - helm: latest v3 patch (v4 exists, but v3 is the stable CLI we target).
# ---------------------------------------------------------------------------
ETCD_VERSION="v3.6.16"
KUBERNETES_VERSION="v1.34.12"
HELM_VERSION="v3.22.0"

CACHE_DIR="${NOTIFY_QUEUE_K8S_CACHE:-$HOME/.cache/notify-queue/k8s}"
BIN_DIR="${CACHE_DIR}/bin"
ALL_NAMES=(etcd kube-apiserver kubectl helm)

# Staging modules versions follow kubernetes vX.Y.Z -> v0.Y.Z.
STAGING_VERSION="v0.${KUBERNETES_VERSION#v1.}"

# Directory (relative to CACHE_DIR) holding each binary.
versioned_rel() {
  case "$1" in
    etcd) echo "etcd-${ETCD_VERSION}/etcd" ;;
    kube-apiserver) echo "kubernetes-${KUBERNETES_VERSION}/kube-apiserver" ;;
    kubectl) echo "kubernetes-${KUBERNETES_VERSION}/kubectl" ;;
    helm) echo "helm-${HELM_VERSION}/helm" ;;
    *) echo "unknown binary: $1" >&2; return 2 ;;
  esac
}

# True when the pinned binary is built and bin/<name> points at it.
is_ready() {
  local name="$1" target
  target="${CACHE_DIR}/$(versioned_rel "$name")"
  [[ -x "$target" && -x "${BIN_DIR}/${name}" && "${BIN_DIR}/${name}" -ef "$target" ]]
}

usage() { sed -n '2,19p' "$0" | sed 's/^# \{0,1\}//'; }

FORCE=0
NAMES=()
while (($#)); do
  case "$1" in
    --print-bin-dir)
      echo "$BIN_DIR"
      for n in "${ALL_NAMES[@]}"; do is_ready "$n" || exit 1; done
      exit 0
      ;;
    --force) FORCE=1 ;;
    -h | --help) usage; exit 0 ;;
    etcd | kube-apiserver | kubectl | helm) NAMES+=("$1") ;;
    *) echo "unknown argument: $1" >&2; usage >&2; exit 2 ;;
  esac
  shift
done
((${#NAMES[@]})) || NAMES=("${ALL_NAMES[@]}")

command -v go >/dev/null || { echo "go not found in PATH" >&2; exit 1; }

mkdir -p "$CACHE_DIR" "$BIN_DIR"

# Serialise concurrent runs (e.g. parallel test sessions) on the same cache.
if command -v flock >/dev/null; then
  exec 9>"${CACHE_DIR}/.lock"
  flock 9
fi

WORK_DIR="$(mktemp -d "${TMPDIR:-/tmp}/notify-queue-k8s-build.XXXXXX")"
trap 'rm -rf "$WORK_DIR"' EXIT

# Go environment for every build:
#   CGO_ENABLED=0   static binaries, no C toolchain needed, faster builds
#   GOTOOLCHAIN=local  never try to download another Go toolchain
#   GOWORK=off      ignore any go.work of the surrounding checkout
#   GOFLAGS=-mod=mod  let `go build` fill the wrapper module's go.mod/go.sum
#                   (overrides e.g. a global -mod=vendor); keep -buildvcs=false
#                   since the wrapper dirs are not repositories anyway.
export CGO_ENABLED=0 GOTOOLCHAIN=local GOWORK=off GOFLAGS="-mod=mod -buildvcs=false"

log() { printf '[build-k8s-binaries] %s\n' "$*" >&2; }

# mod_field MODULE@VERSION TEMPLATE -> prints `go list -m -f TEMPLATE` (downloads the .mod/.info)
mod_field() { (cd "$WORK_DIR" && go list -m -f "$2" "$1"); }

# new_wrapper DIR MODULE VERSION: create a throwaway main module requiring
# MODULE@VERSION, with the same `go` line (and godebug lines) as MODULE's own
# go.mod so the binary behaves like the upstream build. Replace directives of
# a dependency's go.mod are ignored by Go, hence this wrapper (and why
# `go install MODULE/cmd@VERSION` does not work for etcd or kubernetes).
new_wrapper() {
  local dir="$1" mod="$2" ver="$3" gomod gover
  mkdir -p "$dir"
  gomod="$(mod_field "${mod}@${ver}" '{{.GoMod}}')"
  gover="$(mod_field "${mod}@${ver}" '{{.GoVersion}}')"
  {
    echo "module notify-queue.local/k8s-build/$(basename "$dir")"
    echo
    echo "go ${gover}"
    echo
    grep -E '^godebug ' "$gomod" || true
    echo
    echo "require ${mod} ${ver}"
  } >"${dir}/go.mod"
  echo "$gomod"
}

# go_build DIR PKG OUT LDFLAGS [TAGS]: build PKG inside wrapper DIR to OUT
# atomically (a killed build never leaves a half-written cached binary).
go_build() {
  local dir="$1" pkg="$2" out="$3" ldflags="$4" tags="${5:-}"
  local tmp="${out}.tmp.$$"
  mkdir -p "$(dirname "$out")"
  (cd "$dir" && go build -trimpath ${tags:+-tags "$tags"} -ldflags "-s -w ${ldflags}" -o "$tmp" "$pkg")
  mv -f "$tmp" "$out"
}

link_bin() {
  local name="$1"
  ln -sfn "../$(versioned_rel "$name")" "${BIN_DIR}/${name}"
}

build_etcd() {
  local dir="${WORK_DIR}/etcd"
  new_wrapper "$dir" go.etcd.io/etcd/server/v3 "$ETCD_VERSION" >/dev/null
  # In etcd 3.6 the server binary's main package is the root of the
  # go.etcd.io/etcd/server/v3 module (server/main.go -> etcdmain.Main).
  # Its sibling modules (api, client/pkg, client/v3, pkg) are required at the
  # same version by server/go.mod, so no replace directives are needed.
  go_build "$dir" go.etcd.io/etcd/server/v3 "${CACHE_DIR}/$(versioned_rel etcd)" \
    "-X go.etcd.io/etcd/api/v3/version.GitSHA=module-proxy-${ETCD_VERSION}"
}

K8S_WRAPPER=""
prepare_k8s_wrapper() {
  [[ -n "$K8S_WRAPPER" ]] && return 0
  local dir="${WORK_DIR}/kubernetes" gomod staging m
  gomod="$(new_wrapper "$dir" k8s.io/kubernetes "$KUBERNETES_VERSION")"
  # k8s.io/kubernetes requires every staging module it uses at v0.0.0 and
  # replaces it with ./staging/src/k8s.io/<name>; those directories are not
  # part of the published module zip. Map each such requirement to its
  # published release (kubernetes v1.Y.Z <-> staging v0.Y.Z). Only required
  # modules are mapped (k8s.io/sample-cli-plugin/-controller are replaced
  # upstream but never required, and are not always published).
  staging="$(awk '
    /^require[ \t]*\(/ {inreq=1; next}
    inreq && /^\)/ {inreq=0; next}
    inreq && $1 ~ /^k8s\.io\// && $2 == "v0.0.0" {print $1}
  ' "$gomod")"
  [[ -n "$staging" ]] || { log "found no staging modules in $gomod"; return 1; }
  {
    echo
    echo "replace ("
    for m in $staging; do echo "	${m} => ${m} ${STAGING_VERSION}"; done
    echo ")"
  } >>"${dir}/go.mod"
  K8S_WRAPPER="$dir"
}

k8s_ldflags() {
  # Same -X flags as hack/lib/version.sh (kube::version::ldflags) so that
  # `--version`, kubectl's client version and the apiserver's /version report
  # the real release (tools such as helm compare against it) instead of
  # v0.0.0-master. The build date is the release's module-proxy timestamp,
  # which keeps rebuilds reproducible.
  local ver="$KUBERNETES_VERSION" date major minor pkg out=""
  date="$(mod_field "k8s.io/kubernetes@${ver}" '{{.Time.UTC.Format "2006-01-02T15:04:05Z"}}')"
  major="${ver#v}"; major="${major%%.*}"
  minor="${ver#v*.}"; minor="${minor%%.*}"
  for pkg in k8s.io/client-go/pkg/version k8s.io/component-base/version; do
    out+=" -X ${pkg}.gitVersion=${ver} -X ${pkg}.gitMajor=${major} -X ${pkg}.gitMinor=${minor}"
    out+=" -X ${pkg}.gitTreeState=clean -X ${pkg}.buildDate=${date}"
  done
  echo "$out"
}

# Build tags used by upstream release builds (hack/lib/golang.sh).
K8S_TAGS="selinux,notest,grpcnotrace"

build_kube_apiserver() {
  prepare_k8s_wrapper
  go_build "$K8S_WRAPPER" k8s.io/kubernetes/cmd/kube-apiserver \
    "${CACHE_DIR}/$(versioned_rel kube-apiserver)" "$(k8s_ldflags)" "$K8S_TAGS"
}

build_kubectl() {
  prepare_k8s_wrapper
  go_build "$K8S_WRAPPER" k8s.io/kubernetes/cmd/kubectl \
    "${CACHE_DIR}/$(versioned_rel kubectl)" "$(k8s_ldflags)" "$K8S_TAGS"
}

build_helm() {
  local dir="${WORK_DIR}/helm" gomod cg major minor
  gomod="$(new_wrapper "$dir" helm.sh/helm/v3 "$HELM_VERSION")"
  # Mirror helm's Makefile: default Capabilities.KubeVersion derives from the
  # k8s.io/client-go version helm is built against (v0.Y.Z -> 1.Y).
  cg="$(awk '$1 == "k8s.io/client-go" {print $2; exit}' "$gomod")"
  major=1; minor="${cg#v0.}"; minor="${minor%%.*}"
  go_build "$dir" helm.sh/helm/v3/cmd/helm "${CACHE_DIR}/$(versioned_rel helm)" \
    "-X helm.sh/helm/v3/internal/version.version=${HELM_VERSION} -X helm.sh/helm/v3/internal/version.gitTreeState=clean \
 -X helm.sh/helm/v3/pkg/lint/rules.k8sVersionMajor=${major} -X helm.sh/helm/v3/pkg/lint/rules.k8sVersionMinor=${minor} \
 -X helm.sh/helm/v3/pkg/chartutil.k8sVersionMajor=${major} -X helm.sh/helm/v3/pkg/chartutil.k8sVersionMinor=${minor}"
}

log "cache: ${CACHE_DIR}  ($(go version))"
log "pinned: etcd ${ETCD_VERSION}, kubernetes ${KUBERNETES_VERSION} (staging ${STAGING_VERSION}), helm ${HELM_VERSION}"
TOTAL_START=$SECONDS
for name in "${NAMES[@]}"; do
  target="${CACHE_DIR}/$(versioned_rel "$name")"
  if ((FORCE == 0)) && [[ -x "$target" ]]; then
    link_bin "$name"
    log "${name}: cached at ${target}"
    continue
  fi
  log "${name}: building -> ${target}"
  start=$SECONDS
  case "$name" in
    etcd) build_etcd ;;
    kube-apiserver) build_kube_apiserver ;;
    kubectl) build_kubectl ;;
    helm) build_helm ;;
  esac
  link_bin "$name"
  log "${name}: built in $((SECONDS - start))s"
done
log "done in $((SECONDS - TOTAL_START))s; binaries in ${BIN_DIR}"
