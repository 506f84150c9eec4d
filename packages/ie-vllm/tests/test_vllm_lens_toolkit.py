"""The #18 lens toolkit on hooked vLLM against eager, one engine for the module (ie-synthetic/llama,
fp32 CPU): Jacobian-lens top-k in the worker, the streaming read-out computed in the worker, and
the prefill-only / BOS-skip steering scopes."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
import torch
from ie_core.jacobian_lens import jacobian_lens_topk
from ie_core.lens_stream import stream_lens
from ie_core.protocol import SamplingParams
from ie_core.runner import run
from ie_core.steering import LensSteer, PositionMask, steer_at
from vllm_support import eager, requires_vllm, start, stop

pytestmark = [pytest.mark.slow, requires_vllm]

MODEL = "ie-synthetic/llama"
PROMPT = "The capital of France is Paris, and"
TOL = 1e-4  # eager vs vLLM, fp32


@pytest.fixture(scope="module")
def pair() -> Iterator[tuple[Any, Any]]:
    model = start(MODEL)
    yield model, eager(MODEL)
    stop(model)


def _steer(model: Any, **mask: Any) -> Any:
    torch.manual_seed(0)
    d = torch.randn(model.d_model)
    return steer_at("resid_pre.0", LensSteer(d, 0.8), mask=PositionMask(**mask))


def test_jacobian_lens_topk_matches_eager(pair: tuple[Any, Any]) -> None:
    from ie_eager.jacobian import jacobian_lens

    vm, em = pair
    lens = jacobian_lens(em, [[1, 5, 9, 13]], layers=[1])
    rows = run(em.capture(PROMPT, ["resid_post.1"]))["resid_post.1"][0]
    want = jacobian_lens_topk(em, lens, rows, 1, k=5)
    got = jacobian_lens_topk(vm, lens, rows, 1, k=5)
    assert torch.equal(got.ids, want.ids)
    assert (got.probs - want.probs).abs().max() < TOL


def test_streamed_read_out_equals_captured_rows(pair: tuple[Any, Any]) -> None:
    from ie_eager.jacobian import jacobian_lens

    vm, em = pair
    lens = jacobian_lens(em, [[1, 5, 9, 13]], layers=[1])
    sampling = SamplingParams(max_new_tokens=4, stop_at_eos=False)
    steps = list(
        stream_lens(
            vm, PROMPT, ["resid_post.1"], k=4, lens=lens, max_new_tokens=4, stop_at_eos=False
        )
    )
    gc = run(vm.capture_generation(PROMPT, ["resid_post.1"], sampling))
    assert tuple(s.chunk.token_id for s in steps) == gc.generation.token_ids
    after = jacobian_lens_topk(vm, lens, gc.cache["resid_post.1"][0], 1, k=4)
    ids = torch.cat([s.topk["resid_post.1"].ids for s in steps])
    probs = torch.cat([s.topk["resid_post.1"].probs for s in steps])
    assert torch.equal(ids, after.ids)
    assert (probs - after.probs).abs().max() < TOL
    on_eager = list(
        stream_lens(
            em, PROMPT, ["resid_post.1"], k=4, lens=lens, max_new_tokens=4, stop_at_eos=False
        )
    )
    assert torch.equal(torch.cat([s.topk["resid_post.1"].ids for s in on_eager]), ids)
    assert run(vm.stats())["registered"] == 0


@pytest.mark.parametrize("scope", ["prefill_only", "skip_bos"])
def test_steering_scope_matches_eager(pair: tuple[Any, Any], scope: str) -> None:
    """resid_pre.0 rows are the token embeddings, which no context changes: a row the scope
    leaves alone equals the unsteered run's row exactly, and the unscoped op (the negative
    control) does change it. resid_post.1 of the steered run matches eager's."""
    vm, em = pair
    sampling = SamplingParams(max_new_tokens=4, stop_at_eos=False)
    points = ["resid_pre.0", "resid_post.1"]
    got = run(vm.capture_generation(PROMPT, points, sampling, steering=_steer(vm, **{scope: True})))
    n = len(got.generation.prompt_ids)
    ids = [*got.generation.prompt_ids, *got.generation.token_ids[:-1]]
    plain = run(vm.capture([ids], ["resid_pre.0"]))["resid_pre.0"][0]
    every = run(vm.capture([ids], ["resid_pre.0"], steering=_steer(vm)))["resid_pre.0"][0]
    g = got.cache["resid_pre.0"][0]
    left, steered = (
        (slice(n, None), slice(0, n)) if scope == "prefill_only" else (0, slice(1, None))
    )
    assert torch.equal(g[left], plain[left])
    assert not torch.allclose(every[left], plain[left], atol=1e-3)
    assert not torch.allclose(g[steered], plain[steered], atol=1e-3)
    want = run(
        em.capture_generation(PROMPT, points, sampling, steering=_steer(em, **{scope: True}))
    )
    assert want.generation.token_ids == got.generation.token_ids
    for point in points:
        a, b = want.cache[point][0], got.cache[point][0]
        assert (a - b).abs().max() < TOL * max(1.0, float(a.abs().max()))
