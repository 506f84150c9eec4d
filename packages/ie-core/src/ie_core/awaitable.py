"""Async model methods that cannot be misused silently.

`load_model` returns the async model: `cache = model.capture(...)` without `await` would hand back a
bare coroutine, and the mistake shows up later as an unrelated TypeError (or not at all, for
`generate`). `guard_async` makes each protocol coroutine a `Pending`: a real coroutine to asyncio
(`await`, `create_task`, `gather` and ie-core's runner accept it), whose use as a result raises
`NotAwaitedError` naming the two fixes, and which warns when dropped unawaited.
"""

from __future__ import annotations

import functools
import inspect
import warnings
from collections.abc import Callable, Coroutine, Generator
from typing import Any

from ie_core.errors import NotAwaitedError
from ie_core.protocol import InterpModel

# The protocol's coroutine methods, read from InterpModel so a new one is guarded without a line
# here (generate_stream is an async iterator; `for` on it already fails).
GUARDED = tuple(
    name for name, member in vars(InterpModel).items() if inspect.iscoroutinefunction(member)
)


def _advice(method: str) -> str:
    return (
        f"model.{method}(...) is a coroutine: the model from load_model is async. Write "
        f"`await model.{method}(...)` inside async code, or use the blocking twin: "
        f"`SyncModel(model).{method}(...)` (or the free functions, e.g. ie_core.run_with_cache)"
    )


class Pending(Coroutine[Any, Any, Any]):
    """One call of an async model method, not yet awaited."""

    def __init__(self, coro: Coroutine[Any, Any, Any], method: str) -> None:
        self._coro = coro
        self._method = method
        self._started = False

    def __await__(self) -> Generator[Any, None, Any]:
        self._started = True
        return self._coro.__await__()

    def send(self, value: Any) -> Any:
        self._started = True
        return self._coro.send(value)

    def throw(self, typ: Any, val: Any = None, tb: Any = None) -> Any:  # type: ignore[override]
        self._started = True
        return self._coro.throw(typ, val, tb) if val is not None else self._coro.throw(typ)

    def close(self) -> None:
        self._started = True
        self._coro.close()

    def __getattr__(self, name: str) -> Any:
        if name.startswith(("cr_", "__")):  # asyncio reads cr_frame / cr_code for its reprs
            return getattr(self._coro, name)
        raise NotAwaitedError(f"{_advice(self._method)} (you read .{name} of the coroutine)")

    def _refuse(self, *_: Any) -> Any:
        raise NotAwaitedError(_advice(self._method))

    __getitem__ = __iter__ = __len__ = __bool__ = __contains__ = _refuse

    def __repr__(self) -> str:
        return f"<Pending model.{self._method}(...): await it, or use SyncModel>"

    def __del__(self) -> None:
        if not self._started:
            self._coro.close()  # no second, vaguer "never awaited" warning from Python
            warnings.warn(_advice(self._method) + "; this call never ran", RuntimeWarning, 2)


def _guarded(method: Callable[..., Any], name: str) -> Callable[..., Pending]:
    @functools.wraps(method)
    def call(*args: Any, **kwargs: Any) -> Pending:
        return Pending(method(*args, **kwargs), name)

    return call


def guard_async(model: Any) -> Any:
    """`model` with each protocol coroutine method returning a `Pending` (on the instance)."""
    for name in GUARDED:
        method = getattr(model, name, None)
        if callable(method) and name not in vars(model):  # not yet guarded on this instance
            setattr(model, name, _guarded(method, name))
    return model
