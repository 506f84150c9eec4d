"""A one-line progress display (rows written, tokens per second) on stderr, drawn only when a
person watches a terminal (`ie_core.progress.progress_enabled`)."""

from __future__ import annotations

import sys
import time

from ie_core.progress import progress_enabled

__all__ = ["ProgressLine"]


class ProgressLine:
    def __init__(
        self, total: int | None, *, enabled: bool | None, already: int = 0, label: str = "harvest"
    ) -> None:
        self.label = label
        self.total = total
        self.enabled = progress_enabled() if enabled is None else enabled
        self.done = already
        self.new = 0
        self.began = time.perf_counter()

    def update(self, rows: int) -> None:
        self.done += rows
        self.new += rows
        if not self.enabled:
            return
        rate = self.new / max(time.perf_counter() - self.began, 1e-9)
        of = f"/{self.total}" if self.total else ""
        sys.stderr.write(f"\r{self.label}: {self.done}{of} tokens, {rate:,.0f} tokens/s")
        sys.stderr.flush()

    def close(self) -> None:
        if self.enabled and self.new:
            sys.stderr.write("\n")
