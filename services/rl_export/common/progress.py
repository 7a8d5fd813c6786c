"""A small progress bar for long CLI work, drawn on stderr only when it is a terminal."""

from __future__ import annotations

import sys
import time
from typing import TextIO


class Progress:
    """Counts work done; redraws at most ten times a second; ``close`` prints the summary."""

    def __init__(self, label: str, total: int | None = None, stream: TextIO | None = None) -> None:
        self.label = label
        self.total = total
        self.done = 0
        self.stream = stream or sys.stderr
        self.enabled = self.stream.isatty()
        self._started = time.monotonic()
        self._drawn = 0.0

    def advance(self, count: int = 1) -> None:
        self.done += count
        now = time.monotonic()
        if self.enabled and now - self._drawn >= 0.1:
            self._drawn = now
            self.stream.write("\r" + self._line(now))
            self.stream.flush()

    def _line(self, now: float) -> str:
        rate = self.done / max(now - self._started, 1e-9)
        if self.total:
            width = 30
            filled = int(width * min(self.done / self.total, 1.0))
            bar = "#" * filled + "-" * (width - filled)
            return f"{self.label} [{bar}] {self.done}/{self.total} ({rate:,.0f}/s)"
        return f"{self.label} {self.done} ({rate:,.0f}/s)"

    def close(self) -> None:
        if self.enabled:
            self.stream.write("\r" + self._line(time.monotonic()) + "\n")
            self.stream.flush()
