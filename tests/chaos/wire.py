"""Counting the statements a process sends PostgreSQL, on the wire.

`StatementCounter` is a Unix-socket proxy in front of the test server: a worker given its `url`
talks to PostgreSQL as usual, and each message it sends is read on the way through. A statement
of the extended query protocol ends with one Sync message, a simple query is one Query message,
so `statements` counts what the process asked the database (claims, housekeeping, the outbox,
whichever task sent it). Where a test must tell a sleeping worker from a spinning one, it counts
statements over a window instead of timing CPU: a busy machine slows a spinning worker down, it
never makes a sleeping one ask more.
"""

from __future__ import annotations

import asyncio
import contextlib
import shutil
import struct
import tempfile
from pathlib import Path
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

# Untyped packets a client may send before its startup message (protocol section 55.2).
_SSL_REQUEST = 80877103
_GSSENC_REQUEST = 80877104


class StatementCounter:
    def __init__(self, database_url: str) -> None:
        parts = urlsplit(database_url)
        query = dict(parse_qsl(parts.query))
        port = query.get("port") or str(parts.port or 5432)
        # The embedded server listens on a Unix socket only (its URL names the directory).
        self._target = str(Path(query["host"]) / f".s.PGSQL.{port}")
        # A short directory of its own: a Unix socket path is limited to about 100 bytes.
        self._dir = Path(tempfile.mkdtemp(prefix="nq-wire-"))
        self._listen = str(self._dir / f".s.PGSQL.{port}")
        self.url = urlunsplit(parts._replace(query=urlencode({**query, "host": str(self._dir)})))
        self.statements = 0
        self._server: asyncio.Server | None = None
        self._pipes: set[asyncio.Task[None]] = set()

    async def start(self) -> StatementCounter:
        self._server = await asyncio.start_unix_server(self._accept, path=self._listen)
        return self

    async def stop(self) -> None:
        if self._server is not None:
            self._server.close()
        for pipe in list(self._pipes):
            pipe.cancel()
        await asyncio.gather(*self._pipes, return_exceptions=True)
        shutil.rmtree(self._dir, ignore_errors=True)

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        up_reader, up_writer = await asyncio.open_unix_connection(self._target)
        pipes = [
            asyncio.create_task(self._from_client(reader, up_writer)),
            asyncio.create_task(_copy(up_reader, writer)),
        ]
        self._pipes.update(pipes)
        try:
            # Either side closing ends the connection, as it would without the proxy.
            await asyncio.wait(pipes, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for pipe in pipes:
                pipe.cancel()
                self._pipes.discard(pipe)
            for w in (writer, up_writer):
                w.close()

    async def _from_client(
        self, reader: asyncio.StreamReader, upstream: asyncio.StreamWriter
    ) -> None:
        with contextlib.suppress(asyncio.IncompleteReadError, ConnectionError):
            while True:  # untyped: SSL or GSS requests, then the startup (or cancel) message
                head = await reader.readexactly(8)
                length, code = struct.unpack("!ii", head)
                upstream.write(head + await reader.readexactly(length - 8))
                await upstream.drain()
                if code not in (_SSL_REQUEST, _GSSENC_REQUEST):
                    break
            while True:  # typed: one byte of kind, a length that counts itself
                head = await reader.readexactly(5)
                (length,) = struct.unpack("!i", head[1:])
                body = await reader.readexactly(length - 4)
                if head[:1] in (b"S", b"Q"):  # Sync, Query: one statement each
                    self.statements += 1
                upstream.write(head + body)
                await upstream.drain()


async def _copy(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    with contextlib.suppress(ConnectionError):
        while data := await reader.read(65536):
            writer.write(data)
            await writer.drain()
