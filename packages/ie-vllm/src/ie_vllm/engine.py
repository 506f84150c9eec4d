"""Host side of the engine: start vLLM's AsyncLLM, call worker methods by name, submit requests.

`Engine` knows nothing about points; it is the transport the backends (and ie-static) build on.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import time
import uuid
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass
from typing import Any

import psutil

from ie_vllm import payload
from ie_vllm.layout import KEY_ARG

WORKER_EXTENSION = "ie_vllm.worker.IEWorkerExtension"
DEFAULT_CPU_KVCACHE_GIB = "1"


def on_cpu() -> bool:
    from vllm.platforms import current_platform

    return bool(current_platform.is_cpu())


def prepare_environment() -> None:
    """Defaults that let the CPU engine start: a bounded KV cache (the default fraction fails)."""
    if on_cpu():
        os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", DEFAULT_CPU_KVCACHE_GIB)


def engine_kwargs(model: str, *, hooked: bool, extension: str | None, **kw: Any) -> dict[str, Any]:
    """AsyncEngineArgs fields: hooked engines run eagerly; user kwargs win over our defaults."""
    args: dict[str, Any] = {"model": model, "disable_log_stats": True}
    if on_cpu():
        args["dtype"] = "float32"
    if hooked:
        args["enforce_eager"] = True
    if extension:
        args["worker_extension_cls"] = extension
    args.update(kw)
    return args


def new_key(prefix: str = "ie") -> str:
    return f"{prefix}-{uuid.uuid4().hex}"


@dataclass(frozen=True)
class Submission:
    """One request: token ids, vLLM sampling params, our key (None = untracked), cache salt."""

    prompt_ids: tuple[int, ...]
    params: Any  # vllm.SamplingParams
    key: str
    salt: str | None = None


class Engine:
    """An AsyncLLM plus the worker-extension calls; create with `await Engine.start(...)`."""

    def __init__(self, llm: Any, children: Sequence[int]) -> None:
        self.llm = llm
        self._children = list(children)
        self.loop = asyncio.get_running_loop()
        self.closed = False

    @classmethod
    async def start(
        cls, model: str, *, hooked: bool, extension: str | None = WORKER_EXTENSION, **kw: Any
    ) -> Engine:
        prepare_environment()
        from vllm.engine.arg_utils import AsyncEngineArgs
        from vllm.v1.engine.async_llm import AsyncLLM

        args = AsyncEngineArgs(**engine_kwargs(model, hooked=hooked, extension=extension, **kw))
        before = {p.pid for p in psutil.Process().children(recursive=True)}
        llm = AsyncLLM.from_engine_args(args)
        after = [p.pid for p in psutil.Process().children(recursive=True)]
        return cls(llm, [pid for pid in after if pid not in before])

    # --- worker calls ------------------------------------------------------------------------

    async def rpc(self, method: str, *args: Any) -> list[Any]:
        """Call `method` on every worker; one result per rank."""
        return list(await self.llm.collective_rpc(method, args=tuple(args)))

    async def rpc_payload(self, method: str, *args: Any) -> dict[str, Any]:
        """Call a method returning payloads; merge ranks (pipeline stages hold different layers)."""
        merged: dict[str, Any] = {}
        for result in await self.rpc(method, *args):
            for name, tensor in payload.decode(result).items():
                merged.setdefault(name, tensor)
        return merged

    # --- requests ----------------------------------------------------------------------------

    def sampling_params(self, key: str, **kw: Any) -> Any:
        from vllm import SamplingParams

        return SamplingParams(extra_args={KEY_ARG: key}, **kw)

    async def stream(self, sub: Submission) -> AsyncIterator[Any]:
        """RequestOutputs of one request as they arrive (cumulative token ids)."""
        prompt: dict[str, Any] = {"prompt_token_ids": list(sub.prompt_ids)}
        if sub.salt is not None:
            prompt["cache_salt"] = sub.salt
        gen = self.llm.generate(prompt, sub.params, request_id=sub.key)
        try:
            async for out in gen:
                yield out
        finally:
            with contextlib.suppress(Exception):
                await gen.aclose()

    # --- lifecycle ---------------------------------------------------------------------------

    def shutdown(self, timeout: float = 30.0) -> list[int]:
        """Stop the engine and reap its processes; returns pids still alive (should be empty)."""
        if self.closed:
            return []
        self.closed = True
        with contextlib.suppress(Exception):
            self.llm.shutdown()
        return reap(self._children, timeout)


def reap(pids: Sequence[int], timeout: float) -> list[int]:
    """Wait for the engine's processes to exit; terminate (then kill) the ones that linger."""
    procs = []
    for pid in pids:
        with contextlib.suppress(psutil.NoSuchProcess):
            procs.append(psutil.Process(pid))
    deadline = time.monotonic() + timeout
    _, alive = psutil.wait_procs(procs, timeout=max(0.0, deadline - time.monotonic()))
    for p in alive:
        with contextlib.suppress(psutil.NoSuchProcess):
            p.terminate()
    _, alive = psutil.wait_procs(alive, timeout=5)
    for p in alive:
        with contextlib.suppress(psutil.NoSuchProcess):
            p.kill()
    _, alive = psutil.wait_procs(alive, timeout=5)
    return [p.pid for p in alive]
