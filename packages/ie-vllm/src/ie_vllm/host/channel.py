"""The seam between a vLLM-backed model and its workers: how a request's spec reaches every
worker and its rows come back.

`VLLMModel` talks to its workers only through a `Channel`. The hooked backend uses
`HookedChannel` (the worker extension's `ie_register` / `ie_collect` / `ie_release`); a backend
with its own worker class (ie-static) passes its own channel, as vLLM composes a worker extension
with any worker class, instead of renaming RPCs underneath the model.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Protocol

from ie_vllm.host.engine import Engine
from ie_vllm.specs import RequestSpec


class Channel(Protocol):
    """Register, collect, release: a request's life in the workers, keyed by its request key."""

    async def register(self, specs: Sequence[RequestSpec]) -> None:
        """Register specs in every worker before their requests are submitted."""
        ...

    async def collect(self, key: str, start: int, stop: int, release: bool) -> dict[str, Any]:
        """Rows `[start, stop)` per captured address (tensors); `release` drops the key after."""
        ...

    async def release(self, keys: Sequence[str]) -> None:
        """Drop keys in every worker (a key never registered is ignored)."""
        ...


class HookedChannel:
    """The worker extension's registry (`ie_vllm.worker.extension.IEWorkerExtension`), called by name."""

    def __init__(self, engine: Engine) -> None:
        self.engine = engine

    async def register(self, specs: Sequence[RequestSpec]) -> None:
        await self.engine.rpc("ie_register", [s.to_wire() for s in specs])

    async def collect(self, key: str, start: int, stop: int, release: bool) -> dict[str, Any]:
        return await self.engine.rpc_payload("ie_collect", key, start, stop, release)

    async def release(self, keys: Sequence[str]) -> None:
        await self.engine.rpc("ie_release", list(keys))


__all__ = ["Channel", "HookedChannel"]
