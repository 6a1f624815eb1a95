"""Procrastinate side of the side-by-side burn-down (run in benchmarks/peers/.venv-procrastinate).

    python procrastinate_burn.py seed <conninfo> <jobs>
    python procrastinate_burn.py work <conninfo> <concurrency>

`seed` applies Procrastinate's schema and defers the jobs with `batch_defer_async` in chunks of
1,000 (one statement per chunk). `work` runs one worker with `concurrency` async sub-workers and
a task that returns at once, until SIGTERM. The harness reads the job events' timestamps
(procrastinate_events: first `started` to last `succeeded`).
"""

from __future__ import annotations

import asyncio
import sys

import procrastinate

app = procrastinate.App(connector=procrastinate.PsycopgConnector(conninfo=sys.argv[2]))


@app.task(name="bench_noop", queue="bench")
async def bench_noop(n: int) -> None:
    return None


async def seed(jobs: int) -> None:
    async with app.open_async():
        await app.schema_manager.apply_schema_async()
        for start in range(0, jobs, 1000):
            await bench_noop.batch_defer_async(
                *({"n": i} for i in range(start, min(start + 1000, jobs)))
            )


async def work(concurrency: int) -> None:
    async with app.open_async():
        await app.run_worker_async(
            queues=["bench"],
            concurrency=concurrency,
            wait=True,
            install_signal_handlers=True,
            fetch_job_polling_interval=0.5,
        )


if __name__ == "__main__":
    if sys.argv[1] == "seed":
        asyncio.run(seed(int(sys.argv[3])))
    else:
        asyncio.run(work(int(sys.argv[3])))
