"""One request on the engine: attach its captures and steering (they ride with the request to
the workers), submit it, collect its rows, release it (shielded, so a cancelled caller leaves
nothing behind).

`VLLMModel` validates and shapes; this module only moves a request through the engine, on the
engine's own loop (`Flow.on_engine`), from whichever loop the caller awaits on.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable, Coroutine, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

import torch
from ie_core.cache import ActivationCache
from ie_core.errors import EngineStoppedError
from ie_core.protocol import SamplingParams, StreamChunk
from ie_core.text_stream import TextStream

from ie_vllm.host import logprobs as lp
from ie_vllm.host.channel import Channel
from ie_vllm.host.engine import Engine, Submission, new_key
from ie_vllm.specs import ReducerSpec, RequestSpec, SteerSpec

T = TypeVar("T")

# Releases in flight: a shielded release outlives its cancelled caller, so keep a reference.
_RELEASING: set[asyncio.Task[None]] = set()


@dataclass(frozen=True)
class Flow:
    """The engine and the channel to its workers, plus how to build vLLM's sampling params and
    decode text: everything a request needs once the model has checked its arguments."""

    engine: Engine
    channel: Channel
    params: Callable[[str, SamplingParams], Any]  # (key, sampling) -> vllm.SamplingParams
    text: Callable[[Sequence[int]], str]
    # The LoRARequest of a request without an adapter (`ie_vllm.host.lora`: None but on CPU).
    base_lora: Callable[[], Any] = lambda: None

    async def on_engine(self, coro: Coroutine[Any, Any, T]) -> T:
        """Run on the engine's loop (AsyncLLM is bound to it), from whichever loop awaits us."""
        try:
            self.engine.check_alive()
        except EngineStoppedError:
            coro.close()
            raise
        if asyncio.get_running_loop() is self.engine.loop:
            return await coro
        future = asyncio.run_coroutine_threadsafe(coro, self.engine.loop)
        return await asyncio.wrap_future(future)

    def bridge(self, agen: AsyncIterator[T]) -> AsyncIterator[T]:
        """An async iterator living on the engine loop, driven from the caller's loop."""
        return _bridge(agen, self.engine.loop, self.on_engine)

    async def submission(
        self,
        ids: tuple[int, ...],
        sampling: SamplingParams,
        spec: RequestSpec | None,
        lora: Any = None,
    ) -> Submission:
        """The request, carrying `spec` (None: untracked) to every worker, under vLLM's
        `LoRARequest` `lora` (None: the base model); call inside the try whose finally runs
        `release`."""
        key = spec.key if spec is not None else new_key()
        params = self.params(key, sampling)
        if spec is not None:
            params.extra_args.update(await self.channel.attach(spec))
        chosen = lora if lora is not None else self.base_lora()
        return Submission(ids, params, key, key if spec is not None else None, chosen)

    async def release(self, key: str) -> None:
        """Release a key in every worker, even while the caller is being cancelled.

        Shielded, so a cancel during the release cannot leave the entry and its hooks behind;
        a registration still in flight when the caller was cancelled reaches the worker first
        (one ordered channel), so this release drops it. A stopped engine has nothing to release.
        """
        task = asyncio.ensure_future(self._release_now(key))
        _RELEASING.add(task)
        task.add_done_callback(_RELEASING.discard)
        await asyncio.shield(task)

    async def _release_now(self, key: str) -> None:
        with contextlib.suppress(EngineStoppedError):
            await self.channel.release([key])

    async def run(
        self,
        prompt_ids: tuple[int, ...],
        sampling: SamplingParams,
        captures: tuple[str, ...],
        steer: tuple[SteerSpec, ...],
        outputs: list[Any] | None = None,
        reducers: tuple[ReducerSpec, ...] = (),
        lora: Any = None,
    ) -> tuple[tuple[int, ...], dict[str, torch.Tensor]]:
        """Attach, submit, wait, collect. Returns generated ids and rows per captured address
        (and `label|output` per reducer); the last CompletionOutput goes to `outputs` when given
        (per-step logprobs)."""
        tracked = bool(captures or steer or reducers)
        key = new_key()
        spec = RequestSpec(key, captures, steer, len(prompt_ids), reducers) if tracked else None
        token_ids: tuple[int, ...] = ()
        try:
            sub = await self.submission(prompt_ids, sampling, spec, lora)
            async for out in self.engine.stream(sub):
                token_ids = tuple(out.outputs[0].token_ids)
                if outputs is not None:
                    outputs[:] = [out.outputs[0]]
            rows: dict[str, torch.Tensor] = {}
            if tracked:
                # Rows of the positions the request fed: a stop string found after the engine
                # ran one more step leaves a row past them in the worker.
                rows = await self.channel.finish(key, len(prompt_ids) + len(token_ids) - 1)
                tracked = False
            return token_ids, rows
        finally:
            if tracked:
                await self.release(key)

    async def stream_steps(
        self,
        ids: tuple[int, ...],
        sampling: SamplingParams,
        captures: tuple[str, ...],
        steer: tuple[SteerSpec, ...],
        collect: Callable[[str, int, int], Awaitable[T]],
        reducers: tuple[ReducerSpec, ...] = (),
    ) -> AsyncIterator[tuple[StreamChunk, T]]:
        """Each generated token with `collect(key, start, stop)` of the positions computed since
        the previous one (the worker keeps the request registered until the stream ends)."""
        key = new_key()
        have = 0
        seen = 0
        text = TextStream(self.text)
        try:
            spec = RequestSpec(key, captures, steer, len(ids), reducers)
            sub = await self.submission(ids, sampling, spec)
            async for out in self.engine.stream(sub):
                for tok in list(out.outputs[0].token_ids)[seen:]:
                    seen += 1
                    stop = len(ids) + seen - 1
                    got = await collect(key, have, stop)
                    have = stop
                    chunk = StreamChunk(tok, text.push(tok), step_logprobs(out, sampling, seen))
                    yield chunk, got
        finally:
            await self.release(key)

    def stream_capture(
        self,
        ids: tuple[int, ...],
        sampling: SamplingParams,
        captures: tuple[str, ...],
        steer: tuple[SteerSpec, ...],
    ) -> AsyncIterator[tuple[StreamChunk, ActivationCache]]:
        """Each generated token with the rows computed since the previous one."""

        async def rows(key: str, start: int, stop: int) -> ActivationCache:
            got = await self.channel.collect(key, start, stop, False)
            return ActivationCache({a: got[a].unsqueeze(0) for a in captures})

        return self.stream_steps(ids, sampling, captures, steer, rows)

    async def stream_tokens(
        self,
        ids: tuple[int, ...],
        sampling: SamplingParams,
        steer: tuple[SteerSpec, ...],
        lora: Any = None,
    ) -> AsyncIterator[StreamChunk]:
        """Each generated token; registered in the workers only when steered."""
        key = new_key()
        seen = 0
        text = TextStream(self.text)
        try:
            spec = RequestSpec(key, (), steer, len(ids)) if steer else None
            sub = await self.submission(ids, sampling, spec, lora)
            async for out in self.engine.stream(sub):
                for tok in list(out.outputs[0].token_ids)[seen:]:
                    seen += 1
                    yield StreamChunk(tok, text.push(tok), step_logprobs(out, sampling, seen))
        finally:
            if steer:
                await self.release(key)


def step_logprobs(out: Any, sampling: SamplingParams, seen: int) -> Any:
    """The logprobs of generated token `seen - 1` when asked for (cumulative outputs)."""
    if sampling.logprobs is None:
        return None
    completion = out.outputs[0]
    return lp.step(completion.logprobs[seen - 1], completion.token_ids[seen - 1], sampling.logprobs)


async def gather(*coros: Awaitable[T]) -> list[T]:
    return list(await asyncio.gather(*coros))


async def _bridge(
    agen: AsyncIterator[T],
    engine_loop: asyncio.AbstractEventLoop,
    on_engine: Callable[[Coroutine[Any, Any, Any]], Awaitable[Any]],
) -> AsyncIterator[T]:
    if asyncio.get_running_loop() is engine_loop:
        async for item in agen:
            yield item
        return

    async def step() -> tuple[bool, T | None]:
        try:
            return True, await agen.__anext__()
        except StopAsyncIteration:
            return False, None

    try:
        while True:
            ok, item = await on_engine(step())
            if not ok:
                return
            yield item  # type: ignore[misc]
    finally:
        await on_engine(agen.aclose())  # type: ignore[attr-defined]


__all__ = ["Flow", "gather", "step_logprobs"]
