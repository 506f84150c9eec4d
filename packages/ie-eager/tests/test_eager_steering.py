"""Steering on the eager backend: the math at a real site, masks, op order, generation with the KV
cache, every writable point, and post-intervention captures. fp32, tolerance 1e-5 unless noted."""

from __future__ import annotations

import pytest
import torch
from eager_support import PROMPT, synthetic_model
from ie_core.grammar import get_point
from ie_core.ops import Additive, Orthogonal, PositionMask, ProjectionCap, steer_at
from ie_core.protocol import SamplingParams
from ie_core.runner import run

TOL = {"atol": 1e-5, "rtol": 1e-5}


def _ids(model) -> list[int]:
    return model.to_tokens(PROMPT)


def _direction(width: int, seed: int = 0) -> torch.Tensor:
    return torch.randn(width, generator=torch.Generator().manual_seed(seed))


def test_orthogonal_coeff_zero_leaves_no_component() -> None:
    model = synthetic_model("llama")
    v = _direction(model.d_model)
    u = v / v.norm()
    plain = run(model.capture(_ids(model), ["resid_post.1"]))["resid_post.1"]
    steered = run(
        model.capture(
            _ids(model),
            ["resid_post.1"],
            steering=steer_at("resid_post.1", Orthogonal(v.tolist(), 0.0)),
        )
    )["resid_post.1"]
    assert (
        plain @ u
    ).abs().max() > 0.1  # negative control: the component is there without steering
    assert (steered @ u).abs().max() < 1e-5 * plain.norm(dim=-1).max()


def test_projection_cap_bounds_the_projection() -> None:
    model = synthetic_model("qwen2")
    v = _direction(model.d_model, 1)
    u = v / v.norm()
    plain = run(model.capture(_ids(model), ["resid_mid.2"]))["resid_mid.2"]
    cap = float((plain @ u).quantile(0.5))
    assert (plain @ u).max() > cap + 0.1  # negative control
    spec = steer_at("resid_mid.2", ProjectionCap(v.tolist(), max=cap))
    steered = run(model.capture(_ids(model), ["resid_mid.2"], steering=spec))["resid_mid.2"]
    assert (steered @ u).max() <= cap + 1e-4


def test_mask_leaves_masked_positions_bit_identical() -> None:
    model = synthetic_model("gemma2")
    ids = _ids(model)
    v = _direction(model.d_model, 2)
    masked = (0, 1, 2, 3)
    spec = steer_at("resid_pre.1", Additive(v.tolist(), 3.0), mask=PositionMask(masked))
    plain = run(model.capture(ids, ["resid_post.3"]))["resid_post.3"]
    steered = run(model.capture(ids, ["resid_post.3"], steering=spec))["resid_post.3"]
    assert torch.equal(plain[:, : len(masked)], steered[:, : len(masked)])
    assert not torch.allclose(plain[:, len(masked) :], steered[:, len(masked) :], **TOL)


def test_special_token_mask_skips_bos() -> None:
    model = synthetic_model("llama")
    ids = _ids(model)
    assert ids[0] == model.tokenizer.bos_token_id
    spec = steer_at(
        "resid_pre.0", Additive([1.0] * model.d_model), mask=PositionMask(special_tokens=True)
    )
    plain = run(model.capture(ids, ["resid_pre.0"]))["resid_pre.0"]
    steered = run(model.capture(ids, ["resid_pre.0"], steering=spec))["resid_pre.0"]
    assert torch.equal(plain[:, 0], steered[:, 0])
    assert torch.allclose(steered[:, 1:], plain[:, 1:] + 1.0, **TOL)


def test_ops_at_one_site_apply_in_order() -> None:
    model = synthetic_model("mistral")
    v = _direction(model.d_model, 3)
    u = v / v.norm()
    ids = _ids(model)
    add_then_ablate = steer_at(
        "resid_post.0", Additive(v.tolist(), 2.0), Orthogonal(v.tolist(), 0.0)
    )
    ablate_then_add = steer_at(
        "resid_post.0", Orthogonal(v.tolist(), 0.0), Additive(v.tolist(), 2.0)
    )
    a = run(model.capture(ids, ["resid_post.0"], steering=add_then_ablate))["resid_post.0"]
    b = run(model.capture(ids, ["resid_post.0"], steering=ablate_then_add))["resid_post.0"]
    assert (a @ u).abs().max() < 1e-4
    assert torch.allclose(b @ u, torch.full_like(b @ u, 2.0 * float(v.norm())), atol=1e-4)


WRITE_FAMILIES = [
    "llama",
    "qwen3",
    "gpt-neox",
    "phi3",
    "gemma3",
    "granite",
    "granitemoehybrid",
    "opt",
    "olmo2",
    "bloom",
]


@pytest.mark.parametrize("slug", WRITE_FAMILIES)
def test_every_writable_point_takes_an_additive_write(slug: str) -> None:
    """Captured after the write = captured without it + the vector, at every writable point."""
    model = synthetic_model(slug)
    ids = _ids(model)
    layer = 1
    for name in model.points():
        point = get_point(name)
        if not point.writable:
            continue
        address = f"{name}.{layer}" if point.per_layer else name
        try:
            width = model.point_width(address)
        except Exception:
            continue  # e.g. a dense-MLP point on a sparse layer
        v = _direction(width, 4)
        plain = run(model.capture(ids, [address]))[address]
        steered = run(
            model.capture(ids, [address], steering=steer_at(address, Additive(v.tolist())))
        )[address]
        assert torch.allclose(steered, plain + v, atol=1e-4, rtol=1e-5), f"{slug} {address}"


def _full_forward_greedy(model, ids: list[int], n: int, spec) -> list[int]:
    """Greedy decoding with no KV cache: one full steered forward per token."""
    out: list[int] = []
    for _ in range(n):
        logits, _ = model.forward_with_cache([ids + out], [], steering=spec)
        out.append(int(logits[0, -1].argmax()))
    return out


@pytest.mark.parametrize("slug", ["llama", "gpt2", "gemma2"])
def test_kv_cached_generation_steers_new_rows(slug: str) -> None:
    model = synthetic_model(slug)
    ids = _ids(model)
    spec = steer_at(
        "resid_mid.1",
        Additive(_direction(model.d_model, 5).tolist(), 4.0),
        mask=PositionMask((0, 1)),
    )
    params = SamplingParams(max_new_tokens=6, stop_at_eos=False)
    steered = run(model.generate(ids, params, steering=spec)).token_ids
    assert list(steered) == _full_forward_greedy(model, ids, 6, spec)
    plain = run(model.generate(ids, params)).token_ids
    assert steered != plain  # negative control: the steering changes the tokens


def test_unsteered_generation_matches_hf_generate() -> None:
    model = synthetic_model("qwen3")
    ids = _ids(model)
    ours = run(model.generate(ids, SamplingParams(max_new_tokens=8, stop_at_eos=False))).token_ids
    with torch.no_grad():
        ref = model.hf_model.generate(
            torch.tensor([ids]),
            max_new_tokens=8,
            do_sample=False,
            eos_token_id=None,
            pad_token_id=0,
        )[0, len(ids) :]
    assert list(ours) == ref.tolist()


def test_stream_equals_generate_and_seeded_sampling_repeats() -> None:
    model = synthetic_model("llama")
    ids = _ids(model)
    params = SamplingParams(
        max_new_tokens=6, temperature=0.8, top_k=20, top_p=0.9, seed=7, stop_at_eos=False
    )
    a = run(model.generate(ids, params)).token_ids
    b = run(model.generate(ids, params)).token_ids
    assert a == b

    async def collect() -> list[int]:
        return [c.token_id async for c in model.generate_stream(ids, params)]

    assert tuple(run(collect())) == a


def test_capture_generation_covers_prompt_plus_generated_minus_one() -> None:
    model = synthetic_model("gpt2")
    ids = _ids(model)
    result = run(
        model.capture_generation(
            ids, ["resid_post.2"], SamplingParams(max_new_tokens=5, stop_at_eos=False)
        )
    )
    n = len(result.generation.prompt_ids) + len(result.generation.token_ids) - 1
    assert result.cache["resid_post.2"].shape == (1, n, model.d_model)


def test_topk_probabilities_are_full_vocab_softmax() -> None:
    model = synthetic_model("gemma2")
    logits, cache = model.forward_with_cache([_ids(model)], ["resid_post.3"])
    top = run(model.decode_residuals_topk(cache["resid_post.3"][0], 5))
    ref = torch.softmax(logits[0].float(), dim=-1)
    assert torch.equal(top.ids[:, 0], ref.argmax(-1))
    assert torch.allclose(top.probs, ref.gather(-1, top.ids), atol=1e-6)


def test_grad_opt_in_keeps_the_graph() -> None:
    """The gradient through a grad capture equals plain autograd through HF's own hidden states
    (resid_post.1 is hidden_states[2]); layers past the read get none (negative control)."""
    model = synthetic_model("llama")
    hf = model.hf_model
    weight = hf.model.layers[1].mlp.down_proj.weight
    hf.zero_grad(set_to_none=True)  # the model is shared: an earlier test may have left gradients
    cache = run(model.capture(_ids(model), ["resid_post.1", "resid_post.3"], grad=True))
    assert cache["resid_post.3"].requires_grad
    try:
        (cache["resid_post.1"] ** 2).sum().backward()
        got = weight.grad.clone()
        assert hf.model.layers[2].mlp.down_proj.weight.grad is None
        hf.zero_grad(set_to_none=True)
        out = hf(input_ids=torch.tensor([_ids(model)]), output_hidden_states=True, use_cache=False)
        (out.hidden_states[2] ** 2).sum().backward()
        assert float(got.abs().max()) > 1e-3
        assert torch.allclose(got, weight.grad, atol=1e-5, rtol=1e-5)
    finally:
        hf.zero_grad(set_to_none=True)
    plain = run(model.capture(_ids(model), ["resid_post.1"]))
    assert not plain["resid_post.1"].requires_grad


def _hook_count(model) -> int:
    return sum(len(m._forward_hooks) + len(m._forward_pre_hooks) for m in model.hf_model.modules())


def test_hooks_are_removed_after_an_error(monkeypatch: pytest.MonkeyPatch) -> None:
    model = synthetic_model("llama")
    before = _hook_count(model)
    mlp = model.hf_model.model.layers[2].mlp

    def boom(*args, **kwargs):
        raise RuntimeError("boom inside the forward")

    monkeypatch.setattr(mlp, "forward", boom)
    spec = steer_at("resid_post.1", Additive([1.0] * model.d_model))
    with pytest.raises(RuntimeError, match="boom"):
        run(
            model.capture(_ids(model), ["resid_post.1", "attn_probs.2", "mlp_out.2"], steering=spec)
        )
    assert _hook_count(model) == before
    monkeypatch.undo()
    assert run(model.capture(_ids(model), ["mlp_out.2"]))["mlp_out.2"].shape[-1] == model.d_model
