"""A dependency-free progress line on stderr.

On a terminal it redraws one line at most 5 times a second; otherwise (logs, CI) it prints
a line at every 10% so logs stay short.
"""

from __future__ import annotations

import sys
import time


class Progress:
    def __init__(self, label: str, total: int, *, enabled: bool = True, stream=None):
        self.label = label
        self.total = max(total, 1)
        self.stream = stream or sys.stderr
        self.enabled = enabled
        self.tty = hasattr(self.stream, "isatty") and self.stream.isatty()
        self._last = 0.0
        self._last_decile = -1
        self._t0 = time.perf_counter()

    def __call__(self, done: int, total: int | None = None, note: str = "") -> None:
        if not self.enabled:
            return
        total = total or self.total
        frac = min(done / total, 1.0)
        now = time.perf_counter()
        if self.tty:
            if now - self._last < 0.2 and done < total:
                return
            self._last = now
            bar = "#" * int(frac * 30)
            self.stream.write(f"\r{self.label} [{bar:<30}] {done}/{total} {note}".rstrip() + " ")
            if done >= total:
                self.stream.write("\n")
        else:
            decile = int(frac * 10)
            if decile == self._last_decile:
                return
            self._last_decile = decile
            self.stream.write(f"{self.label}: {done}/{total} ({frac:.0%}, {now - self._t0:.1f}s) {note}\n")
        self.stream.flush()
