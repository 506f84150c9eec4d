"""The #18 lens toolkit on hooked vLLM against eager, one engine for the module (ie-synthetic/llama,
fp32 CPU): Jacobian-lens top-k in the worker, the streaming read-out computed in the worker, and
the prefill-only / BOS-skip steering scopes."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
import torch
from ie_core.experiments.jacobian_lens import jacobian_lens_topk
from ie_core.experiments.lens_stream import stream_lens
from ie_core.ops import LensSteer, PositionMask, steer_at
from ie_core.protocol import SamplingParams
from ie_core.runner import run
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


# --- sparse dictionaries (issue 26): encode and top-k in the worker ---------------------------

SAE_POINT = "resid_post.1"
SAE_PROMPTS = [[1, 17, 42, 99, 7, 23], [1, 250, 3, 64, 11, 5]]


def _dictionary(d: int, activation: str, seed: int = 0) -> Any:
    from ie_core.experiments.saes import from_tensors

    g = torch.Generator().manual_seed(seed)
    f = 96
    w = {"W_enc": torch.randn(d, f, generator=g) / d**0.5, "b_enc": torch.randn(f, generator=g) / 8,
         "W_dec": torch.randn(f, d, generator=g) / 4, "b_dec": torch.randn(d, generator=g) / 8}  # fmt: skip
    if activation == "jumprelu":
        w["threshold"] = torch.rand(f, generator=g) * 0.2
    k = 8 if activation == "topk" else None
    return from_tensors(w, address=SAE_POINT, activation=activation, k=k, b_dec_in=True)


def _reference(x: torch.Tensor, sae: Any) -> torch.Tensor:
    """SAELens's encode, from its definition, on eager's captured rows."""
    w = sae.weights
    pre = (x.float() - w["b_dec"]) @ w["W_enc"] + w["b_enc"]
    if sae.meta.activation == "relu":
        return pre.clamp(min=0)
    if sae.meta.activation == "jumprelu":
        return torch.where(pre > w["threshold"], pre.clamp(min=0), torch.zeros_like(pre))
    vals, ids = pre.topk(sae.meta.k, dim=-1)
    return torch.zeros_like(pre).scatter(-1, ids, vals.clamp(min=0))


@pytest.mark.parametrize("activation", ["relu", "jumprelu", "topk"])
def test_worker_features_match_an_independent_encode(
    pair: tuple[Any, Any], activation: str
) -> None:
    from ie_core.experiments.features import feature_activations

    vm, em = pair
    sae = _dictionary(vm.d_model, activation)
    want = _reference(run(em.capture(SAE_PROMPTS, [SAE_POINT]))[SAE_POINT], sae)
    dense = feature_activations(vm, SAE_PROMPTS, sae)
    assert (dense.acts - want).abs().max() < TOL
    top = feature_activations(vm, SAE_PROMPTS, sae, k=5, stats=True)
    assert top.ids.shape == (2, 6, 5) and top.sq_error.shape == (2, 6)
    assert (top.values - want.topk(5, dim=-1).values).abs().max() < TOL
    assert (want.gather(-1, top.ids) - top.values).abs().max() < TOL
    assert run(vm.stats())["registered"] == 0


def test_width_mismatch_refused_before_any_forward(pair: tuple[Any, Any]) -> None:
    from ie_core.errors import DictionaryShapeError
    from ie_core.experiments.features import feature_activations

    vm, _ = pair
    before = run(vm.stats())["forwards"]
    with pytest.raises(DictionaryShapeError):
        feature_activations(vm, SAE_PROMPTS, _dictionary(vm.d_model + 2, "relu"))
    assert run(vm.stats())["forwards"] == before


def test_sixteen_concurrent_dictionary_requests_equal_serial(pair: tuple[Any, Any]) -> None:
    """Different dictionaries, k, features and steering per request, all in flight together."""
    import asyncio

    from ie_core.experiments.features import feature_clamp, feature_steer

    vm, em = pair
    kinds = ("relu", "jumprelu", "topk")
    jobs = []
    for i in range(16):
        sae = _dictionary(vm.d_model, kinds[i % 3], seed=i % 5)
        op = (
            feature_steer(sae, i, 2.0)
            if i % 2
            else feature_clamp(sae, i, 3.0)
            if i % 3 != 2
            else None
        )
        steering = steer_at("resid_pre.1", op) if op is not None else None
        jobs.append((SAE_PROMPTS[i % 2 : i % 2 + 1], {"s": sae}, 3 + i % 4, steering))

    def one(job: Any) -> Any:
        prompts, saes, k, steering = job
        return vm.dictionary_features(prompts, saes, k=k, steering=steering)

    async def together() -> list[Any]:
        return list(await asyncio.gather(*(one(j) for j in jobs)))

    concurrent = run(together())
    for job, got in zip(jobs, concurrent, strict=True):
        alone = run(one(job))
        assert torch.equal(got["s"]["ids"], alone["s"]["ids"])
        assert (got["s"]["values"] - alone["s"]["values"]).abs().max() < 1e-5
    # The steering matters (a control): request 1 steered vs its unsteered features.
    plain = run(vm.dictionary_features(jobs[1][0], jobs[1][1], k=jobs[1][2]))
    assert (plain["s"]["values"] - concurrent[1]["s"]["values"]).abs().max() > 1e-3
    # And eager agrees with the steered worker read-out (1e-4).
    prompts, saes, k, steering = jobs[1]
    x = run(em.capture(prompts, [SAE_POINT], steering=steering))[SAE_POINT]
    want = _reference(x, saes["s"]).topk(k, dim=-1).values
    assert (want - concurrent[1]["s"]["values"]).abs().max() < TOL


def test_streamed_features_equal_the_read_out_of_the_whole_generation(
    pair: tuple[Any, Any],
) -> None:
    from ie_core.experiments.feature_stream import stream_features
    from ie_core.experiments.features import feature_activations

    vm, em = pair
    sae = _dictionary(vm.d_model, "topk", seed=3)
    steps = list(
        stream_features(vm, SAE_PROMPTS[0], {"s": sae}, k=4, max_new_tokens=5, stop_at_eos=False)
    )
    assert len(steps) == 5 and steps[0].features["s"].ids.shape == (6, 4)
    tokens = [s.chunk.token_id for s in steps]
    whole = [*SAE_PROMPTS[0], *tokens[:-1]]
    want = feature_activations(em, [whole], sae, k=4)
    values = torch.cat([s.features["s"].values for s in steps])
    assert values.shape == (10, 4)
    assert (values - want.values[0]).abs().max() < TOL
    assert run(vm.stats())["registered"] == 0


@pytest.mark.parametrize("keep_error", [False, True])
def test_splice_matches_eager(pair: tuple[Any, Any], keep_error: bool) -> None:
    """The spliced next-token loss on vLLM equals eager's; keep_error=True is the clean run."""
    from ie_core.experiments.splice import splice

    vm, em = pair
    sae = _dictionary(vm.d_model, "jumprelu", seed=2)
    got = splice(vm, SAE_PROMPTS, sae, keep_error=keep_error)
    want = splice(em, SAE_PROMPTS, sae, keep_error=keep_error)
    scale = float(want.clean_loss.abs().max())
    assert float((got.loss - want.loss).abs().max()) < TOL * scale
    assert float((got.clean_loss - want.clean_loss).abs().max()) < TOL * scale
    if keep_error:
        assert float((got.loss - got.clean_loss).abs().max()) < TOL * scale
    else:  # control: the splice moves the loss far beyond the tolerance
        assert float(got.delta.abs().max()) > 100 * TOL * scale
    assert run(vm.stats())["registered"] == 0
