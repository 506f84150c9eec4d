"""Load sampling while a benchmark measures: the 1-minute load average and other work's threads.

Besides the load average, which counts the benchmark's own engine and client too, the sampler
counts the threads of *other* processes that are runnable at each sample: the competing work a
published figure must not include (the gate is `ie_core.tooling.benchmark_load.judge`). Standard library
only, so every benchmark program (ie-bench, the eager and HTTP scripts) records load the same way.
"""

from __future__ import annotations

import os
import threading
from pathlib import Path
from typing import Any

from ie_core.tooling.benchmark_load import MAX_FOREIGN

SAMPLE_EVERY_S = 2.0
# Idle seconds before a timed step when several vLLM engines share the machine: an idle worker
# busy-loops on its shared-memory queue for 1 s after its last read (`busy_loop_s` in vLLM's
# shm_broadcast.py), which would run into the next engine's step.
SETTLE_S = 1.5


def _stat(path: Path) -> tuple[str, int] | None:
    """(state, parent pid) from a /proc stat file; the command name may hold spaces or ')'."""
    try:
        text = path.read_text()
    except OSError:  # the task ended while we looked
        return None
    fields = text[text.rindex(")") + 2 :].split()
    return fields[0], int(fields[1])


def foreign_runnable(root: int, proc: Path = Path("/proc")) -> int | None:
    """Runnable threads outside the process tree rooted at `root`; None where /proc is absent."""
    if not (proc / "self").exists():
        return None
    children: dict[int, list[int]] = {}
    pids: list[int] = []
    for entry in proc.iterdir():
        if entry.name.isdigit() and (st := _stat(entry / "stat")) is not None:
            pids.append(int(entry.name))
            children.setdefault(st[1], []).append(int(entry.name))
    # Descendants of root: engine cores and workers are children of the client process.
    ours, stack = {root}, [root]
    while stack:
        for child in children.get(stack.pop(), []):
            if child not in ours:
                ours.add(child)
                stack.append(child)
    running = 0
    for pid in set(pids) - ours:
        for task in (proc / str(pid) / "task").glob("*/stat"):
            st = _stat(task)
            running += st is not None and st[0] == "R"
    return running


class LoadSampler:
    """Samples, on a daemon thread while a cell measures, the 1-minute load average and the
    runnable threads of processes outside this benchmark's process tree."""

    def __init__(self, every_s: float = SAMPLE_EVERY_S) -> None:
        self._every = every_s
        self._stop = threading.Event()
        self._samples: list[float] = []
        self._foreign: list[int] = []
        self._root = os.getpid()
        self._thread = threading.Thread(target=self._run, name="ie-load-sampler", daemon=True)

    def _run(self) -> None:
        while True:
            self._samples.append(round(os.getloadavg()[0], 2))
            if (n := foreign_runnable(self._root)) is not None:
                self._foreign.append(n)
            if self._stop.wait(self._every):
                return

    def __enter__(self) -> LoadSampler:
        self._thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self._stop.set()
        self._thread.join()

    def summary(self) -> dict[str, Any]:
        s, f = self._samples, self._foreign
        out: dict[str, Any] = {
            "max_1m": max(s) if s else None,
            "min_1m": min(s) if s else None,
            "samples": len(s),
        }
        if f:
            out |= {"foreign_mean": round(sum(f) / len(f), 3), "foreign_max": max(f)}
        return out

    def quiet(self) -> bool | None:
        """Whether other work stayed within the gate's bound; None where it was not counted."""
        f = self._foreign
        return None if not f else sum(f) / len(f) <= MAX_FOREIGN


__all__ = ["SAMPLE_EVERY_S", "SETTLE_S", "LoadSampler", "foreign_runnable"]
