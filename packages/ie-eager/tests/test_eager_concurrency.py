"""Requests interleaved on one event loop (or run from another thread) see only their own hooks.

A stream is suspended between tokens; whatever runs meanwhile (another stream, a capture, a
generate, a cancellation) must give exactly what it gives alone. Each check has a negative
control: the interleaving really happened, and the steering in play really changes the result.
"""

from __future__ import annotations

import asyncio
import threading

import torch
from eager_support import PROMPT, synthetic_model
from ie_core.ops import Additive, Orthogonal, steer_at
from ie_core.protocol import SamplingParams
from ie_eager.backend import EagerModel
from ie_eager.hooks import Session

READ = "resid_post.3"
TOL = 1e-5  # fp32 CPU, one backend


def _model() -> EagerModel:
    return synthetic_model("llama")


def _vector(model: EagerModel, seed: int) -> list[float]:
    g = torch.Generator().manual_seed(seed)
    return torch.randn(model.d_model, generator=g).tolist()


def _specs(model: EagerModel) -> tuple:
    strong = steer_at("resid_post.1", Additive(_vector(model, 1), 12.0))
    other = steer_at(
        "resid_pre.2", Orthogonal(_vector(model, 2), 0.0), Additive(_vector(model, 3), 6.0)
    )
    return strong, other


def _hook_count(model: EagerModel) -> int:
    """Hooks of this project on the model. transformers installs output recorders of its own on
    the first forward that asks for attentions or hidden states, and keeps them; not counted."""
    return sum(
        getattr(hook, "__module__", "").startswith("ie_eager")
        for m in model.hf_model.modules()
        for hook in (*m._forward_hooks.values(), *m._forward_pre_hooks.values())
    )


def _max_abs(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a - b).abs().max())


def test_a_suspended_steered_stream_does_not_steer_other_requests() -> None:
    model = _model()
    ids = model.to_tokens(PROMPT)
    strong, _ = _specs(model)
    params = SamplingParams(max_new_tokens=6, stop_at_eos=False)

    async def scenario():
        alone = (await model.capture(ids, [READ]))[READ]
        plain_alone = (await model.generate(ids, params)).token_ids
        steered = model.generate_stream(ids, params, steering=strong)
        first = await anext(steered)  # suspended mid-stream, holding its steering spec
        hooks_while_suspended = _hook_count(model)
        during = (await model.capture(ids, [READ]))[READ]
        plain = model.generate_stream(ids, params)
        plain_tokens = []
        steered_tokens = [first.token_id]
        async for a, b in _zip(plain, steered):  # the two streams alternate token by token
            plain_tokens.append(a.token_id)
            if b is not None:
                steered_tokens.append(b.token_id)
        steered_alone = (await model.generate(ids, params, steering=strong)).token_ids
        steered_capture = (await model.capture(ids, [READ], steering=strong))[READ]
        return (
            alone,
            during,
            plain_alone,
            tuple(plain_tokens),
            steered_alone,
            tuple(steered_tokens),
            steered_capture,
            hooks_while_suspended,
        )

    (
        alone,
        during,
        plain_alone,
        plain_tokens,
        steered_alone,
        steered_tokens,
        steered_capture,
        hooks,
    ) = asyncio.run(scenario())
    assert _max_abs(during, alone) <= TOL
    assert plain_tokens == plain_alone
    assert steered_tokens == steered_alone
    assert hooks == 0, "a suspended stream left hooks installed"
    # Negative controls: the steering changes both the activations and the tokens.
    assert _max_abs(steered_capture, alone) > 1.0
    assert steered_alone != plain_alone


async def _zip(a, b):
    """Alternate two async iterators; yields (item of a, item of b or None once b is done)."""
    b_done = False
    async for x in a:
        y = None
        if not b_done:
            try:
                y = await anext(b)
            except StopAsyncIteration:
                b_done = True
        yield x, y


def test_interleaved_streams_captures_steering_and_cancellations_equal_their_serial_runs() -> None:
    model = _model()
    ids = model.to_tokens(PROMPT)
    other_ids = list(reversed(ids))
    strong, other = _specs(model)
    p6 = SamplingParams(max_new_tokens=6, stop_at_eos=False)
    sampled = SamplingParams(max_new_tokens=6, temperature=0.8, top_k=20, seed=7, stop_at_eos=False)
    log: list[str] = []

    async def stream(name, prompt, params, steering=None, stop_after=None):
        tokens = []
        async for chunk in model.generate_stream(prompt, params, steering=steering):
            tokens.append(chunk.token_id)
            log.append(name)
            if stop_after is not None and len(tokens) == stop_after:
                await asyncio.Event().wait()  # parked until cancelled
            await asyncio.sleep(0)
        return tuple(tokens)

    async def capture(name, prompt, steering=None, delay=1):
        for _ in range(delay):
            await asyncio.sleep(0)
        log.append(name)
        return (await model.capture(prompt, [READ], steering=steering))[READ]

    async def generate(name, prompt, params, steering=None, delay=1):
        for _ in range(delay):
            await asyncio.sleep(0)
        log.append(name)
        return (await model.generate(prompt, params, steering=steering)).token_ids

    async def concurrent():
        tasks = {
            "s_strong": asyncio.create_task(stream("s_strong", ids, p6, strong)),
            "s_plain": asyncio.create_task(stream("s_plain", ids, p6)),
            "s_other": asyncio.create_task(stream("s_other", other_ids, sampled, other)),
            "s_cancel": asyncio.create_task(stream("s_cancel", ids, p6, other, stop_after=2)),
            "c_plain": asyncio.create_task(capture("c_plain", ids, delay=2)),
            "c_other": asyncio.create_task(capture("c_other", other_ids, other, delay=3)),
            "g_strong": asyncio.create_task(generate("g_strong", other_ids, p6, strong, delay=4)),
        }
        while log.count("s_cancel") < 2:
            await asyncio.sleep(0)
        tasks["s_cancel"].cancel()
        partial = log.count("s_cancel")
        results = await asyncio.gather(*tasks.values(), return_exceptions=True)
        out = dict(zip(tasks, results, strict=True))
        assert isinstance(out.pop("s_cancel"), asyncio.CancelledError)
        return out, partial, torch.is_grad_enabled()

    async def serial():
        return {
            "s_strong": (await model.generate(ids, p6, steering=strong)).token_ids,
            "s_plain": (await model.generate(ids, p6)).token_ids,
            "s_other": (await model.generate(other_ids, sampled, steering=other)).token_ids,
            "c_plain": (await model.capture(ids, [READ]))[READ],
            "c_other": (await model.capture(other_ids, [READ], steering=other))[READ],
            "g_strong": (await model.generate(other_ids, p6, steering=strong)).token_ids,
            "c_strong": (await model.capture(ids, [READ], steering=strong))[READ],
        }

    got, partial, grad_after = asyncio.run(concurrent())
    want = asyncio.run(serial())
    for name in ("s_strong", "s_plain", "s_other", "g_strong"):
        assert got[name] == want[name], name
    for name in ("c_plain", "c_other"):
        assert _max_abs(got[name], want[name]) <= TOL, name
    assert partial == 2
    assert _hook_count(model) == 0
    assert grad_after, "interleaved streams left autograd switched off"
    # Negative control 1: the requests really interleaved (each stream's tokens are not one
    # contiguous run, and the captures ran while the streams were mid-way).
    for name in ("s_strong", "s_plain", "s_other"):
        first, last = log.index(name), len(log) - 1 - log[::-1].index(name)
        assert set(log[first : last + 1]) != {name}, f"{name} ran without interleaving"
    for name in ("c_plain", "c_other", "g_strong"):
        assert log.index("s_strong") < log.index(name) < len(log) - 1 - log[::-1].index("s_strong")
    # Negative control 2: the specs in play change what they touch.
    assert got["s_strong"] != got["s_plain"]
    assert _max_abs(want["c_strong"], want["c_plain"]) > 1.0


def test_a_session_entered_in_one_thread_does_not_touch_a_forward_in_another() -> None:
    model = _model()
    ids = model.to_tokens(PROMPT)
    strong, _ = _specs(model)
    alone = model.forward_with_cache(ids, [READ])[1][READ]
    steered = model.forward_with_cache(ids, [READ], steering=strong)[1][READ]
    result: dict[str, torch.Tensor] = {}

    def other_thread() -> None:
        result["during"] = model.forward_with_cache(ids, [READ])[1][READ]

    with Session(model.hf_model, (), model.admission.writes(strong, [ids])):
        assert _hook_count(model) > 0  # the steering hooks are installed while it runs
        thread = threading.Thread(target=other_thread)
        thread.start()
        thread.join()
    assert _max_abs(result["during"], alone) <= TOL
    assert _max_abs(steered, alone) > 1.0  # negative control: the spec does steer
