"""A throwaway Kubernetes control plane on this machine: etcd and kube-apiserver, nothing else.

Used by the operator tests and by `notify-queue up --kubernetes`. It works the way
controller-runtime's envtest does (and `scripts/smoke-control-plane.sh`, whose flags it follows):
plain processes on free loopback ports, a throwaway CA and serving certificate, static bearer
tokens for an admin and any extra users a test wants (RBAC is on; the admin is in
`system:masters`), a service-account signing key so TokenRequest works. No kubelet, scheduler or
controller-manager run, so objects are stored, validated and watched, but no pod ever starts and
nothing garbage-collects: a Deployment's `spec.replicas` and its scale subresource work, its
pods never appear.

Every process runs in its own process group; `stop()` signals the groups it started (TERM, then
KILL after a grace period) and removes nothing it did not create. The binaries come from
`scripts/build-k8s-binaries.sh` (`~/.cache/notify-queue/k8s/bin`, or `$NOTIFY_QUEUE_K8S_CACHE/bin`).
"""

from __future__ import annotations

import base64
import contextlib
import json
import logging
import os
import secrets
import shutil
import signal
import socket
import ssl
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType

from prometheus_client.parser import text_string_to_metric_families

from notify_queue.errors import NotifyQueueError

log = logging.getLogger(__name__)

BUILD_HINT = "run scripts/build-k8s-binaries.sh to build them"
REQUIRED_BINARIES = ("etcd", "kube-apiserver", "kubectl")
# The CRDs shipped inside the package (package data: any install has them, editable or not);
# copies of crds/, the source of truth, made by scripts/sync-chart-crds.sh.
DEFAULT_CRD_DIR = Path(__file__).resolve().parent / "crds"


class ControlPlaneUnavailable(NotifyQueueError):
    """The binaries are missing or the control plane did not come up (the message says which)."""


def find_bin_dir() -> Path:
    """The directory with etcd, kube-apiserver and kubectl, or ControlPlaneUnavailable."""
    if explicit := os.environ.get("NOTIFY_QUEUE_K8S_BIN_DIR"):
        bin_dir = Path(explicit)
    else:
        cache = os.environ.get("NOTIFY_QUEUE_K8S_CACHE") or str(
            Path.home() / ".cache" / "notify-queue" / "k8s"
        )
        bin_dir = Path(cache) / "bin"
    missing = [name for name in REQUIRED_BINARIES if not os.access(bin_dir / name, os.X_OK)]
    if missing:
        raise ControlPlaneUnavailable(
            f"Kubernetes binaries missing in {bin_dir}: {', '.join(missing)}; {BUILD_HINT}"
        )
    return bin_dir


@dataclass(frozen=True)
class TokenUser:
    """A user authenticated by a static bearer token (kube-apiserver's --token-auth-file)."""

    name: str
    token: str
    groups: tuple[str, ...] = ()


def _free_ports(count: int) -> list[int]:
    # Held open together so the kernel hands out distinct ports; racy like envtest's
    # addr.Suggest (someone may take one before we bind it), so start() retries on a clash.
    sockets = [socket.socket() for _ in range(count)]
    try:
        for s in sockets:
            s.bind(("127.0.0.1", 0))
        return [s.getsockname()[1] for s in sockets]
    finally:
        for s in sockets:
            s.close()


def _openssl(*args: str) -> None:
    subprocess.run(["openssl", *args], check=True, capture_output=True)


class LocalControlPlane:
    """etcd + kube-apiserver in `directory`, reachable through `kubeconfig`.

    Use as a context manager, or call `start()` and `stop()`. `users` maps extra user names to
    their groups; each gets a token and `kubeconfig_for(name)` writes a kubeconfig for it.
    """

    def __init__(
        self,
        directory: Path,
        *,
        bin_dir: Path | None = None,
        users: Mapping[str, Sequence[str]] | None = None,
        start_timeout_seconds: float = 60.0,
    ) -> None:
        self.directory = directory
        self.bin_dir = bin_dir or find_bin_dir()
        self.start_timeout_seconds = start_timeout_seconds
        self.users: dict[str, TokenUser] = {
            "admin": TokenUser("admin", secrets.token_hex(24), ("system:masters",))
        }
        for name, groups in (users or {}).items():
            self.users[name] = TokenUser(name, secrets.token_hex(24), tuple(groups))
        self.server = ""
        self.etcd_port = 0
        self._processes: dict[str, subprocess.Popen[bytes]] = {}
        self._cert_dir = directory / "certs"

    # --- life cycle ---------------------------------------------------------------------------

    def __enter__(self) -> LocalControlPlane:
        self.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()

    def start(self, *, attempts: int = 3) -> None:
        """Start etcd and kube-apiserver and wait until /readyz answers 200."""
        self.directory.mkdir(parents=True, exist_ok=True)
        self._write_certificates()
        self._write_tokens()
        for attempt in range(1, attempts + 1):
            etcd_port, peer_port, api_port = _free_ports(3)
            try:
                self._start_etcd(etcd_port, peer_port)
                self._start_apiserver(etcd_port, api_port)
                break
            except ControlPlaneUnavailable:
                self.stop()
                if attempt == attempts or not self._port_clash():
                    raise
                log.info("port clash starting the control plane; retrying with new ports")
        self.kubeconfig = self.kubeconfig_for("admin")
        log.info("control plane ready at %s (kubeconfig %s)", self.server, self.kubeconfig)

    def restart_apiserver(self) -> None:
        """Stop the kube-apiserver and start it again on the same port, over the same etcd:
        every client's connection and watch breaks, as in an API server's rolling update."""
        process = self._processes.pop("kube-apiserver", None)
        if process is not None:
            _stop_process_group(process)
        port = int(self.server.rsplit(":", 1)[1])
        self._start_apiserver(self.etcd_port, port)

    # --- what the control plane counted ----------------------------------------------------------

    def request_counts(self) -> dict[tuple[str, str, str], int]:
        """kube-apiserver's `apiserver_request_total` summed by (verb, resource, subresource),
        from its /metrics: the writes a component made are a difference of two readings."""
        request = urllib.request.Request(f"{self.server}/metrics")  # noqa: S310 (our server)
        request.add_header("Authorization", f"Bearer {self.token_for('admin')}")
        context = ssl.create_default_context(cafile=str(self.ca_file))
        with urllib.request.urlopen(request, timeout=10, context=context) as response:  # noqa: S310
            text = response.read().decode()
        counts: dict[tuple[str, str, str], int] = {}
        for family in text_string_to_metric_families(text):
            for sample in family.samples:
                if sample.name != "apiserver_request_total":
                    continue
                labels = sample.labels
                key = (labels["verb"], labels["resource"], labels.get("subresource", ""))
                counts[key] = counts.get(key, 0) + int(sample.value)
        return counts

    def etcd_db_size_bytes(self) -> int:
        """etcd's `etcd_mvcc_db_total_size_in_bytes`: the size of its database file."""
        with urllib.request.urlopen(
            f"http://127.0.0.1:{self.etcd_port}/metrics", timeout=10
        ) as response:
            text = response.read().decode()
        for family in text_string_to_metric_families(text):
            for sample in family.samples:
                if sample.name == "etcd_mvcc_db_total_size_in_bytes":
                    return int(sample.value)
        raise ControlPlaneUnavailable("etcd's /metrics has no etcd_mvcc_db_total_size_in_bytes")

    def stop(self) -> None:
        """Stop what start() started: kube-apiserver first (so it does not spin on a gone etcd)."""
        for name in ("kube-apiserver", "etcd"):
            process = self._processes.pop(name, None)
            if process is not None:
                _stop_process_group(process)

    # --- users and kubeconfigs ---------------------------------------------------------------

    @property
    def ca_file(self) -> Path:
        return self._cert_dir / "ca.crt"

    def token_for(self, user: str) -> str:
        return self.users[user].token

    def kubeconfig_for(self, user: str) -> Path:
        """Write (once) and return a kubeconfig that authenticates as `user`."""
        path = self.directory / f"kubeconfig-{user.replace(':', '_')}"
        ca = base64.b64encode(self.ca_file.read_bytes()).decode()
        config = {
            "apiVersion": "v1",
            "kind": "Config",
            "clusters": [
                {
                    "name": "notify-queue-dev",
                    "cluster": {"server": self.server, "certificate-authority-data": ca},
                }
            ],
            "users": [{"name": user, "user": {"token": self.token_for(user)}}],
            "contexts": [{"name": user, "context": {"cluster": "notify-queue-dev", "user": user}}],
            "current-context": user,
        }
        # JSON is YAML: kubectl and the Python client read it as a kubeconfig.
        path.write_text(json.dumps(config, indent=2))
        path.chmod(0o600)
        return path

    def kubeconfig_for_service_account(self, namespace: str, name: str) -> Path:
        """A kubeconfig with a fresh token (TokenRequest) of ServiceAccount `namespace/name`,
        created if missing: test a chart's RBAC with the very identity its pods would use."""
        if (
            self.kubectl("get", "serviceaccount", name, "-n", namespace, check=False).returncode
            != 0
        ):
            self.kubectl("create", "serviceaccount", name, "-n", namespace)
        token = self.kubectl(
            "create", "token", name, "-n", namespace, "--duration=1h"
        ).stdout.strip()
        user = f"system:serviceaccount:{namespace}:{name}"
        self.users[user] = TokenUser(user, token)
        return self.kubeconfig_for(user)

    # --- CRDs and kubectl ------------------------------------------------------------------------

    def kubectl(
        self, *args: str, input: str | None = None, user: str = "admin", check: bool = True
    ) -> subprocess.CompletedProcess[str]:
        """Run the real kubectl against this control plane and return its result (text)."""
        result = subprocess.run(
            [str(self.bin_dir / "kubectl"), "--kubeconfig", str(self.kubeconfig_for(user)), *args],
            input=input,
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )
        if check and result.returncode != 0:
            raise ControlPlaneUnavailable(
                f"kubectl {' '.join(args)} failed ({result.returncode}): {result.stderr.strip()}"
            )
        return result

    def install_crds(
        self, crd_dir: Path = DEFAULT_CRD_DIR, *, timeout_seconds: float = 60.0
    ) -> list[str]:
        """Apply every CRD in `crd_dir` and wait until each is Established and served."""
        files = sorted(crd_dir.glob("*.yaml"))
        if not files:
            raise ControlPlaneUnavailable(f"no CRDs (*.yaml) in {crd_dir}")
        for file in files:
            self.kubectl("apply", "--server-side", "--force-conflicts", "-f", str(file))
        names = self.kubectl(
            "get", "crd", "-o", 'jsonpath={range .items[*]}{.metadata.name}{"\\n"}{end}'
        ).stdout.split()
        ours = [n for n in names if n.endswith(".notifyqueue.io")]
        self.kubectl(
            "wait",
            "--for=condition=Established",
            f"--timeout={int(timeout_seconds)}s",
            *(f"crd/{n}" for n in ours),
        )
        # Established is set before discovery serves the resource; list each until it answers.
        deadline = time.monotonic() + timeout_seconds
        for name in ours:
            plural, _, group = name.partition(".")
            while self.kubectl("get", f"{plural}.{group}", "-A", check=False).returncode != 0:
                if time.monotonic() > deadline:
                    raise ControlPlaneUnavailable(
                        f"CRD {name} is not served after {timeout_seconds}s"
                    )
                time.sleep(0.1)
        return ours

    # --- internals ----------------------------------------------------------------------------

    def _write_certificates(self) -> None:
        if shutil.which("openssl") is None:
            raise ControlPlaneUnavailable(
                "openssl is needed to make the control plane's certificates"
            )
        d = self._cert_dir
        d.mkdir(parents=True, exist_ok=True)
        if (d / "apiserver.crt").exists():
            return
        # A throwaway CA, and a serving certificate for 127.0.0.1/localhost signed by it, named
        # apiserver.{crt,key} in --cert-dir (the names kube-apiserver looks for there). P-256
        # keys: as good as RSA here and made in milliseconds rather than seconds.
        ec = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes"]
        _openssl(
            "req",
            "-x509",
            *ec,
            "-days",
            "2",
            "-subj",
            "/CN=notify-queue-dev-ca",
            "-keyout",
            str(d / "ca.key"),
            "-out",
            str(d / "ca.crt"),
        )
        _openssl(
            "req",
            *ec,
            "-subj",
            "/CN=kube-apiserver",
            "-keyout",
            str(d / "apiserver.key"),
            "-out",
            str(d / "apiserver.csr"),
        )
        (d / "san.ext").write_text(
            "subjectAltName=IP:127.0.0.1,DNS:localhost\nextendedKeyUsage=serverAuth\n"
        )
        _openssl(
            "x509",
            "-req",
            "-in",
            str(d / "apiserver.csr"),
            "-CA",
            str(d / "ca.crt"),
            "-CAkey",
            str(d / "ca.key"),
            "-CAcreateserial",
            "-days",
            "2",
            "-extfile",
            str(d / "san.ext"),
            "-out",
            str(d / "apiserver.crt"),
        )
        # Service-account token signing keys (ES256): TokenRequest works, so tests can mint
        # service-account tokens.
        _openssl(
            "genpkey",
            "-algorithm",
            "EC",
            "-pkeyopt",
            "ec_paramgen_curve:prime256v1",
            "-out",
            str(d / "sa-signer.key"),
        )
        _openssl(
            "pkey", "-in", str(d / "sa-signer.key"), "-pubout", "-out", str(d / "sa-signer.pub")
        )

    def _write_tokens(self) -> None:
        # token,user,uid,"group1,group2" -- read once at start, so users are fixed by then.
        lines = [f'{u.token},{u.name},{u.name},"{",".join(u.groups)}"' for u in self.users.values()]
        path = self._cert_dir / "tokens.csv"
        path.write_text("\n".join(lines) + "\n")
        path.chmod(0o600)

    def _spawn(self, name: str, args: list[str]) -> subprocess.Popen[bytes]:
        logfile = (self.directory / f"{name}.log").open("ab")
        try:
            # A session (and so a process group) of its own: stop() signals the whole group,
            # and Ctrl-C in a terminal reaches our process, which stops it in order.
            process = subprocess.Popen(
                [str(self.bin_dir / name), *args],
                stdout=logfile,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                start_new_session=True,
            )
        finally:
            logfile.close()
        self._processes[name] = process
        return process

    def _start_etcd(self, port: int, peer_port: int) -> None:
        self.etcd_port = port
        url, peer = f"http://127.0.0.1:{port}", f"http://127.0.0.1:{peer_port}"
        data = self.directory / "etcd"
        shutil.rmtree(data, ignore_errors=True)  # a retry after a port clash starts clean
        process = self._spawn(
            "etcd",
            [
                "--name=default",
                f"--data-dir={data}",
                f"--listen-client-urls={url}",
                f"--advertise-client-urls={url}",
                f"--listen-peer-urls={peer}",
                f"--initial-advertise-peer-urls={peer}",
                f"--initial-cluster=default={peer}",
                "--unsafe-no-fsync=true",  # throwaway data: no fsync, much faster (as envtest)
                "--log-level=warn",
            ],
        )
        self._wait_until("etcd", process, lambda: _http_ok(f"{url}/health"))

    def _start_apiserver(self, etcd_port: int, port: int) -> None:
        self.server = f"https://127.0.0.1:{port}"
        d = self._cert_dir
        process = self._spawn(
            "kube-apiserver",
            [
                f"--etcd-servers=http://127.0.0.1:{etcd_port}",
                "--bind-address=127.0.0.1",
                "--advertise-address=127.0.0.1",
                f"--secure-port={port}",
                f"--cert-dir={d}",
                "--service-cluster-ip-range=10.0.0.0/24",
                "--allow-privileged=true",
                # No controller-manager creates the "default" ServiceAccount, so this plugin would
                # reject every pod.
                "--disable-admission-plugins=ServiceAccount",
                "--authorization-mode=RBAC",
                f"--token-auth-file={d / 'tokens.csv'}",
                f"--service-account-issuer={self.server}/",
                f"--service-account-key-file={d / 'sa-signer.pub'}",
                f"--service-account-signing-key-file={d / 'sa-signer.key'}",
            ],
        )
        context = ssl.create_default_context(cafile=str(self.ca_file))
        token = self.token_for("admin")
        # /readyz rather than /healthz: post-start hooks (RBAC bootstrap roles, default
        # namespaces) are done by then.
        self._wait_until(
            "kube-apiserver",
            process,
            lambda: _http_ok(f"{self.server}/readyz", context=context, token=token),
        )

    def _wait_until(
        self, name: str, process: subprocess.Popen[bytes], ready: Callable[[], bool]
    ) -> None:
        deadline = time.monotonic() + self.start_timeout_seconds
        while not ready():
            if process.poll() is not None:
                raise ControlPlaneUnavailable(
                    f"{name} exited with {process.returncode}: {self._log_tail(name)}"
                )
            if time.monotonic() > deadline:
                raise ControlPlaneUnavailable(
                    f"{name} not ready after {self.start_timeout_seconds:g}s: "
                    f"{self._log_tail(name)}"
                )
            time.sleep(0.1)

    def _log_tail(self, name: str, lines: int = 15) -> str:
        with contextlib.suppress(OSError):
            return "\n".join(
                (self.directory / f"{name}.log").read_text(errors="replace").splitlines()[-lines:]
            )
        return ""

    def _port_clash(self) -> bool:
        return any(
            "address already in use" in self._log_tail(name, 50)
            for name in ("etcd", "kube-apiserver")
        )

    def processes(self) -> Iterator[subprocess.Popen[bytes]]:
        """The processes running now (for tests that check nothing leaks)."""
        return iter(list(self._processes.values()))


def _http_ok(url: str, *, context: ssl.SSLContext | None = None, token: str | None = None) -> bool:
    request = urllib.request.Request(url)  # noqa: S310 (http(s) URLs we built ourselves)
    if token:
        request.add_header("Authorization", f"Bearer {token}")
    try:
        with urllib.request.urlopen(request, timeout=2, context=context) as response:  # noqa: S310
            return bool(response.status == 200)
    except (urllib.error.URLError, OSError, ssl.SSLError):
        return False


def _stop_process_group(process: subprocess.Popen[bytes], grace_seconds: float = 10.0) -> None:
    if process.poll() is None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGTERM)
        try:
            process.wait(timeout=grace_seconds)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(process.pid, signal.SIGKILL)
            process.wait()
