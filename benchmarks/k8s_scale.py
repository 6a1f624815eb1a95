"""The Kubernetes path at scale: Notification objects on a real kube-apiserver + etcd, mirrored by
the real operator into an embedded PostgreSQL and sent by a real worker (docs/performance.md,
"The Kubernetes path").

    python -m benchmarks.k8s_scale [--objects 10000] [--rounds 2] [--concurrency 32]
                                   [--fault none|kill-operator|restart-apiserver]

Everything runs on this machine: etcd and kube-apiserver (notify_queue.devcluster), one embedded
PostgreSQL, `notify-queue operator` and `notify-queue worker` as processes (the simulated
provider: nothing leaves the machine). Each round creates `--objects` Notifications by POST,
`--concurrency` at a time, and waits until every row is SENT and the status outbox is empty (every
object's status written), then checks one paged LIST. Per round it reports:

- time from the first create to all Sent, and the create rate;
- writes to the API server per notification, by verb, resource and subresource, from the
  kube-apiserver's `apiserver_request_total` (the creates included: the user's write);
- the operator process's CPU seconds and RSS per object (from /proc);
- etcd's database size per object (`etcd_mvcc_db_total_size_in_bytes`);
- the TTL clean-up: the namespace's default NotificationPolicy then gets
  `ttlSecondsAfterFinished: 0`, and the rate at which the sweeper deletes the finished objects;
- what the operator keeps per object (`notify_queue_operator_objects_remembered{store}` from its
  /metrics) once all are Sent and again after the clean-up.

The policy keeps the TTL for the later rounds (objects are deleted as they finish), so the
operator's RSS after each round's clean-up says whether its memory grows with the finished
objects it has seen: the result's `operator_rss_slope_bytes_per_object_seen` is the slope of that
RSS over the objects seen, from the first round's clean-up to the last's.
`--fault kill-operator` SIGKILLs the operator halfway through the first
round's creates and starts it again; `restart-apiserver` restarts the kube-apiserver there; the
round then reports how long after the fault all were Sent, and checks one row per object.

Writes `benchmarks/results/k8s-scale/latest.json` (`-fault` in the name with a fault).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import socket
import ssl
import subprocess
import sys
import tempfile
import time
import urllib.request
import uuid
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import aiohttp
import psycopg

from benchmarks.env import fresh_postgres
from notify_queue.devcluster import LocalControlPlane

RESULTS = Path(__file__).parent / "results" / "k8s-scale"
NAMESPACE = "bench"
GROUP_PATH = f"/apis/notifyqueue.io/v1alpha1/namespaces/{NAMESPACE}"
WRITE_VERBS = ("POST", "PUT", "PATCH", "DELETE", "APPLY")
BIN = Path(sys.executable).parent
# The operator's status writer is capped at this many patches a second (its default is 50, sized
# for a shared production API server); the figure is then the path's, not the cap's.
STATUS_PATCHES_PER_SECOND = 1000


class Process:
    """A `notify-queue` role as a process, with its CPU seconds and RSS from /proc."""

    def __init__(self, role: str, args: list[str], env: dict[str, str], log: Path) -> None:
        self.role, self._args, self._env, self._log = role, args, env, log
        self.popen = self._spawn()

    def _spawn(self) -> subprocess.Popen[bytes]:
        with self._log.open("ab") as out:
            return subprocess.Popen(
                [str(BIN / "notify-queue"), self.role, *self._args],
                env=self._env,
                stdout=out,
                stderr=subprocess.STDOUT,
            )

    def cpu_seconds(self) -> float:
        fields = Path(f"/proc/{self.popen.pid}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")

    def rss_bytes(self) -> int:
        for line in Path(f"/proc/{self.popen.pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
        return 0

    def kill(self) -> None:
        self.popen.send_signal(signal.SIGKILL)
        self.popen.wait(timeout=30)

    def restart(self) -> None:
        self.popen = self._spawn()

    def stop(self) -> None:
        if self.popen.poll() is None:
            self.popen.terminate()
            try:
                self.popen.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.kill()


class Api:
    """The few kube-apiserver calls the benchmark makes, as the admin user."""

    def __init__(self, cluster: LocalControlPlane, concurrency: int) -> None:
        self._cluster = cluster
        self._headers = {"Authorization": f"Bearer {cluster.token_for('admin')}"}
        self._ssl = ssl.create_default_context(cafile=str(cluster.ca_file))
        self._limit = concurrency
        self._session = self._new_session()

    def _new_session(self) -> aiohttp.ClientSession:
        return aiohttp.ClientSession(
            connector=aiohttp.TCPConnector(ssl=self._ssl, limit=self._limit),
            timeout=aiohttp.ClientTimeout(total=120),
        )

    async def reconnect(self) -> None:
        await self._session.close()
        self._session = self._new_session()

    async def close(self) -> None:
        await self._session.close()

    async def call(self, method: str, path: str, body: Any = None, **kw: Any) -> Any:
        headers = dict(self._headers)
        if body is not None:
            headers["Content-Type"] = kw.pop("content_type", "application/json")
        for attempt in range(30):  # the API server may be restarting (--fault)
            try:
                async with self._session.request(
                    method, self._cluster.server + path, json=body, headers=headers, **kw
                ) as response:
                    if response.status >= 500 or response.status == 429:
                        raise aiohttp.ClientResponseError(
                            response.request_info, (), status=response.status
                        )
                    return await response.json(content_type=None)
            except (aiohttp.ClientError, TimeoutError):
                if attempt == 29:
                    raise
                await asyncio.sleep(1.0)
        raise AssertionError("unreachable")

    async def create_many(self, names: list[str], on_half: Any = None) -> float:
        """POST one Notification per name, `concurrency` at a time; return the seconds taken."""
        queue = list(reversed(names))
        done = 0
        started = time.monotonic()
        fault_pending = on_half is not None

        async def creator() -> None:
            nonlocal done, fault_pending
            while queue:
                name = queue.pop()
                await self.call("POST", f"{GROUP_PATH}/notifications", _manifest(name))
                done += 1
                if fault_pending and done >= len(names) // 2:
                    fault_pending = False
                    await on_half()

        await asyncio.gather(*(creator() for _ in range(self._limit)))
        return time.monotonic() - started

    async def count_objects(self) -> int:
        body = await self.call("GET", f"{GROUP_PATH}/notifications", params={"limit": "1"})
        return len(body.get("items", [])) + int(body["metadata"].get("remainingItemCount") or 0)

    async def phases(self) -> dict[str, int]:
        counts: dict[str, int] = {}
        token = ""
        while True:
            params = {"limit": "500", **({"continue": token} if token else {})}
            body = await self.call("GET", f"{GROUP_PATH}/notifications", params=params)
            for obj in body["items"]:
                phase = (obj.get("status") or {}).get("phase") or "none"
                counts[phase] = counts.get(phase, 0) + 1
            token = body["metadata"].get("continue") or ""
            if not token:
                return counts


def _remembered(metrics_url: str) -> dict[str, float]:
    """The operator's entries per store (`notify_queue_operator_objects_remembered{store}`)."""
    with urllib.request.urlopen(metrics_url, timeout=10) as response:
        text = response.read().decode()
    prefix = 'notify_queue_operator_objects_remembered{store="'
    return {
        line[len(prefix) :].split('"', 1)[0]: float(line.rsplit(" ", 1)[1])
        for line in text.splitlines()
        if line.startswith(prefix)
    }


def _manifest(name: str) -> dict[str, Any]:
    return {
        "apiVersion": "notifyqueue.io/v1alpha1",
        "kind": "Notification",
        "metadata": {"name": name, "namespace": NAMESPACE},
        "spec": {"channel": "email", "recipient": f"{name}@example.com", "body": "scale"},
    }


def _policy(ttl: int | None) -> dict[str, Any]:
    return {
        "apiVersion": "notifyqueue.io/v1alpha1",
        "kind": "NotificationPolicy",
        "metadata": {"name": "default", "namespace": NAMESPACE},
        "spec": {} if ttl is None else {"ttlSecondsAfterFinished": ttl},
    }


def _queue_state(url: str) -> tuple[int, int, int]:
    """(rows SENT, rows of the kubernetes source, status outbox rows)."""
    with psycopg.connect(url, autocommit=True) as conn:
        row = conn.execute(
            "SELECT count(*) FILTER (WHERE status = 'SENT'), count(*),"
            " (SELECT count(*) FROM nq_status_outbox)"
            " FROM nq_all_notifications WHERE source = 'kubernetes'"
        ).fetchone()
    assert row is not None
    return int(row[0]), int(row[1]), int(row[2])


def _duplicates(url: str) -> int:
    with psycopg.connect(url, autocommit=True) as conn:
        row = conn.execute(
            "SELECT count(*) - count(DISTINCT idempotency_key) FROM nq_all_notifications"
            " WHERE source = 'kubernetes'"
        ).fetchone()
    assert row is not None
    return int(row[0])


async def _wait_all_sent(url: str, total: int, timeout: float) -> float:
    started = time.monotonic()
    while True:
        sent, _, outbox = await asyncio.to_thread(_queue_state, url)
        if sent >= total and outbox == 0:
            return time.monotonic()
        if time.monotonic() - started > timeout:
            raise TimeoutError(f"{sent} of {total} SENT, {outbox} statuses queued")
        await asyncio.sleep(0.25)


def _writes(
    before: dict[tuple[str, str, str], int], after: dict[tuple[str, str, str], int], n: int
) -> dict[str, float]:
    out = {}
    for key, count in sorted(after.items()):
        verb, resource, subresource = key
        delta = count - before.get(key, 0)
        if verb in WRITE_VERBS and delta > 0:
            out["/".join(p for p in (verb, resource, subresource) if p)] = round(delta / n, 3)
    return out


async def _round(
    number: int,
    *,
    objects: int,
    api: Api,
    cluster: LocalControlPlane,
    operator: Process,
    url: str,
    metrics_url: str,
    fault: str,
    sent_before: int,
) -> dict[str, Any]:
    names = [f"r{number}-{i:06d}" for i in range(objects)]
    counts_before = await asyncio.to_thread(cluster.request_counts)
    etcd_before = await asyncio.to_thread(cluster.etcd_db_size_bytes)
    cpu_before = operator.cpu_seconds()
    fault_at: list[float] = []

    async def inject() -> None:
        fault_at.append(time.monotonic())
        if fault == "kill-operator":
            operator.kill()
            operator.restart()
        elif fault == "restart-apiserver":
            await asyncio.to_thread(cluster.restart_apiserver)
            await api.reconnect()

    started = time.monotonic()
    create_seconds = await api.create_many(names, inject if fault != "none" else None)
    done = await _wait_all_sent(url, sent_before + objects, timeout=max(600.0, objects * 0.2))
    phases = await api.phases()
    counts_after = await asyncio.to_thread(cluster.request_counts)
    etcd_after = await asyncio.to_thread(cluster.etcd_db_size_bytes)
    result: dict[str, Any] = {
        "objects": objects,
        "create_seconds": round(create_seconds, 2),
        "create_per_second": round(objects / create_seconds, 1),
        "all_sent_seconds": round(done - started, 2),
        "sent_per_second": round(objects / (done - started), 1),
        "phases_listed": phases,
        "api_writes_per_notification": _writes(counts_before, counts_after, objects),
        "operator_cpu_ms_per_object": round(
            (operator.cpu_seconds() - cpu_before) * 1000 / objects, 3
        ),
        "operator_rss_mib_all_sent": round(operator.rss_bytes() / 2**20, 1),
        "operator_remembered_all_sent": await asyncio.to_thread(_remembered, metrics_url),
        "etcd_db_bytes_per_object": round((etcd_after - etcd_before) / objects),
        "etcd_db_mib": round(etcd_after / 2**20, 1),
        "duplicate_rows": await asyncio.to_thread(_duplicates, url),
    }
    if fault_at:
        result["fault"] = fault
        result["all_sent_seconds_after_fault"] = round(done - fault_at[0], 2)
    return result


async def _ttl_cleanup(
    api: Api, operator: Process, metrics_url: str, first: bool
) -> dict[str, Any]:
    """Set the TTL (first round) and wait until the sweeper deleted every finished object."""
    if first:
        await api.call(
            "PATCH",
            f"{GROUP_PATH}/notificationpolicies/default",
            _policy(0),
            content_type="application/merge-patch+json",
        )
    started = time.monotonic()
    remaining = await api.count_objects()
    begun: float | None = None
    start_count = remaining
    while remaining:
        await asyncio.sleep(0.5)
        remaining = await api.count_objects()
        if begun is None and remaining < start_count:
            begun = time.monotonic()
    ended = time.monotonic()
    # Once the DELETED events are handled the operator has forgotten the objects.
    await asyncio.sleep(5.0)
    deleting = ended - (begun or started)
    return {
        "deleted": start_count,
        "seconds_from_ttl_set": round(ended - started, 2),
        "deletions_per_second": round(start_count / deleting, 1) if deleting > 0 else None,
        "operator_rss_mib_after": round(operator.rss_bytes() / 2**20, 1),
        "operator_rss_bytes_after": operator.rss_bytes(),
        "operator_remembered_after": await asyncio.to_thread(_remembered, metrics_url),
    }


async def run(objects: int, rounds: int, concurrency: int, fault: str) -> dict[str, Any]:
    with (
        fresh_postgres("k8s") as pg,
        tempfile.TemporaryDirectory(prefix="nq-k8s-") as workdir,
    ):
        database = pg.database("k8s")
        url = pg.url(database)
        subprocess.run([str(BIN / "notify-queue"), "migrate", "--database-url", url], check=True)
        cluster = LocalControlPlane(Path(workdir) / "cluster")
        cluster.start()
        operator = worker = None
        api = Api(cluster, concurrency)
        try:
            cluster.install_crds()
            cluster.kubectl("create", "namespace", NAMESPACE)
            await api.call("POST", f"{GROUP_PATH}/notificationpolicies", _policy(None))
            env = dict(os.environ, KUBECONFIG=str(cluster.kubeconfig))
            logs = Path(workdir)
            metrics_port = _free_port()
            metrics_url = f"http://127.0.0.1:{metrics_port}/metrics"
            operator = Process(
                "operator",
                [
                    "--database-url",
                    url,
                    "--namespace",
                    NAMESPACE,
                    "--status-patches-per-second",
                    str(STATUS_PATCHES_PER_SECOND),
                    "--status-batch-size",
                    "500",
                    "--metrics-port",
                    str(metrics_port),
                ],
                env,
                logs / "operator.log",
            )
            worker = Process("worker", ["--database-url", url], env, logs / "worker.log")
            await asyncio.sleep(3.0)  # both started: logged in, listening
            rss_start = operator.rss_bytes()
            results = []
            for number in range(1, rounds + 1):
                print(f"round {number}: {objects} objects", file=sys.stderr)
                result = await _round(
                    number,
                    objects=objects,
                    api=api,
                    cluster=cluster,
                    operator=operator,
                    url=url,
                    metrics_url=metrics_url,
                    fault=fault if number == 1 else "none",
                    sent_before=(number - 1) * objects,
                )
                result["ttl_cleanup"] = await _ttl_cleanup(
                    api, operator, metrics_url, first=number == 1
                )
                print(json.dumps(result), file=sys.stderr)
                results.append(result)
            after = [r["ttl_cleanup"]["operator_rss_bytes_after"] for r in results]
            return {
                "objects_per_round": objects,
                "rounds": results,
                # Least squares would say the same for evenly spaced rounds' ends.
                "operator_rss_slope_bytes_per_object_seen": (
                    round((after[-1] - after[0]) / (objects * (len(after) - 1)), 1)
                    if len(after) > 1
                    else None
                ),
                "operator_rss_mib_at_start": round(rss_start / 2**20, 1),
                "status_patches_per_second_cap": STATUS_PATCHES_PER_SECOND,
                "create_concurrency": concurrency,
            }
        finally:
            await api.close()
            for process in (operator, worker):
                if process is not None:
                    process.stop()
            cluster.stop()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.k8s_scale")
    parser.add_argument("--objects", type=int, default=10_000)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--concurrency", type=int, default=32)
    parser.add_argument(
        "--fault", choices=("none", "kill-operator", "restart-apiserver"), default="none"
    )
    args = parser.parse_args()
    started = datetime.now(UTC)
    result = asyncio.run(run(args.objects, args.rounds, args.concurrency, args.fault))
    result |= {
        "command": "python -m benchmarks.k8s_scale " + " ".join(sys.argv[1:]),
        "started_at": started.isoformat(),
        "cores": os.cpu_count(),
        "load_average_after": os.getloadavg(),
        "run_id": uuid.uuid4().hex[:8],
    }
    RESULTS.mkdir(parents=True, exist_ok=True)
    suffix = "" if args.fault == "none" else f"-{args.fault}"
    name = f"latest-{args.objects}{suffix}.json"
    (RESULTS / name).write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
