"""One background event loop that runs the async API for synchronous callers.

A dedicated thread keeps the loop alive between calls, so an engine created on it (vLLM's
AsyncLLM binds to the loop it first runs on) stays usable from plain scripts and from Jupyter.
"""

from __future__ import annotations

import asyncio
import os
import threading
from collections.abc import AsyncIterator, Coroutine, Iterator
from typing import Any, TypeVar

T = TypeVar("T")

_lock = threading.Lock()
_loop: asyncio.AbstractEventLoop | None = None


def loop() -> asyncio.AbstractEventLoop:
    """The shared background loop, started on first use."""
    global _loop
    with _lock:
        if _loop is None or _loop.is_closed():
            _loop = asyncio.new_event_loop()
            thread = threading.Thread(target=_loop.run_forever, name="ie-core-loop", daemon=True)
            thread.start()
        return _loop


def _forget_loop_in_child() -> None:
    # A forked child has the parent's loop object but not its thread: waiting on it would hang
    # forever, so the child starts its own loop on first use.
    global _loop, _lock
    _loop = None
    _lock = threading.Lock()


os.register_at_fork(after_in_child=_forget_loop_in_child)


def run(coro: Coroutine[Any, Any, T]) -> T:
    """Run a coroutine on the background loop and wait for its result."""
    return asyncio.run_coroutine_threadsafe(coro, loop()).result()


def iterate(agen: AsyncIterator[T]) -> Iterator[T]:
    """Drive an async iterator from synchronous code, one item at a time."""
    while True:
        try:
            yield run(_anext(agen))
        except StopAsyncIteration:
            return


async def _anext(agen: AsyncIterator[T]) -> T:
    return await agen.__anext__()
