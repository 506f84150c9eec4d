"""`StaticChannel`: ie-vllm's `Channel` onto the static worker, with a parameter slot per steered
request.

A steered request's ops live in one slot of the engine's write tables (sized at load), so the host
hands out slots here; more steered requests than slots wait their turn. Unsteered requests take
no slot (-1). The spec and its slot ride with the request in its `extra_args`; each worker
fills the slot at the request's first forward.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import Any

from ie_core.wire import SLOT_XARG, SPEC_XARG
from ie_vllm import Engine, RequestSpec, coalesced_drain


class StaticChannel:
    """Attach / collect / drain / release on `ie_static.worker.StaticWorkerMixin`, slots
    assigned."""

    def __init__(self, engine: Engine, slots: int) -> None:
        self.engine = engine
        self._n_slots = slots
        self._free = list(range(slots))
        self._held: dict[str, int] = {}
        self._available: asyncio.Semaphore | None = None
        self._drain = coalesced_drain(engine, "ie_static_drain")

    async def _acquire(self, key: str) -> int:
        if self._available is None:
            self._available = asyncio.Semaphore(self._n_slots)
        await self._available.acquire()  # more steered requests than slots wait their turn
        slot = self._free.pop()
        self._held[key] = slot
        return slot

    def _free_slot(self, key: str) -> None:
        slot = self._held.pop(key, None)
        if slot is not None and self._available is not None:
            self._free.append(slot)
            self._available.release()

    async def attach(self, spec: RequestSpec) -> dict[str, str]:
        # On failure or cancel the slot stays held: the worker may still take it, and the
        # caller's `release` (always sent after an attach) frees it after the worker let it go.
        slot = await self._acquire(spec.key) if spec.steering else -1
        return {SPEC_XARG: spec.to_json(), SLOT_XARG: str(slot)}

    async def collect(self, key: str, start: int, stop: int, release: bool) -> dict[str, Any]:
        rows = await self.engine.rpc_payload("ie_static_collect", key, start, stop, release)
        if release:  # on failure the caller's `release` frees the slot
            self._free_slot(key)
        return rows

    async def finish(self, key: str, stop: int) -> dict[str, Any]:
        rows = await self._drain((key, stop))  # the worker released the key and its slot
        self._free_slot(key)
        return rows

    async def release(self, keys: Sequence[str]) -> None:
        try:
            await self.engine.rpc("ie_static_release", list(keys))
        finally:
            for key in keys:
                self._free_slot(key)


__all__ = ["StaticChannel"]
