"""The seam between a vLLM-backed model and its workers: how a request's spec reaches every
worker and its rows come back.

`VLLMModel` talks to its workers only through a `Channel`. The hooked backend uses
`HookedChannel`: the spec rides with the request in vLLM's per-request `extra_args` (no RPC), and
the rows of requests that finish together come back in one `ie_drain` RPC. A backend with its own
worker class (ie-static) passes its own channel, as vLLM composes a worker extension with any
worker class, instead of renaming RPCs underneath the model.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Sequence
from typing import Any, Protocol

import torch

from ie_vllm import payload
from ie_vllm.host.engine import Engine
from ie_vllm.specs import RequestSpec
from ie_vllm.worker.layout import SPEC_ARG


class Channel(Protocol):
    """Attach, collect, release: a request's life in the workers, keyed by its request key."""

    async def attach(self, spec: RequestSpec) -> dict[str, str]:
        """Make `spec` reach every worker with its request, before it is submitted; returns the
        entries the request's `extra_args` must carry."""
        ...

    async def collect(self, key: str, start: int, stop: int, release: bool) -> dict[str, Any]:
        """Rows `[start, stop)` per captured address (tensors); `release` drops the key after."""
        ...

    async def finish(self, key: str, stop: int) -> dict[str, Any]:
        """Rows `[0, stop)` of a finished request (tensors), the key released after."""
        ...

    async def release(self, keys: Sequence[str]) -> None:
        """Drop keys in every worker (a key never registered is ignored)."""
        ...


class HookedChannel:
    """The worker extension (`ie_vllm.worker.extension.IEWorkerExtension`), called by name."""

    def __init__(self, engine: Engine) -> None:
        self.engine = engine
        self._drain = coalesced_drain(engine, "ie_drain")

    async def attach(self, spec: RequestSpec) -> dict[str, str]:
        return {SPEC_ARG: spec.to_json()}  # the worker registers it at the request's first step

    async def collect(self, key: str, start: int, stop: int, release: bool) -> dict[str, Any]:
        return await self.engine.rpc_payload("ie_collect", key, start, stop, release)

    async def finish(self, key: str, stop: int) -> dict[str, Any]:
        return await self._drain((key, stop))

    async def release(self, keys: Sequence[str]) -> None:
        await self.engine.rpc("ie_release", list(keys))


class Coalesced:
    """Calls made in the same turn of the event loop, sent as one batch.

    Requests that finish in the same engine step resume together; the first to ask schedules the
    batch, and the others join it before it is sent (one RPC instead of one per request)."""

    def __init__(self, send: Callable[[list[Any]], Awaitable[list[Any]]]) -> None:
        self._send = send
        self._pending: list[tuple[Any, asyncio.Future[Any]]] = []
        self._tasks: set[asyncio.Task[None]] = set()

    async def __call__(self, ask: Any) -> Any:
        loop = asyncio.get_running_loop()
        future: asyncio.Future[Any] = loop.create_future()
        self._pending.append((ask, future))
        if len(self._pending) == 1:
            task = loop.create_task(self._flush())
            self._tasks.add(task)  # held until done: a batch outlives a cancelled caller
            task.add_done_callback(self._tasks.discard)
        return await future

    async def _flush(self) -> None:
        for _ in range(2):  # let every request woken by the same step join
            await asyncio.sleep(0)
        batch, self._pending = self._pending, []
        try:
            results = await self._send([ask for ask, _ in batch])
        except BaseException as exc:
            for _, future in batch:
                if not future.done():
                    future.set_exception(exc)
            if not isinstance(exc, Exception):
                raise
            return
        for (_, future), result in zip(batch, results, strict=True):
            if future.done():
                continue
            if isinstance(result, Exception):  # this call's own failure, not the batch's
                future.set_exception(result)
            else:
                future.set_result(result)


def coalesced_drain(engine: Engine, method: str) -> Coalesced:
    """`finish` through a worker method that drains `[[key, stop], ...]` at once: its result per
    rank is `{"rows": payload named "key/address", "refused": {key: why}}` (ranks merged)."""

    async def send(asks: list[tuple[str, int]]) -> list[dict[str, torch.Tensor] | Exception]:
        keys = [key for key, _ in asks]
        out: dict[str, dict[str, torch.Tensor]] = {key: {} for key in keys}
        refused: dict[str, str] = {}
        for rank in await engine.rpc(method, [list(a) for a in asks]):
            refused.update(rank["refused"])
            for name, tensor in payload.decode(rank["rows"]).items():
                key, _, address = name.partition("/")
                out[key].setdefault(address, tensor)
        return [
            RuntimeError(f"the worker could not register request {key}: {refused[key]}")
            if key in refused
            else out[key]
            for key in keys
        ]

    return Coalesced(send)


__all__ = ["Channel", "Coalesced", "HookedChannel", "coalesced_drain"]
