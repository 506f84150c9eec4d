"""#18 lens toolkit on eager: the Jacobian lens against finite differences, the streaming
read-out against the captured rows, and the prefill-only / BOS-skip steering scopes."""

from __future__ import annotations

import functools
from typing import Any

import pytest
import torch
from ie_core.errors import LayerOutOfRangeError, PointUnavailableError, UnsupportedModelError
from ie_core.experiments.jacobian_lens import JacobianLens, jacobian_lens_topk
from ie_core.experiments.lens_stream import stream_lens
from ie_core.ops import Additive, LensSteer, PositionMask, steer_at
from ie_core.protocol import SamplingParams
from ie_core.runner import run
from ie_core.steer_scope import ScopedPositions
from ie_core.wire import steering_from_wire, steering_to_wire
from ie_eager.backend import EagerModel, load
from ie_eager.jacobian import jacobian_lens, position_jacobians
from ie_eager.synthetic import build

IDS = [1, 17, 40, 9]
PROMPT = "The capital of France is Paris, and"
GREEDY = SamplingParams(max_new_tokens=4, stop_at_eos=False)


@functools.cache
def model32() -> EagerModel:
    return load(str(build("llama")), device="cpu", dtype="float32")


@functools.cache
def lens32() -> JacobianLens:
    return jacobian_lens(model32(), [IDS, IDS[:3]], layers=[0, 1])


def _final(m: EagerModel, steering: Any = None) -> torch.Tensor:
    last = f"resid_post.{m.n_layers - 1}"
    return m.forward_with_cache([IDS], [last], steering=steering)[1][last][0]


def _trunk(m: EagerModel) -> Any:
    trunk: Any = m.hf_model.model  # LlamaModel: .layers is its decoder layer list
    return trunk


def _layer_hook(m: EagerModel, layer: int, fn: Any) -> Any:
    """A plain torch hook on decoder layer `layer`'s output hidden states (resid_post.layer)."""

    def hook(_m: Any, _a: Any, out: Any) -> Any:
        h = fn(out[0] if isinstance(out, tuple) else out)
        return (h, *out[1:]) if isinstance(out, tuple) else h

    return _trunk(m).layers[layer].register_forward_hook(hook)


def _nudged_final(m: EagerModel, t: int, j: int, eps: float) -> torch.Tensor:
    def nudge(h: torch.Tensor) -> torch.Tensor:
        h = h.clone()
        h[:, t, j] += eps
        return h

    handle = _layer_hook(m, 1, nudge)
    try:
        return _final(m)[t]
    finally:
        handle.remove()


def test_jacobian_matches_single_sequence_autograd() -> None:
    """Each row i of J_t against a plain backward of resid_final[t, i] through one unbatched
    forward with layer 1's output as the leaf (taking its position-t slice): equal to 1e-6
    (measured 0.0)."""
    m = model32()
    jac = position_jacobians(m, IDS, 1)
    leaves: list[torch.Tensor] = []
    handle = _layer_hook(
        m, 1, lambda h: leaves.append(h.detach().requires_grad_(True)) or leaves[-1]
    )
    try:
        with torch.enable_grad():
            final = _trunk(m).layers[m.n_layers - 1]
            outs: list[torch.Tensor] = []
            h2 = final.register_forward_hook(
                lambda _m, _a, o: outs.append(o[0] if isinstance(o, tuple) else o)
            )
            _trunk(m)(input_ids=torch.tensor([IDS]), use_cache=False)
            h2.remove()
            for t in range(len(IDS)):
                for i in (0, 31, 100):
                    g = torch.autograd.grad(outs[-1][0, t, i], leaves[-1], retain_graph=True)[0]
                    assert (g[0, t] - jac[t, i]).abs().max() < 1e-6
    finally:
        handle.remove()


def test_jacobian_matches_central_differences() -> None:
    """(f(h + eps e_j) - f(h - eps e_j)) / 2eps with the step at position t only, eps = 1e-2:
    within 5e-4 (fp32 rounding and the O(eps^2) term; measured 1.6e-4). Llama's RMSNorm computes
    in fp32 whatever the weights' dtype, so a smaller step only adds rounding."""
    m = model32()
    jac = position_jacobians(m, IDS, 1)
    t, eps = len(IDS) - 1, 1e-2
    for j in (0, 5, 77):
        fd = (_nudged_final(m, t, j, eps) - _nudged_final(m, t, j, -eps)) / (2 * eps)
        assert (fd - jac[t, :, j]).abs().max() < 5e-4
        # Negative control: another position's Jacobian column is not this one.
        assert (fd - jac[0, :, j]).abs().max() > 1e-2


def test_lens_is_the_mean_of_position_jacobians() -> None:
    m = model32()
    lens = lens32()
    want = torch.cat([position_jacobians(m, IDS, 1), position_jacobians(m, IDS[:3], 1)]).mean(0)
    assert lens.n_rows == 7
    assert (lens.matrix(1) - want).abs().max() < 1e-6
    last = jacobian_lens(m, [IDS[:2]], layers=[m.n_layers - 1])
    assert torch.equal(last.matrix(m.n_layers - 1), torch.eye(m.d_model))


def test_jacobian_lens_topk_and_negative_controls(tmp_path: Any) -> None:
    m, lens = model32(), lens32()
    rows = run(m.capture(PROMPT, ["resid_post.0"]))["resid_post.0"][0]
    got = jacobian_lens_topk(m, lens, rows, 0, k=5)
    want = run(m.decode_residuals_topk(rows.float() @ lens.matrix(0).T, 5))
    assert torch.equal(got.ids, want.ids)
    # Identity transport (the plain logit lens) and the wrong layer's matrix read differently.
    plain = run(m.decode_residuals_topk(rows, 5))
    assert (plain.probs - got.probs).abs().max() > 1e-3
    other = jacobian_lens_topk(m, lens, rows, 1, k=5)
    assert (other.probs - got.probs).abs().max() > 1e-3
    with pytest.raises(LayerOutOfRangeError, match="holds layers"):
        lens.matrix(2)
    with pytest.raises(LayerOutOfRangeError):
        jacobian_lens(m, [IDS], layers=[m.n_layers])
    with pytest.raises(ValueError, match="d_model"):
        lens.transport(torch.zeros(3, 5), 0)
    small = JacobianLens("x", 2, m.d_model, {0: torch.eye(m.d_model)}, 1)
    with pytest.raises(UnsupportedModelError):
        jacobian_lens_topk(m, small, rows, 0)
    path = tmp_path / "lens.safetensors"
    lens.save(path)
    back = JacobianLens.load(path)
    assert back.layers == lens.layers and back.n_rows == lens.n_rows
    assert all(torch.equal(back.matrix(i), lens.matrix(i)) for i in lens.layers)


@pytest.mark.parametrize("with_lens", [False, True])
def test_streamed_read_out_equals_captured_rows(with_lens: bool) -> None:
    m = model32()
    lens = lens32() if with_lens else None
    steps = list(stream_lens(m, PROMPT, ["resid_post.1"], k=4, lens=lens, max_new_tokens=4))
    gc = run(m.capture_generation(PROMPT, ["resid_post.1"], GREEDY))
    assert tuple(s.chunk.token_id for s in steps) == gc.generation.token_ids
    assert "".join(s.chunk.text for s in steps) == gc.generation.text
    rows = gc.cache["resid_post.1"][0]
    after = (
        jacobian_lens_topk(m, lens, rows, 1, k=4) if lens else run(m.decode_residuals_topk(rows, 4))
    )
    assert [s.topk["resid_post.1"].ids.shape[0] for s in steps] == [
        len(gc.generation.prompt_ids),
        1,
        1,
        1,
    ]
    ids = torch.cat([s.topk["resid_post.1"].ids for s in steps])
    probs = torch.cat([s.topk["resid_post.1"].probs for s in steps])
    assert torch.equal(ids, after.ids)
    assert (probs - after.probs).abs().max() < 1e-5


def test_stream_lens_refuses_a_point_the_lens_does_not_carry() -> None:
    with pytest.raises(PointUnavailableError, match="resid_post"):
        next(stream_lens(model32(), PROMPT, ["mlp_out.1"], lens=lens32()))
    with pytest.raises(LayerOutOfRangeError):
        next(stream_lens(model32(), PROMPT, ["resid_post.3"], lens=lens32()))


def _steer(m: EagerModel, **mask: Any) -> Any:
    torch.manual_seed(0)
    return steer_at(
        "resid_pre.0", LensSteer(torch.randn(m.d_model), 0.8), mask=PositionMask(**mask)
    )


@pytest.mark.parametrize("scope", ["prefill_only", "skip_bos"])
def test_steering_scope(scope: str) -> None:
    """resid_pre.0 rows are token embeddings (no context changes them): a row the scope leaves
    alone equals the unsteered row exactly; the unscoped op (negative control) changes it."""
    m = model32()
    got = run(
        m.capture_generation(PROMPT, ["resid_pre.0"], GREEDY, steering=_steer(m, **{scope: True}))
    )
    n = len(got.generation.prompt_ids)
    ids = [*got.generation.prompt_ids, *got.generation.token_ids[:-1]]
    assert ids[0] == m.tokenizer.bos_token_id
    plain = run(m.capture([ids], ["resid_pre.0"]))["resid_pre.0"][0]
    every = run(m.capture([ids], ["resid_pre.0"], steering=_steer(m)))["resid_pre.0"][0]
    g = got.cache["resid_pre.0"][0]
    left, steered = (
        (slice(n, None), slice(0, n)) if scope == "prefill_only" else (0, slice(1, None))
    )
    assert torch.equal(g[left], plain[left])
    assert not torch.allclose(every[left], plain[left], atol=1e-3)
    assert not torch.allclose(g[steered], plain[steered], atol=1e-3)
    # The decode loop (generate) steers as the re-run capture does: the same tokens.
    gen = run(m.generate(PROMPT, GREEDY, steering=_steer(m, **{scope: True})))
    assert gen.token_ids == got.generation.token_ids


def test_scope_fields_on_the_wire_and_in_sets() -> None:
    spec = steer_at(
        "resid_post.1",
        Additive([1.0, 2.0]),
        mask=PositionMask((1,), prefill_only=True, skip_bos=True),
    )
    assert steering_from_wire(steering_to_wire(spec)) == (spec,)
    s = ScopedPositions({1}, limit=5)
    assert 1 in s and 5 in s and 9 in s and 2 not in s and bool(ScopedPositions((), 3))
    with pytest.raises(ValueError, match="prefill_only"):
        PositionMask(prefill_only=1)  # type: ignore[arg-type]
