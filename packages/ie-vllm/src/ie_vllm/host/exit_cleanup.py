"""Engines a script did not shut down are shut down when the interpreter exits.

Without it the engine core dies under vLLM's output loop at exit, which logs an `EngineDeadError`
traceback after a script whose results were fine. The handler is registered at the first engine
start, after vLLM's own modules registered theirs, so it runs before them (atexit is LIFO). It
closes each engine with `at_exit=True`: by then Python refuses new worker threads, so a close
that hands its blocking part to a thread would fail and leave the engine to vLLM's own finalizer,
which gives the engine core 5 s and then force-kills it.
"""

from __future__ import annotations

import asyncio
import atexit
import contextlib
import weakref
from collections.abc import Coroutine
from typing import Any, Protocol

__all__ = ["Closable", "shutdown_open_engines", "track"]


class Closable(Protocol):
    """What the exit handler needs of an engine (`ie_vllm.host.engine.Engine` has it): whether it
    is closed, the loop it belongs to, and its two ways to close."""

    @property
    def closed(self) -> bool: ...

    @property
    def loop(self) -> asyncio.AbstractEventLoop: ...

    def close(self, timeout: float = ..., *, at_exit: bool = False) -> Coroutine[Any, Any, Any]: ...

    def shutdown(self) -> Any: ...


_OPEN: weakref.WeakSet[Closable] = weakref.WeakSet()
_registered = False


def track(engine: Closable) -> None:
    """Shut `engine` down at exit unless it is closed by then."""
    global _registered
    if not _registered:
        atexit.register(shutdown_open_engines)
        _registered = True
    _OPEN.add(engine)


def shutdown_open_engines(timeout: float = 90.0) -> None:
    """Close every engine still open, on its own loop when that loop runs in another thread (as
    `shutdown()` would), else directly; an engine that cannot be reached is left to the OS."""
    for engine in list(_OPEN):
        if engine.closed:
            continue
        with contextlib.suppress(Exception):
            if engine.loop.is_running():
                done = asyncio.run_coroutine_threadsafe(engine.close(at_exit=True), engine.loop)
                done.result(timeout)
            else:
                engine.shutdown()
