"""A progress line on stderr, without a dependency: redrawn in place on a terminal, one line
every few seconds otherwise (CI logs, pipes)."""

from __future__ import annotations

import sys
import time


class Progress:
    def __init__(self, label: str, total: int | None = None, unit: str = "") -> None:
        self.label = label
        self.total = total
        self.unit = unit
        self.done = 0
        self._started = time.monotonic()
        self._last_drawn = 0.0
        self._tty = sys.stderr.isatty()
        self._draw(force=True)

    def update(self, done: int, *, note: str = "") -> None:
        self.done = done
        self._draw(note=note)

    def close(self, note: str = "") -> None:
        self._draw(force=True, note=note)
        if self._tty:
            sys.stderr.write("\n")
            sys.stderr.flush()

    def _draw(self, *, force: bool = False, note: str = "") -> None:
        now = time.monotonic()
        if not force and now - self._last_drawn < (0.2 if self._tty else 5.0):
            return
        self._last_drawn = now
        elapsed = now - self._started
        if self.total:
            share = min(self.done / self.total, 1.0)
            bar = "#" * int(share * 24) + "-" * (24 - int(share * 24))
            body = f"[{bar}] {share:6.1%} {self.done:,}/{self.total:,}{self.unit}"
        else:
            body = f"{self.done:,}{self.unit}"
        line = f"  {self.label}: {body} {elapsed:6.1f}s {note}".rstrip()
        if self._tty:
            sys.stderr.write("\r\x1b[2K" + line[:160])
        else:
            sys.stderr.write(line + "\n")
        sys.stderr.flush()


def say(message: str) -> None:
    """A line of narration between progress bars."""
    sys.stderr.write(message + "\n")
    sys.stderr.flush()
