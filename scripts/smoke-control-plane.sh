#!/usr/bin/env bash
# Smoke test for the locally built control plane (see build-k8s-binaries.sh):
# start etcd + kube-apiserver on free loopback ports the way
# controller-runtime's envtest does, write an admin kubeconfig (static token,
# user in group system:masters), talk to it with kubectl (and helm), then tear
# everything down. No kubelet/scheduler/controller-manager: objects are stored
# and validated, but no pod ever runs (same as envtest).
#
# Usage:
#   scripts/smoke-control-plane.sh          run the checks, tear down, exit 0 on success
#   scripts/smoke-control-plane.sh --keep   same, then keep the cluster up and print
#                                           KUBECONFIG until Ctrl-C
#
# Needs: the binaries in "$(scripts/build-k8s-binaries.sh --print-bin-dir)",
# openssl, curl, python3 (only to pick free ports).
set -euo pipefail

KEEP=0
case "${1:-}" in
  --keep) KEEP=1 ;;
  "") ;;
  -h | --help) sed -n '2,15p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
  *) echo "unknown argument: $1" >&2; exit 2 ;;
esac

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
if ! BIN_DIR="$("${HERE}/build-k8s-binaries.sh" --print-bin-dir)"; then
  echo "control-plane binaries missing in ${BIN_DIR}; run scripts/build-k8s-binaries.sh first" >&2
  exit 1
fi
ETCD="${BIN_DIR}/etcd"
APISERVER="${BIN_DIR}/kube-apiserver"
KUBECTL="${BIN_DIR}/kubectl"
HELM="${BIN_DIR}/helm"

log() { printf '[smoke] %s\n' "$*" >&2; }

WORK="$(mktemp -d "${TMPDIR:-/tmp}/notify-queue-cp.XXXXXX")"
CERT_DIR="${WORK}/certs"
ETCD_DATA="${WORK}/etcd"
mkdir -p "$CERT_DIR" "$ETCD_DATA"
chmod 700 "$ETCD_DATA"   # etcd warns about anything more open
ETCD_PID="" APISERVER_PID="" READY=0

# Stop what we started (by PID only): apiserver first so it does not spin on a
# vanished etcd, then etcd. SIGTERM, then SIGKILL after 10 s.
stop_pid() {
  local pid="$1" i
  [[ -n "$pid" ]] && kill -0 "$pid" 2>/dev/null || return 0
  kill -TERM "$pid" 2>/dev/null || true
  for ((i = 0; i < 100; i++)); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
  kill -KILL "$pid" 2>/dev/null || true
  wait "$pid" 2>/dev/null || true
}
cleanup() {
  local rc=$?
  stop_pid "$APISERVER_PID"
  stop_pid "$ETCD_PID"
  if ((rc != 0)); then
    log "FAILED (rc=$rc); last lines of the logs:"
    tail -n 25 "${WORK}/etcd.log" "${WORK}/kube-apiserver.log" >&2 2>/dev/null || true
  fi
  rm -rf "$WORK"
  exit "$rc"
}
trap cleanup EXIT
# Ctrl-C/TERM while kept up (--keep) is the normal way out: exit 0 then.
trap 'exit $((READY ? 0 : 130))' INT TERM

# --- free loopback ports ----------------------------------------------------
# envtest's addr.Suggest: bind 127.0.0.1:0, read the port the kernel picked,
# close. All three sockets are held open together so the ports are distinct.
# (Inherently racy, as in envtest: another process could grab a port before
# etcd/apiserver bind it; a caller may retry on "address already in use".)
read -r ETCD_CLIENT_PORT ETCD_PEER_PORT APISERVER_PORT < <(python3 - <<'EOF'
import socket
socks = [socket.socket() for _ in range(3)]
for s in socks:
    s.bind(("127.0.0.1", 0))
print(*(s.getsockname()[1] for s in socks))
for s in socks:
    s.close()
EOF
)
ETCD_URL="http://127.0.0.1:${ETCD_CLIENT_PORT}"
ETCD_PEER_URL="http://127.0.0.1:${ETCD_PEER_PORT}"
APISERVER_URL="https://127.0.0.1:${APISERVER_PORT}"

# --- certificates and keys ----------------------------------------------------
# Like envtest's populateAPIServerCerts: a throwaway CA, and a serving cert for
# 127.0.0.1/localhost signed by it, stored as <cert-dir>/apiserver.{crt,key}
# (kube-apiserver uses exactly these names in --cert-dir when
# --tls-cert-file is not given; otherwise it would self-sign its own).
openssl_q() { openssl "$@" 2>/dev/null; }
openssl_q req -x509 -newkey rsa:2048 -nodes -days 1 -subj "/CN=notify-queue-test-ca" \
  -keyout "${CERT_DIR}/ca.key" -out "${CERT_DIR}/ca.crt"
openssl_q req -newkey rsa:2048 -nodes -subj "/CN=kube-apiserver" \
  -keyout "${CERT_DIR}/apiserver.key" -out "${CERT_DIR}/apiserver.csr"
printf 'subjectAltName=IP:127.0.0.1,DNS:localhost\nextendedKeyUsage=serverAuth\n' >"${CERT_DIR}/san.ext"
openssl_q x509 -req -in "${CERT_DIR}/apiserver.csr" -CA "${CERT_DIR}/ca.crt" -CAkey "${CERT_DIR}/ca.key" \
  -CAcreateserial -days 1 -extfile "${CERT_DIR}/san.ext" -out "${CERT_DIR}/apiserver.crt"
# Service-account token signing key pair (envtest: sa-signer.{key,crt}); the
# apiserver signs SA tokens with the private key and verifies with the public.
openssl_q genrsa -out "${CERT_DIR}/sa-signer.key" 2048
openssl_q rsa -in "${CERT_DIR}/sa-signer.key" -pubout -out "${CERT_DIR}/sa-signer.pub"

# Static admin token (envtest uses client certs instead; a token is simpler to
# hand to Python clients). Format: token,user,uid,"group1,group2".
# system:masters is the RBAC superuser group (bypasses authorization).
ADMIN_TOKEN="$(openssl rand -hex 24)"
printf '%s,admin,admin,"system:masters"\n' "$ADMIN_TOKEN" >"${CERT_DIR}/tokens.csv"

# --- etcd ---------------------------------------------------------------------
ETCD_ARGS=(
  --name=notify-queue-test                         # member name; must match --initial-cluster
  --data-dir="$ETCD_DATA"                          # throwaway, removed on teardown
  --listen-client-urls="$ETCD_URL"                 # loopback only, free port (envtest)
  --advertise-client-urls="$ETCD_URL"              # required alongside listen-client-urls
  --listen-peer-urls="$ETCD_PEER_URL"              # free port instead of :2380 (envtest), so runs don't collide
  --initial-advertise-peer-urls="$ETCD_PEER_URL"   # keep single-member cluster config consistent
  --initial-cluster="notify-queue-test=${ETCD_PEER_URL}"     #   with the free peer port
  --unsafe-no-fsync=true                           # envtest (etcd>=3.5): no fsync, much faster, data is throwaway
  --log-level=warn                                 # keep logs small
)
log "starting etcd on ${ETCD_URL}"
start=$SECONDS
"$ETCD" "${ETCD_ARGS[@]}" >"${WORK}/etcd.log" 2>&1 &
ETCD_PID=$!
for ((i = 0; ; i++)); do
  curl -fsS "${ETCD_URL}/health" 2>/dev/null | grep -q '"health":"true"' && break
  kill -0 "$ETCD_PID" 2>/dev/null || { log "etcd exited"; exit 1; }
  ((i < 200)) || { log "etcd not healthy after 20s"; exit 1; }
  sleep 0.1
done
log "etcd healthy after $((SECONDS - start))s"

# --- kube-apiserver -------------------------------------------------------------
APISERVER_ARGS=(
  --etcd-servers="$ETCD_URL"                        # the etcd above
  --bind-address=127.0.0.1                          # serve on loopback only (envtest)
  --advertise-address=127.0.0.1                     # IP published for the "kubernetes" service; without
                                                    #   it the apiserver guesses from the default route
  --secure-port="$APISERVER_PORT"                   # free port (envtest); 1.24+ has no insecure port
  --cert-dir="$CERT_DIR"                            # holds apiserver.{crt,key} generated above (envtest)
  --service-cluster-ip-range=10.0.0.0/24            # required; envtest's value (no Services are ever routed)
  --allow-privileged=true                           # accept privileged pod specs, as envtest does
  --disable-admission-plugins=ServiceAccount        # envtest: no controller-manager creates the "default" SA,
                                                    #   so this plugin would reject every pod without it
  --authorization-mode=RBAC                         # real RBAC (envtest default); system:masters bypasses it
  --token-auth-file="${CERT_DIR}/tokens.csv"        # static bearer token for the admin user
  --service-account-issuer="${APISERVER_URL}/"      # required since 1.20 (envtest: its own https URL)
  --service-account-key-file="${CERT_DIR}/sa-signer.pub"          # verifies SA tokens
  --service-account-signing-key-file="${CERT_DIR}/sa-signer.key"  # signs SA tokens (TokenRequest API)
)
log "starting kube-apiserver on ${APISERVER_URL}"
start=$SECONDS
"$APISERVER" "${APISERVER_ARGS[@]}" >"${WORK}/kube-apiserver.log" 2>&1 &
APISERVER_PID=$!
# /readyz (not /healthz) so that post-start hooks such as RBAC bootstrap roles
# and the default namespaces are done before we use it.
for ((i = 0; ; i++)); do
  code="$(curl -s -o /dev/null -w '%{http_code}' --cacert "${CERT_DIR}/ca.crt" \
    -H "Authorization: Bearer ${ADMIN_TOKEN}" "${APISERVER_URL}/readyz" || true)"
  [[ "$code" == 200 ]] && break
  kill -0 "$APISERVER_PID" 2>/dev/null || { log "kube-apiserver exited"; exit 1; }
  ((i < 600)) || { log "kube-apiserver not ready after 60s (last HTTP ${code})"; exit 1; }
  sleep 0.1
done
log "kube-apiserver ready after $((SECONDS - start))s"

# --- kubeconfig -------------------------------------------------------------------
export KUBECONFIG="${WORK}/kubeconfig"
cat >"$KUBECONFIG" <<EOF
apiVersion: v1
kind: Config
clusters:
- name: notify-queue-test
  cluster:
    server: ${APISERVER_URL}
    certificate-authority-data: $(base64 -w0 <"${CERT_DIR}/ca.crt")
users:
- name: admin
  user:
    token: ${ADMIN_TOKEN}
contexts:
- name: notify-queue-test
  context:
    cluster: notify-queue-test
    user: admin
current-context: notify-queue-test
EOF
chmod 600 "$KUBECONFIG"

# --- checks -------------------------------------------------------------------------
log "kubectl version"
"$KUBECTL" version
log "kubectl get ns"
"$KUBECTL" get ns
log "kubectl auth whoami"
"$KUBECTL" auth whoami
log "kubectl api-resources | head"
# (capture first: piping straight into head could SIGPIPE kubectl under pipefail)
resources="$("$KUBECTL" api-resources)"
head -n 12 <<<"$resources"
log "round trip: create/get/delete a ConfigMap"
"$KUBECTL" create configmap smoke --from-literal=k=v -n default >/dev/null
[[ "$("$KUBECTL" get configmap smoke -n default -o jsonpath='{.data.k}')" == v ]]
"$KUBECTL" delete configmap smoke -n default >/dev/null
log "helm list -A"
"$HELM" list -A

log "OK"
# shellcheck disable=SC2034  # READY is read by the INT/TERM trap
READY=1
if ((KEEP)); then
  log "cluster kept up; KUBECONFIG=${KUBECONFIG} (Ctrl-C to tear down)"
  wait "$APISERVER_PID"
fi
