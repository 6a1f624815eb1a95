"""A render worker process: renders templates for its parent (services.rendering), one request at
a time, over its stdin and stdout.

Each message is a 4-byte big-endian length and that many bytes of JSON. The worker first sends
`{"ready": true}` once it has imported the sandbox and set its limits; then, for every request
`{"parts": {part: [source, max_chars]}, "data": {...}}`, one answer (sandbox.render_parts).
It exits when its stdin closes, so a parent that dies takes its workers with it.

Its limits: an address space of its size at start plus RENDER_MEMORY_BYTES (a template that
allocates more gets a MemoryError, answered as the memory bound); and an alarm per request, a
little after the parent's own wall-clock limit, that kills the worker if the parent did not (a
parent that died in the middle of a render). Its parent starts it at a lower
priority than its own (services.rendering).
"""

from __future__ import annotations

import json
import os
import resource
import signal
import struct
import sys
from typing import Any, BinaryIO

from notify_queue.services.sandbox import RULE_MEMORY, memory_message, render_parts

_HEADER = struct.Struct(">I")
# Raising one's own OOM score needs no privilege; 500 makes a worker the kernel's first choice
# over its parent (0) when the container's memory runs out.
RENDER_OOM_SCORE_ADJ = 500


def limit_memory(extra_bytes: int) -> None:
    """Cap the address space at what this process uses now plus `extra_bytes`."""
    try:
        with open("/proc/self/statm") as statm:
            used = int(statm.read().split()[0]) * os.sysconf("SC_PAGE_SIZE")
    except OSError:  # not Linux: the wall-clock limit still holds
        return
    _, hard = resource.getrlimit(resource.RLIMIT_AS)
    soft = used + extra_bytes
    if hard != resource.RLIM_INFINITY:
        soft = min(soft, hard)
    resource.setrlimit(resource.RLIMIT_AS, (soft, hard))


def _read(stream: BinaryIO) -> Any | None:
    header = stream.read(_HEADER.size)
    if len(header) < _HEADER.size:
        return None
    (length,) = _HEADER.unpack(header)
    return json.loads(stream.read(length))


def _write(stream: BinaryIO, message: Any) -> None:
    payload = json.dumps(message).encode()
    stream.write(_HEADER.pack(len(payload)) + payload)
    stream.flush()


def serve(memory_bytes: int, alarm_seconds: int) -> None:
    stdin, stdout = sys.stdin.buffer, sys.stdout.buffer
    sys.stdout = sys.stderr  # nothing else may write to the parent's pipe
    limit_memory(memory_bytes)
    _write(stdout, {"ready": True})
    while True:
        request = _read(stdin)
        if request is None:
            return
        signal.alarm(alarm_seconds)
        try:
            parts = {name: (source, int(cap)) for name, (source, cap) in request["parts"].items()}
            answer = render_parts(parts, request["data"])
        except MemoryError:  # outside a part's render: decoding the request
            answer = {
                "error": {
                    "part": "",
                    "kind": "bound",
                    "rule": RULE_MEMORY,
                    "message": memory_message(),
                }
            }
        signal.alarm(0)
        _write(stdout, answer)


def main() -> None:
    memory_bytes, alarm_seconds = (int(v) for v in sys.argv[1:3])
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C stops the parent, which stops us
    # Should the container run out of memory all the same, the kernel kills a render first.
    try:
        with open("/proc/self/oom_score_adj", "w") as adj:
            adj.write(str(RENDER_OOM_SCORE_ADJ))
    except OSError:  # not Linux
        pass
    serve(memory_bytes, alarm_seconds)


if __name__ == "__main__":
    main()
