"""Where templates are rendered: a small pool of worker processes, off the event loop.

A render runs client-written code. The sandbox (services.sandbox) bounds what each operation
may build, but a template can still take time (nested loops over data) or memory in ways no
operation check sees, and a thread cannot be stopped. So the API and the operator render in
worker processes (services.render_worker): the event loop only writes a request to a pipe and
awaits the answer, so `/healthz` and every other request keep being served; a render past
RENDER_TIMEOUT_SECONDS has its worker killed (the render really stops) and replaced by the next
render that needs one; a worker's address space is capped (RENDER_MEMORY_BYTES).

Workers start on the first render (a process that never renders a template never starts one)
and live as long as the pool; one renders one request at a time. `InlineRenderer` renders in
the calling process with the sandbox's bounds only: for tests and tools, never for a process
that serves clients.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import math
import os
import struct
import subprocess
import sys
from collections.abc import Mapping
from typing import Any, Protocol

from notify_queue.errors import TemplateRenderFailed
from notify_queue.services.sandbox import RULE_MEMORY, RULE_TIME, render_parts

# Wall-clock limit of one render (every part of one channel's template). An honest template
# renders in about a millisecond; a second is a thousand times that, so a loaded machine does not
# fail honest renders, and a bomb holds a worker (and the creates waiting for one) a second at
# most.
RENDER_TIMEOUT_SECONDS = 1.0
# Address space a worker may take beyond its own at start (about 20 MB resident). The sandbox
# refuses any value over a million characters or items (8 MB at most), so an honest render needs
# a few megabytes; this bounds what the sandbox cannot see (many values within the bound at once)
# so that two workers stay inside the chart's 256 MiB limit beside the API process itself.
RENDER_MEMORY_BYTES = 64 * 1024 * 1024
# Worker processes per pool (one pool per API process and per operator). Two render 1,500 to
# 4,000 receipts a second on a loaded 2-core machine (benchmarks/probes/template_render.py), more
# than an API process creates; two also mean one bomb at a time cannot stall every templated create
# while its worker waits for the time limit.
RENDER_PROCESSES = 2
# The workers' scheduling priority below their parent's: a render that spins until its time
# limit must not take the CPU from the event loop that serves /healthz (on a 2-core pod, two
# spinning workers would otherwise have both cores).
RENDER_NICENESS = 5
# How long a new worker may take to start (import Jinja2, set its limits); generous, a loaded
# machine starts Python slowly, and this is not a limit on templates.
WORKER_START_SECONDS = 30.0

_HEADER = struct.Struct(">I")


class Renderer(Protocol):
    async def render(
        self, parts: Mapping[str, tuple[str, int]], data: Mapping[str, Any]
    ) -> dict[str, str]:
        """Each part (source, output cap in characters) rendered with `data`; raise
        TemplateRenderFailed for the first that cannot be."""
        ...

    async def close(self) -> None: ...


class InlineRenderer:
    """Renders in this process, on the event loop, with the sandbox's bounds but no time or
    memory limit: for tests and tools that render templates they trust."""

    async def render(
        self, parts: Mapping[str, tuple[str, int]], data: Mapping[str, Any]
    ) -> dict[str, str]:
        return _texts(render_parts(parts, data))

    async def close(self) -> None:
        pass


class _Worker:
    """One render worker process and its pipes, read and written by the event loop."""

    def __init__(
        self,
        process: subprocess.Popen[bytes],
        reader: asyncio.StreamReader,
        writer: asyncio.WriteTransport,
    ) -> None:
        self.process = process
        self._reader = reader
        self._writer = writer

    @classmethod
    async def start(cls, command: list[str]) -> _Worker:
        loop = asyncio.get_running_loop()
        # Started on a thread: starting a process returns once the child has exec'd, tens of
        # milliseconds on a loaded machine, which on the event loop would be tens of
        # milliseconds of /healthz unanswered.
        started = loop.run_in_executor(None, _popen, command)
        try:
            process = await asyncio.shield(started)
        except asyncio.CancelledError:
            started.add_done_callback(_kill_when_started)
            raise
        assert process.stdin is not None and process.stdout is not None
        try:
            reader = asyncio.StreamReader()
            await loop.connect_read_pipe(
                lambda: asyncio.StreamReaderProtocol(reader), process.stdout
            )
            writer, _ = await loop.connect_write_pipe(asyncio.Protocol, process.stdin)
        except BaseException:
            process.kill()
            raise
        return cls(process, reader, writer)

    async def receive(self) -> Any:
        (length,) = _HEADER.unpack(await self._reader.readexactly(_HEADER.size))
        return json.loads(await self._reader.readexactly(length))

    async def ask(self, payload: bytes) -> Any:
        # One request at a time per worker: the pipe's buffer and the transport's hold it all.
        self._writer.write(_HEADER.pack(len(payload)) + payload)
        return await self.receive()

    def kill(self) -> None:
        """Kill the process (if alive) and close the pipes; it still has to be reaped."""
        if self.process.poll() is None:
            self.process.kill()
        self._writer.close()
        self._reader.feed_eof()


def _popen(command: list[str]) -> subprocess.Popen[bytes]:
    process = subprocess.Popen(command, stdin=subprocess.PIPE, stdout=subprocess.PIPE)
    # At a lower priority from its first instruction, starting Python included (a third of a
    # second of CPU, once for every worker a bomb's time limit killed), so a render or a start
    # never takes the CPU from the event loop that serves /healthz.
    with contextlib.suppress(OSError):
        niceness = os.getpriority(os.PRIO_PROCESS, 0) + RENDER_NICENESS
        os.setpriority(os.PRIO_PROCESS, process.pid, niceness)
    return process


def _kill_when_started(started: asyncio.Future[subprocess.Popen[bytes]]) -> None:
    if not started.cancelled() and started.exception() is None:
        started.result().kill()


class RenderPool:
    """Up to `processes` render workers; each render waits for a free one."""

    def __init__(
        self,
        *,
        processes: int = RENDER_PROCESSES,
        timeout_seconds: float = RENDER_TIMEOUT_SECONDS,
        memory_bytes: int = RENDER_MEMORY_BYTES,
    ) -> None:
        self._slots = asyncio.Semaphore(processes)
        self._timeout_seconds = timeout_seconds
        self._memory_bytes = memory_bytes
        self._idle: list[_Worker] = []
        self._workers: set[_Worker] = set()
        # Killed workers being reaped, for close() to wait for.
        self._reaping: list[asyncio.Future[int]] = []
        self._closed = False

    async def render(
        self, parts: Mapping[str, tuple[str, int]], data: Mapping[str, Any]
    ) -> dict[str, str]:
        payload = json.dumps(
            {"parts": {name: [source, cap] for name, (source, cap) in parts.items()}, "data": data}
        ).encode()
        async with self._slots:
            worker = self._idle.pop() if self._idle else await self._start()
            try:
                answer = await asyncio.wait_for(worker.ask(payload), self._timeout_seconds)
            except TimeoutError:
                self._discard(worker)
                raise TemplateRenderFailed(
                    part="",
                    kind="bound",
                    rule=RULE_TIME,
                    message=f"exceeds the {RULE_TIME} bound ({self._timeout_seconds:g} s)",
                ) from None
            except (asyncio.IncompleteReadError, ConnectionError):
                # The worker died under the render: the kernel refused it memory it could not
                # even raise a MemoryError for, or it broke; either way the template did it.
                self._discard(worker)
                raise TemplateRenderFailed(
                    part="",
                    kind="bound",
                    rule=RULE_MEMORY,
                    message=f"exceeds the {RULE_MEMORY} bound (the render process died)",
                ) from None
            except BaseException:  # cancelled mid-render: its answer would confuse the next
                self._discard(worker)
                raise
            self._idle.append(worker)
        return _texts(answer)

    async def _start(self) -> _Worker:
        if self._closed:
            raise RuntimeError("the render pool is closed")
        alarm_seconds = math.ceil(self._timeout_seconds) + 2
        command = [sys.executable, "-m", "notify_queue.services.render_worker"]
        worker = await _Worker.start([*command, str(self._memory_bytes), str(alarm_seconds)])
        self._workers.add(worker)
        try:
            await asyncio.wait_for(worker.receive(), WORKER_START_SECONDS)
        except BaseException:
            self._discard(worker)
            raise
        return worker

    def _discard(self, worker: _Worker) -> None:
        """Kill a worker whose state is unknown; the next render that needs one starts one.
        It is reaped on a thread (waiting for a process to exit blocks)."""
        worker.kill()
        self._workers.discard(worker)
        self._reaping = [f for f in self._reaping if not f.done()]
        self._reaping.append(asyncio.get_running_loop().run_in_executor(None, worker.process.wait))

    async def close(self) -> None:
        """Stop every worker and wait for them to exit."""
        self._closed = True
        for worker in list(self._workers):
            self._discard(worker)
        self._idle.clear()
        reaping, self._reaping = self._reaping, []
        await asyncio.gather(*reaping)


def _texts(answer: Mapping[str, Any]) -> dict[str, str]:
    error = answer.get("error")
    if error is not None:
        raise TemplateRenderFailed(
            part=error["part"], kind=error["kind"], message=error["message"], rule=error["rule"]
        )
    texts: dict[str, str] = answer["texts"]
    return texts
