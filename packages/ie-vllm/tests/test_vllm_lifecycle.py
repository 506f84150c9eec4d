"""Hooked vLLM under cancellation, concurrency, shutdown and a killed engine (ie-synthetic/llama).

One engine serves the module until the fault test kills it; that test loads a second one, which
the shutdown test then shuts down (two engine starts in all). Waits are bounded by `GUARD` so a
regression fails instead of hanging; the bound is a hang guard, not a performance claim.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from typing import Any

import psutil
import pytest
import torch
from ie_core import Additive, SamplingParams, steer_at
from ie_core.errors import EngineDeadError, EngineShutdownError, PromptTooLongError
from ie_core.runner import iterate, run
from vllm_support import requires_vllm, start, stop

pytestmark = [pytest.mark.slow, requires_vllm]

MODEL = "ie-synthetic/llama"
MAX_LEN = 512
GUARD = 20.0  # seconds: hang guard for shutdown, errors and cancellation clean-up
WITHIN = 1e-5  # vLLM against itself (interleaved vs alone)
SHORT = SamplingParams(max_new_tokens=6, stop_at_eos=False)
LONG = SamplingParams(max_new_tokens=MAX_LEN - 100, stop_at_eos=False)  # room for the prompt
POINTS = ["resid_post.1", "attn_out.2", "mlp_out.0"]
TIMINGS: dict[str, float] = {}


@pytest.fixture(scope="module")
def held() -> Iterator[dict[str, Any]]:
    slot = {"model": start(MODEL, max_model_len=MAX_LEN)}
    yield slot
    with contextlib.suppress(Exception):
        stop(slot["model"])
    if TIMINGS:
        print("\nlifecycle timings (s, under load):", TIMINGS)


@pytest.fixture
def model(held: dict[str, Any]) -> Any:
    if held["model"].engine.closed:
        held["model"] = start(MODEL, max_model_len=MAX_LEN)
    return held["model"]


def _ids(model: Any, i: int) -> list[int]:
    return model.to_tokens(f"request {i}: the quick brown fox jumps over {i * 7} lazy dogs")


def _steer(model: Any, i: int, scale: float = 8.0) -> Any:
    g = torch.Generator().manual_seed(100 + i)
    v = torch.randn(model.d_model, generator=g)
    return steer_at(f"resid_post.{i % model.n_layers}", Additive(v / v.norm(), scale))


def _clean(model: Any) -> dict[str, Any]:
    stats = run(model.stats())
    assert stats["registered"] == 0 and stats["hooks"] == {}, stats
    return stats


class _Spy:
    """Marks when the engine call `at` (an RPC name, or "stream" for a first output) is in flight."""

    def __init__(self, engine: Any, at: str) -> None:
        self.engine, self.at = engine, at
        self.hit = asyncio.Event()

    def __enter__(self) -> _Spy:
        rpc, stream = self.engine.rpc, self.engine.stream

        async def spy_rpc(method: str, *args: Any) -> list[Any]:
            if method == self.at:
                self.hit.set()
            return await rpc(method, *args)

        async def spy_stream(sub: Any) -> AsyncIterator[Any]:
            async for out in stream(sub):
                if self.at == "stream":
                    self.hit.set()
                yield out

        self.engine.rpc, self.engine.stream = spy_rpc, spy_stream
        return self

    def __exit__(self, *exc: object) -> None:
        del self.engine.rpc
        del self.engine.stream


async def _cancel_at(model: Any, at: str, make: Callable[[], Awaitable[Any]]) -> None:
    with _Spy(model.engine, at) as spy:
        task = asyncio.ensure_future(make())
        await asyncio.wait_for(spy.hit.wait(), GUARD)
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await asyncio.wait_for(task, GUARD)


async def _drain(agen: AsyncIterator[Any]) -> list[Any]:
    return [item async for item in agen]


def test_cancelled_requests_release_their_registration_and_hooks(model: Any) -> None:
    ids = _ids(model, 1)
    before = run(model.capture([ids], POINTS, steering=_steer(model, 1)))
    capture = lambda: model.capture([ids], POINTS, steering=_steer(model, 1))  # noqa: E731
    capture_gen = lambda: model.capture_generation(ids, POINTS, SHORT)  # noqa: E731
    steered = lambda: model.generate(ids, LONG, steering=_steer(model, 2))  # noqa: E731
    cap_stream = lambda: _drain(model.capture_generation_stream(ids, POINTS, LONG))  # noqa: E731
    gen_stream = lambda: _drain(model.generate_stream(ids, LONG, steering=_steer(model, 3)))  # noqa: E731
    cases = [  # no register phase: a request carries its spec to the workers
        *[("stream", make) for make in (capture, capture_gen, steered, cap_stream, gen_stream)],
        *[("ie_drain", make) for make in (capture, capture_gen)],
        ("ie_collect", cap_stream),
    ]
    for at, make in cases:
        run(_cancel_at(model, at, make))
        _clean(model)
    after = run(model.capture([ids], POINTS, steering=_steer(model, 1)))
    for a in POINTS:
        assert (after[a] - before[a]).abs().max() <= WITHIN, a


def test_interleaved_streams_captures_steering_and_cancels_equal_their_serial_runs(
    model: Any,
) -> None:
    jobs: list[Callable[[], Awaitable[Any]]] = []
    for i in range(4):
        ids, steer = _ids(model, i), _steer(model, i)
        jobs += [
            lambda ids=ids, steer=steer: _drain(model.generate_stream(ids, SHORT, steering=steer)),
            lambda ids=ids: _drain(model.capture_generation_stream(ids, POINTS, SHORT)),
            lambda ids=ids, steer=steer: model.capture([ids], POINTS, steering=steer),
            lambda ids=ids, steer=steer: model.capture_generation(
                ids, POINTS, SHORT, steering=steer
            ),
            lambda ids=ids: model.generate(ids, SHORT),
        ]
    doomed = [
        lambda i=i: model.capture([_ids(model, 10 + i)], POINTS, steering=_steer(model, i))
        for i in range(6)
    ] + [lambda: _drain(model.generate_stream(_ids(model, 20), LONG, steering=_steer(model, 0)))]

    async def together() -> list[Any]:
        kept = [asyncio.ensure_future(make()) for make in jobs]
        cancelled = [asyncio.ensure_future(make()) for make in doomed]
        for n, task in enumerate(cancelled):  # cancel at different phases of each request
            for _ in range(n * 3):
                await asyncio.sleep(0)
            task.cancel()
        await asyncio.gather(*cancelled, return_exceptions=True)
        return list(await asyncio.gather(*kept))

    mixed = run(together())
    _clean(model)
    for make, got in zip(jobs, mixed, strict=True):
        _assert_same(got, run(make()))
    # Negative control: steering changes what it touches, so equality above is meaningful.
    ids = _ids(model, 0)
    plain = run(model.capture([ids], POINTS))
    steered = run(model.capture([ids], POINTS, steering=_steer(model, 1)))
    assert (plain["resid_post.1"] - steered["resid_post.1"]).abs().max() > 1.0
    _clean(model)


def _assert_same(got: Any, want: Any) -> None:
    """Equal tokens and rows; stream items and captures are compared field by field."""
    if isinstance(got, list):
        assert len(got) == len(want)
        for g, w in zip(got, want, strict=True):
            _assert_same(g, w)
    elif isinstance(got, tuple):  # (StreamChunk, ActivationCache)
        assert got[0] == want[0]
        _assert_same(got[1], want[1])
    elif hasattr(got, "cache"):  # GenerationCapture
        assert got.generation.token_ids == want.generation.token_ids
        _assert_same(got.cache, want.cache)
    elif hasattr(got, "token_ids") or hasattr(got, "token_id"):  # Generation or StreamChunk
        assert got == want
    else:  # ActivationCache
        for a in POINTS:
            assert (got[a] - want[a]).abs().max() <= WITHIN, a


def test_prompt_plus_new_tokens_over_max_model_len_is_refused(model: Any) -> None:
    ids = [3 + i % 500 for i in range(MAX_LEN - 10)]
    over = SamplingParams(max_new_tokens=11, stop_at_eos=False)
    with pytest.raises(PromptTooLongError, match=str(MAX_LEN)):
        run(model.generate(ids, over))
    with pytest.raises(PromptTooLongError, match=str(MAX_LEN)):
        list(iterate(model.generate_stream(ids, over)))
    with pytest.raises(PromptTooLongError, match=str(MAX_LEN)):
        run(model.capture_generation(ids, POINTS, over))
    with pytest.raises(PromptTooLongError, match=str(MAX_LEN)):
        run(model.capture([[3] * MAX_LEN], POINTS))
    fits = run(model.generate(ids, SamplingParams(max_new_tokens=10, stop_at_eos=False)))
    assert len(fits.token_ids) == 10  # exactly max_model_len is served in full
    _clean(model)


def _engine_cores() -> list[psutil.Process]:
    """The engine-core processes this one started (one engine is alive in this module). Direct
    children only: an `ie serve` another test of this lane holds has its own, one level down."""
    out = []
    for p in psutil.Process().children():
        with contextlib.suppress(psutil.Error):
            if p.status() != psutil.STATUS_ZOMBIE and "EngineCore" in p.name() + " ".join(
                p.cmdline()
            ):
                out.append(p)
    return out


async def _first_chunk_then(model: Any, act: Callable[[], Any]) -> tuple[BaseException, float]:
    """Start a long stream; once a token arrives, `act`; return the stream's error and its delay."""
    got = asyncio.Event()

    async def consume() -> None:
        async for _ in model.generate_stream(_ids(model, 5), LONG):
            got.set()

    task = asyncio.ensure_future(consume())
    await asyncio.wait_for(got.wait(), GUARD)
    t0 = time.monotonic()
    acting = asyncio.ensure_future(act())
    try:
        await asyncio.wait_for(task, GUARD)
    except (Exception, asyncio.CancelledError) as error:
        waited = time.monotonic() - t0
        await asyncio.wait_for(acting, GUARD)
        return error, waited
    raise AssertionError("the stream finished normally; the request was not in flight")


def test_a_killed_engine_fails_the_request_with_a_named_error_and_a_new_model_loads(
    held: dict[str, Any], model: Any
) -> None:
    ids = _ids(model, 3)
    want = run(model.generate(ids, SHORT, steering=_steer(model, 3)))
    cores = _engine_cores()
    assert len(cores) == 1, cores
    core = cores[0]

    async def kill() -> None:
        os.kill(core.pid, signal.SIGKILL)

    error, waited = run(_first_chunk_then(model, kill))
    TIMINGS["kill_to_error"] = round(waited, 2)
    assert isinstance(error, EngineDeadError), repr(error)
    assert "load" in str(error)  # says what to do
    with pytest.raises(EngineDeadError):
        run(model.generate(ids, SHORT))
    run(asyncio.wait_for(model.shutdown(), GUARD))
    held["model"] = fresh = start(MODEL, max_model_len=MAX_LEN)
    assert run(fresh.generate(ids, SHORT, steering=_steer(fresh, 3))) == want
    _clean(fresh)


def test_shutdown_fails_the_request_in_flight_and_returns(held: dict[str, Any], model: Any) -> None:
    t0 = time.monotonic()
    error, waited = run(_first_chunk_then(model, model.shutdown))
    TIMINGS["shutdown_to_error"] = round(waited, 2)
    TIMINGS["shutdown_total"] = round(time.monotonic() - t0, 2)
    assert isinstance(error, EngineShutdownError), repr(error)
    with pytest.raises(EngineShutdownError):
        run(model.generate(_ids(model, 1), SHORT))
    assert _engine_cores() == []
