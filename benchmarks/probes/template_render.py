"""What bounding templates costs: renders per second and the latency a template adds to a create.

    python -m benchmarks.probes.template_render [--renders N] [--creates N] [--creates-only]
                                         [--output-dir D]

Renders (in this process): one receipt-sized template (subject and body, a loop over three
items, two filters) rendered one at a time (latency) and 64 at a time (renders per second), three
ways: as 0.1.0 did (Jinja2's plain sandbox, compiled on every render, on the event loop), with
the bounded sandbox in process (`InlineRenderer`), and through the worker processes
(`RenderPool`, what the API uses). The event loop's CPU per render is what the API process pays.

Creates (a real `notify-queue api` on a benchmark PostgreSQL): POST /notifications one at a time,
plain and from the template, alternating, for the latency a template adds; then templated
creates 32 at a time for creates per second. `--creates-only` runs just this part, so it can be
run against another checkout (`PYTHONPATH=<0.1.0>/src`) for the figure before the change.

Prints the figures and writes `<timestamp>.json` and `latest.json` to `--output-dir`
(`benchmarks/results/template-render`).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import shutil
import socket
import statistics
import sys
import tempfile
import time
import uuid
from collections.abc import Awaitable, Callable, Mapping
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpx

from benchmarks import queue
from benchmarks.env import BenchPostgres, machine_info
from benchmarks.procs import notify_queue

OUT = Path(__file__).resolve().parent.parent / "results" / "template-render"
SUBJECT = "Your order {{ order }} has shipped"
BODY = (
    "Hello {{ name|title }},\n\nOrder {{ order }}:\n"
    "{% for item in items %}- {{ item.name }} x{{ item.qty }}: {{ '%.2f'|format(item.price) }}\n"
    "{% endfor %}Total: {{ '%.2f'|format(total) }}\n"
)
DATA = {
    "name": "ada lovelace",
    "order": 1042,
    "items": [
        {"name": "Notebook", "qty": 2, "price": 3.5},
        {"name": "Pencil", "qty": 10, "price": 0.4},
        {"name": "Ruler", "qty": 1, "price": 1.25},
    ],
    "total": 13.25,
}
PARTS = {"subject": (SUBJECT, 998), "body": (BODY, 65_536)}

Render = Callable[[Mapping[str, tuple[str, int]], Mapping[str, Any]], Awaitable[dict[str, str]]]


def _legacy() -> Render:
    """0.1.0's render: a plain sandbox, the template compiled from its text every time."""
    from jinja2 import StrictUndefined
    from jinja2.sandbox import SandboxedEnvironment

    env = SandboxedEnvironment(undefined=StrictUndefined, autoescape=False)

    async def render(
        parts: Mapping[str, tuple[str, int]], data: Mapping[str, Any]
    ) -> dict[str, str]:
        return {
            name: env.from_string(source).render(dict(data)) for name, (source, _) in parts.items()
        }

    return render


def _percentile(values: list[float], fraction: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(fraction * len(ordered)))]


async def _measure_renders(render: Render, renders: int) -> dict[str, float]:
    for _ in range(20):  # warm: workers started, template compiled
        await render(PARTS, DATA)
    latencies = []
    for _ in range(renders):
        started = time.perf_counter()
        await render(PARTS, DATA)
        latencies.append(time.perf_counter() - started)
    slots = asyncio.Semaphore(64)

    async def one() -> None:
        async with slots:
            await render(PARTS, DATA)

    wall, cpu = time.perf_counter(), time.process_time()
    await asyncio.gather(*(one() for _ in range(renders)))
    wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
    return {
        "latency_p50_us": round(statistics.median(latencies) * 1e6, 1),
        "latency_p99_us": round(_percentile(latencies, 0.99) * 1e6, 1),
        "renders_per_second": round(renders / wall),
        "event_loop_process_cpu_us_per_render": round(cpu / renders * 1e6, 1),
    }


async def measure_renders(renders: int) -> dict[str, dict[str, float]]:
    from notify_queue.services.rendering import InlineRenderer, RenderPool

    results = {"0.1.0": await _measure_renders(_legacy(), renders)}
    results["inline"] = await _measure_renders(InlineRenderer().render, renders)
    pool = RenderPool()
    try:
        results["pool"] = await _measure_renders(pool.render, renders)
    finally:
        await pool.close()
    return results


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


async def _creates(base_url: str, creates: int) -> dict[str, float]:
    async with httpx.AsyncClient(base_url=base_url, timeout=60) as http:
        for _ in range(300):
            try:
                if (await http.get("/readyz")).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            await asyncio.sleep(0.1)
        put = await http.put(
            "/templates/receipt",
            json={"channels": {"email": {"subject": SUBJECT, "body": BODY}}},
        )
        assert put.status_code in (200, 201), put.text

        async def create(templated: bool) -> float:
            body: dict[str, Any] = {"channel": "email", "recipient": "a@example.com"}
            if templated:
                body |= {"template": "receipt", "data": DATA}
            else:
                body |= {"subject": "Your order 1042 has shipped", "body": "x" * 200}
            started = time.perf_counter()
            answer = await http.post(
                "/notifications", json=body, headers={"Idempotency-Key": uuid.uuid4().hex}
            )
            assert answer.status_code == 201, answer.text
            return time.perf_counter() - started

        for _ in range(20):
            await create(True)
            await create(False)
        plain, templated = [], []
        for _ in range(creates):
            plain.append(await create(False))
            templated.append(await create(True))
        slots = asyncio.Semaphore(32)

        async def one() -> None:
            async with slots:
                await create(True)

        wall = time.perf_counter()
        await asyncio.gather(*(one() for _ in range(creates * 4)))
        wall = time.perf_counter() - wall
    return {
        "plain_p50_ms": round(statistics.median(plain) * 1e3, 2),
        "templated_p50_ms": round(statistics.median(templated) * 1e3, 2),
        "added_p50_ms": round((statistics.median(templated) - statistics.median(plain)) * 1e3, 2),
        "plain_p99_ms": round(_percentile(plain, 0.99) * 1e3, 2),
        "templated_p99_ms": round(_percentile(templated, 0.99) * 1e3, 2),
        "templated_creates_per_second_32_in_flight": round(creates * 4 / wall),
    }


def measure_creates(creates: int) -> dict[str, float]:
    workdir = Path(tempfile.mkdtemp(prefix="nq-tpl-"))
    pg = BenchPostgres(workdir)
    api = None
    try:
        url = pg.url(pg.database("tpl"))
        queue.migrate(url)
        port = _free_port()
        args = ["--port", str(port), "--database-url", url, "--log-level", "WARNING"]
        api = notify_queue("api", args, workdir, "api")
        return asyncio.run(_creates(f"http://127.0.0.1:{port}", creates))
    finally:
        if api is not None:
            api.stop()
        pg.server.stop()
        shutil.rmtree(workdir, ignore_errors=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--renders", type=int, default=5000)
    parser.add_argument("--creates", type=int, default=500)
    parser.add_argument("--creates-only", action="store_true")
    parser.add_argument("--output-dir", type=Path, default=OUT)
    args = parser.parse_args()
    started = datetime.now(UTC)
    doc: dict[str, Any] = {
        "command": "python -m benchmarks.probes.template_render " + " ".join(sys.argv[1:]),
        "started_at": started.isoformat(),
        "machine": machine_info(),
        "params": {"renders": args.renders, "creates": args.creates},
    }
    if not args.creates_only:
        doc["renders"] = asyncio.run(measure_renders(args.renders))
        for name, figures in doc["renders"].items():
            print(f"render {name:6}: {figures}")
    doc["creates"] = measure_creates(args.creates)
    print(f"creates: {doc['creates']}")
    args.output_dir.mkdir(parents=True, exist_ok=True)
    text = json.dumps(doc, indent=1)
    (args.output_dir / f"{started:%Y%m%dT%H%M%SZ}.json").write_text(text)
    (args.output_dir / "latest.json").write_text(text)


if __name__ == "__main__":
    main()
