"""Load sampling while a benchmark cell measures; the gate itself is `ie_core.benchmark_load`."""

from __future__ import annotations

import os
import threading
from typing import Any

from ie_core.benchmark_load import MAX_LOAD_PER_CORE, Verdict, judge

SAMPLE_EVERY_S = 2.0


class LoadSampler:
    """Samples the 1-minute load average on a daemon thread while a cell measures."""

    def __init__(self, every_s: float = SAMPLE_EVERY_S) -> None:
        self._every = every_s
        self._stop = threading.Event()
        self._samples: list[float] = []
        self._thread = threading.Thread(target=self._run, name="ie-bench-load", daemon=True)

    def _run(self) -> None:
        while True:
            self._samples.append(round(os.getloadavg()[0], 2))
            if self._stop.wait(self._every):
                return

    def __enter__(self) -> LoadSampler:
        self._thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self._stop.set()
        self._thread.join()

    def summary(self) -> dict[str, Any]:
        s = self._samples
        return {"max_1m": max(s) if s else None, "min_1m": min(s) if s else None, "samples": len(s)}


__all__ = ["MAX_LOAD_PER_CORE", "LoadSampler", "Verdict", "judge"]
