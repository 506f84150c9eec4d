"""Engines a script did not shut down are shut down when the interpreter exits.

Without it the engine core dies under vLLM's output loop at exit, which logs an `EngineDeadError`
traceback after a script whose results were fine. The handler is registered at the first engine
start, after vLLM's own modules registered theirs, so it runs before them (atexit is LIFO).
"""

from __future__ import annotations

import asyncio
import atexit
import contextlib
import weakref
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from ie_vllm.host.engine import Engine

__all__ = ["shutdown_open_engines", "track"]

_OPEN: weakref.WeakSet[Engine] = weakref.WeakSet()
_registered = False


def track(engine: Engine) -> None:
    """Shut `engine` down at exit unless it is closed by then."""
    global _registered
    if not _registered:
        atexit.register(shutdown_open_engines)
        _registered = True
    _OPEN.add(engine)


def shutdown_open_engines(timeout: float = 30.0) -> None:
    """Close every engine still open, on its own loop when that loop runs in another thread (as
    `shutdown()` would), else directly; an engine that cannot be reached is left to the OS."""
    for engine in list(_OPEN):
        if engine.closed:
            continue
        with contextlib.suppress(Exception):
            if engine.loop.is_running():
                done = asyncio.run_coroutine_threadsafe(engine.close(), engine.loop)
                done.result(timeout)
            else:
                engine.shutdown()
