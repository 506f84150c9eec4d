"""Engine and request lifecycle against a scripted stand-in for AsyncLLM (no engine is started).

The stand-in keeps what matters for cancellation and shutdown: worker calls travel one ordered
channel and run to completion even when the caller is cancelled (as a sent ZMQ message does), a
request's carried spec is registered at its first step (never after its key was released), and a
stopped vLLM leaves pending calls and streams waiting forever. The real-engine versions of these
checks are in test_vllm_lifecycle.py.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator, Awaitable, Callable
from types import SimpleNamespace
from typing import Any

import pytest
import torch
from ie_core import Additive, SamplingParams, steer_at
from ie_core.errors import (
    EngineDeadError,
    EngineShutdownError,
    PromptTooLongError,
    SteeringSpecError,
)
from ie_vllm import payload
from ie_vllm.worker.layout import SPEC_ARG
from vllm_support import requires_vllm

pytestmark = requires_vllm

GUARD = 10.0  # seconds; a hang guard only
STEP = 0.005  # seconds per scripted worker call / generated token


class _FakeLLM:
    """Worker calls are served in order by one loop; `hang` makes new calls and streams wait."""

    def __init__(self, dtype: torch.dtype = torch.float32) -> None:
        self.model_config = SimpleNamespace(max_model_len=16, dtype=dtype)
        self.errored = False
        self.hang = False
        self.registry: dict[str, list[str]] = {}  # key -> captured addresses
        self.retired: set[str] = set()  # released keys: never registered again
        self.shut_down = False
        self.calls: asyncio.Queue[tuple[str, tuple[Any, ...], asyncio.Future[Any]]] = (
            asyncio.Queue()
        )
        self.server = asyncio.ensure_future(self._serve())

    async def _serve(self) -> None:
        while True:
            method, args, result = await self.calls.get()
            await asyncio.sleep(STEP)
            if self.hang:
                continue  # never answered, like a call pending on a stopped vLLM
            value: Any = len(self.registry)
            if method == "ie_release":
                for key in args[0]:
                    self._retire(key)
            elif method == "ie_collect":
                key, start, stop, release = args
                rows = {a: torch.zeros(stop - start, 4) for a in self.registry.get(key, ())}
                if release:
                    self._retire(key)
                value = payload.encode(rows)
            elif method == "ie_drain":
                drained = {}
                for key, stop in args[0]:
                    drained.update(
                        {f"{key}/{a}": torch.zeros(stop, 4) for a in self.registry.get(key, ())}
                    )
                    self._retire(key)
                value = {"rows": payload.encode(drained), "refused": {}}
            elif method == "ie_stats":
                value = {"registered": len(self.registry)}
            if not result.done():
                result.set_result(value)

    def _retire(self, key: str) -> None:
        self.registry.pop(key, None)
        self.retired.add(key)

    async def collective_rpc(self, method: str, args: tuple[Any, ...]) -> list[Any]:
        result: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        self.calls.put_nowait((method, args, result))  # sent: runs even if we are cancelled
        return [await asyncio.shield(result)]

    async def generate(
        self, prompt: Any, params: Any, request_id: str, lora_request: Any = None
    ) -> AsyncIterator[Any]:
        tokens: list[int] = []
        carried = (params.extra_args or {}).get(SPEC_ARG)
        for i in range(params.max_tokens):
            await asyncio.sleep(STEP)
            while self.hang:
                await asyncio.sleep(3600)
            if i == 0 and carried is not None and request_id not in self.retired:
                # As the worker does at the request's first forward.
                self.registry[request_id] = json.loads(carried)["captures"]
            tokens.append(5 + i)
            yield SimpleNamespace(outputs=[SimpleNamespace(token_ids=list(tokens))])

    def shutdown(self, timeout: float | None = None) -> None:  # AsyncLLM.shutdown, from a thread
        self.shut_down = True
        self.server.get_loop().call_soon_threadsafe(self.server.cancel)


class _Tok:
    all_special_ids = (0,)
    bos_token_id = 0

    def __len__(self) -> int:
        return 100

    def decode(self, ids: Any, **_: Any) -> str:
        return " ".join(map(str, ids))


def _model(dtype: torch.dtype = torch.float32) -> Any:
    from ie_vllm.host.backend import VLLMModel
    from ie_vllm.host.engine import Engine

    info = {
        "n_layers": 2,
        "d_model": 4,
        "widths": {"resid_post.0": 4, "resid_post.1": 4},
        "writable": ["resid_post.0", "resid_post.1"],
        "vocab_size": 100,
        "architecture": "Fake",
    }
    return VLLMModel(Engine(_FakeLLM(dtype), []), info, _Tok(), "fake", "vllm")


STEER = steer_at("resid_post.1", Additive((1.0, 0.0, 0.0, 0.0)))
SHORT = SamplingParams(max_new_tokens=3, stop_at_eos=False)
LONG = SamplingParams(max_new_tokens=12, stop_at_eos=False)


async def _drain(agen: AsyncIterator[Any]) -> list[Any]:
    return [item async for item in agen]


async def _cancel_when(llm: _FakeLLM, at: str, make: Callable[[], Awaitable[Any]]) -> None:
    """Cancel `make()` once the worker call `at` is queued (or, for "stream", after 2 steps)."""
    task = asyncio.ensure_future(make())
    if at == "stream":
        await asyncio.sleep(2.5 * STEP)
    else:
        while not any(m == at for m, _, _ in llm.calls._queue):  # type: ignore[attr-defined]
            await asyncio.sleep(0)
    task.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await asyncio.wait_for(task, GUARD)


def test_a_request_cancelled_at_any_step_leaves_no_registration() -> None:
    for at in ("stream", "ie_drain", "ie_collect"):
        asyncio.run(_cancel_each_request_at(at))


async def _cancel_each_request_at(at: str) -> None:
    model = _model()
    llm = model.engine.llm
    finished = [  # collected by the coalesced drain
        lambda: model.capture([[1, 2, 3]], ["resid_post.0"], steering=STEER),
        lambda: model.capture_generation([1, 2, 3], ["resid_post.0"], LONG),
    ]
    streamed = [lambda: _drain(model.capture_generation_stream([1, 2], ["resid_post.0"], LONG))]
    makes: list[Callable[[], Awaitable[Any]]] = {
        "ie_drain": finished,
        "ie_collect": streamed,
    }.get(at, finished + streamed)
    if at == "stream":  # a steered generate collects nothing
        makes += [
            lambda: model.generate([1, 2, 3], LONG, steering=STEER),
            lambda: _drain(model.generate_stream([1, 2], LONG, steering=STEER)),
        ]
    for make in makes:
        await _cancel_when(llm, at, make)
        await asyncio.sleep(10 * STEP)  # calls already sent are served
        assert llm.registry == {}
    got = await model.capture_generation([1, 2, 3], ["resid_post.0"], SHORT)
    assert got.generation.token_ids == (5, 6, 7)
    await model.shutdown()


def test_shutdown_fails_calls_and_streams_in_flight_with_a_named_error() -> None:
    async def scenario() -> None:
        model = _model()
        llm = model.engine.llm
        chunks: list[Any] = []

        async def consume() -> None:
            async for chunk in model.generate_stream([1, 2], LONG):
                chunks.append(chunk)
                llm.hang = True  # from now on vLLM answers nothing, as after its shutdown

        stream = asyncio.ensure_future(consume())
        while not chunks:
            if stream.done():  # the stream failed before its first token: say why, never spin
                stream.result()
            await asyncio.sleep(0)
        call = asyncio.ensure_future(model.stats())
        await asyncio.sleep(5 * STEP)
        await asyncio.wait_for(model.shutdown(), GUARD)
        for task in (stream, call):
            with pytest.raises(EngineShutdownError, match="load the model again"):
                await asyncio.wait_for(task, GUARD)
        assert llm.shut_down
        with pytest.raises(EngineShutdownError):
            await model.generate([1, 2], SHORT)

    asyncio.run(scenario())


def test_a_dead_engine_fails_pending_calls_with_a_named_error() -> None:
    async def scenario() -> None:
        model = _model()
        llm = model.engine.llm
        llm.hang = True
        call = asyncio.ensure_future(model.stats())
        await asyncio.sleep(5 * STEP)
        llm.errored = True  # vLLM's monitor saw the engine core die
        with pytest.raises(EngineDeadError, match="load the model again"):
            await asyncio.wait_for(call, GUARD)
        with pytest.raises(EngineDeadError):
            await model.generate([1, 2], SHORT)
        await asyncio.wait_for(model.shutdown(), GUARD)

    asyncio.run(scenario())


def test_prompt_plus_new_tokens_over_max_model_len_is_refused_before_the_engine() -> None:
    async def scenario() -> None:
        model = _model()  # max_model_len=16
        with pytest.raises(PromptTooLongError, match="max_model_len=16"):
            await model.generate(list(range(1, 14)), SamplingParams(max_new_tokens=4))
        with pytest.raises(PromptTooLongError, match="at most 3 new tokens"):
            await _drain(
                model.generate_stream(list(range(1, 14)), SamplingParams(max_new_tokens=4))
            )
        with pytest.raises(PromptTooLongError):
            await model.capture([list(range(1, 17))], ["resid_post.0"])
        fits = await model.generate(list(range(1, 14)), SamplingParams(max_new_tokens=3))
        assert len(fits.token_ids) == 3
        await model.shutdown()

    asyncio.run(scenario())


def test_steering_beyond_the_engines_dtype_is_refused_as_on_eager() -> None:
    """vLLM admits steering with eager's dtype check: a delta past float16's max would write inf."""
    big = steer_at("resid_post.1", Additive((7e4, 0.0, 0.0, 0.0)))

    async def scenario() -> None:
        half = _model(torch.float16)
        with pytest.raises(SteeringSpecError) as err:
            await half.generate([1, 2, 3], SHORT, steering=big)
        assert str(err.value).startswith(
            "resid_post.1: additive delta reaches 70000, beyond the torch.float16 max 65504"
        )
        assert half.engine.llm.registry == {}  # refused before any worker call
        await half.shutdown()
        full = _model(torch.float32)  # negative control: the same spec fits float32
        assert len((await full.generate([1, 2, 3], SHORT, steering=big)).token_ids) == 3
        await full.shutdown()

    asyncio.run(scenario())
