"""`StaticChannel`: ie-vllm's `Channel` onto the static worker, with a parameter slot per steered
request.

A steered request's ops live in one slot of the engine's write tables (sized at load), so the host
hands out slots here; more steered requests than slots wait their turn. Unsteered requests take
no slot (-1).
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import Any

from ie_vllm import Engine, RequestSpec


class StaticChannel:
    """Register / collect / release on `ie_static.worker.StaticWorkerMixin`, slots assigned."""

    def __init__(self, engine: Engine, slots: int) -> None:
        self.engine = engine
        self._n_slots = slots
        self._free = list(range(slots))
        self._held: dict[str, int] = {}
        self._available: asyncio.Semaphore | None = None

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
        """Registered by RPC before submission: the slot's tables are filled between steps."""
        await self.register([spec])
        return {}

    async def register(self, specs: Sequence[RequestSpec]) -> None:
        slots = [await self._acquire(s.key) if s.steering else -1 for s in specs]
        # On failure or cancel the slots stay held: the worker may still register them, and
        # the caller's `release` (always sent after a register) frees them after it.
        await self.engine.rpc("ie_static_register", [s.to_wire() for s in specs], slots)

    async def collect(self, key: str, start: int, stop: int, release: bool) -> dict[str, Any]:
        rows = await self.engine.rpc_payload("ie_static_collect", key, start, stop, release)
        if release:  # on failure the caller's `release` frees the slot
            self._free_slot(key)
        return rows

    async def finish(self, key: str, stop: int) -> dict[str, Any]:
        return await self.collect(key, 0, stop, True)

    async def release(self, keys: Sequence[str]) -> None:
        try:
            await self.engine.rpc("ie_static_release", list(keys))
        finally:
            for key in keys:
                self._free_slot(key)


__all__ = ["StaticChannel"]
