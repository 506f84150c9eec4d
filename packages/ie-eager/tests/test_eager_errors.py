"""Bad input gets a named error whose message says what and why."""

from __future__ import annotations

import pytest
import torch
from eager_support import PROMPT, synthetic_model
from ie_core.errors import (
    LayerOutOfRangeError,
    PointUnavailableError,
    SteeringSpecError,
    UnknownPointError,
)
from ie_core.ops import Additive, Orthogonal, PositionMask, steer_at
from ie_core.protocol import SamplingParams
from ie_core.runner import run
from ie_eager.backend import DeviceUnavailableError, load
from ie_eager.synthetic import build


def _capture(model, addresses, **kw):
    return run(model.capture(model.to_tokens(PROMPT), addresses, **kw))


def test_unknown_point() -> None:
    with pytest.raises(UnknownPointError, match="resid_middle"):
        _capture(synthetic_model("llama"), ["resid_middle.1"])


def test_layer_out_of_range_names_the_range() -> None:
    model = synthetic_model("llama")
    with pytest.raises(LayerOutOfRangeError, match=r"has 4 layers \(0\.\.3\)"):
        _capture(model, [f"resid_post.{model.n_layers}"])


def test_point_the_family_lacks_gives_the_family_reason() -> None:
    with pytest.raises(PointUnavailableError, match="Llama has no qk norm"):
        _capture(synthetic_model("llama"), ["q_norm_in.1"])
    with pytest.raises(PointUnavailableError, match="in parallel"):
        _capture(synthetic_model("gpt-neox"), ["resid_mid.1"])
    with pytest.raises(PointUnavailableError, match="no moe"):
        _capture(synthetic_model("llama"), ["router_logits.0"])


def test_dense_mlp_points_on_a_sparse_layer_say_why() -> None:
    with pytest.raises(PointUnavailableError, match="sparse mixture-of-experts"):
        _capture(synthetic_model("qwen3-moe"), ["mlp_act.1"])


def test_multi_stream_points_are_refused_with_the_reason() -> None:
    with pytest.raises(PointUnavailableError, match="single residual stream"):
        _capture(synthetic_model("llama"), ["resid_post.1.stream-0"])
    with pytest.raises(PointUnavailableError, match=r"single residual stream|no multi stream"):
        _capture(synthetic_model("llama"), ["resid_streams.1"])


def test_wrong_width_names_both_widths() -> None:
    model = synthetic_model("llama")
    with pytest.raises(SteeringSpecError, match=r"width 7.*128 wide"):
        _capture(model, ["resid_post.1"], steering=steer_at("resid_post.1", Additive([1.0] * 7)))
    with pytest.raises(SteeringSpecError, match=r"width 128.*256 wide"):
        _capture(model, ["mlp_act.1"], steering=steer_at("mlp_act.1", Additive([1.0] * 128)))


def test_nan_and_zero_vectors_are_refused() -> None:
    with pytest.raises(SteeringSpecError, match="NaN"):
        Additive([float("nan")] * 128)
    with pytest.raises(SteeringSpecError, match="zeros"):
        Additive([0.0] * 128)


def test_capture_only_points_cannot_be_steered() -> None:
    with pytest.raises(SteeringSpecError, match="capture-only"):
        steer_at("attn_probs.1", Additive([1.0] * 16))


def test_bad_tokens() -> None:
    model = synthetic_model("llama")
    with pytest.raises(ValueError, match="outside the vocabulary"):
        run(model.capture([1, 2, 10**6], ["resid_post.0"]))
    with pytest.raises(ValueError, match="empty"):
        run(model.capture([], ["resid_post.0"]))
    with pytest.raises(ValueError, match="different lengths"):
        run(model.capture([[1, 2, 3], [1, 2]], ["resid_post.0"]))


def test_unknown_module_path() -> None:
    with pytest.raises(PointUnavailableError) as info:
        _capture(synthetic_model("llama"), ["path.model.layers.99.mlp"])
    assert str(info.value) == (
        "path.model.layers.99.mlp: the model has no module at 'model.layers.99.mlp'; module "
        "paths look like 'model.layers.0'"
    )


def test_a_module_path_reads_that_module_output() -> None:
    """`path.<module>` is the module's own output, as a forward hook written here sees it."""
    model = synthetic_model("llama")
    ids = model.to_tokens(PROMPT)
    seen: list[torch.Tensor] = []
    mlp = model.hf_model.get_submodule("model.layers.1.mlp")
    handle = mlp.register_forward_hook(lambda _m, _a, out: seen.append(out.detach().clone()))
    try:
        got = run(model.capture(ids, ["path.model.layers.1.mlp"]))["path.model.layers.1.mlp"]
    finally:
        handle.remove()
    assert torch.equal(got, seen[0])
    # Negative control: the next layer's MLP is another tensor.
    other = run(model.capture(ids, ["path.model.layers.2.mlp"]))["path.model.layers.2.mlp"]
    assert not torch.allclose(other, got)


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the no-GPU refusal")
def test_asking_for_a_missing_gpu_raises_instead_of_using_the_cpu() -> None:
    with pytest.raises(DeviceUnavailableError, match="no CUDA GPU"):
        load("ie-synthetic/llama", device="cuda")


def test_batch_capture_rows_match_single_captures() -> None:
    model = synthetic_model("mistral")
    a = model.to_tokens(PROMPT)
    b = list(reversed(a))
    both = run(model.capture([a, b], ["resid_post.2"]))["resid_post.2"]
    single = run(model.capture(b, ["resid_post.2"]))["resid_post.2"]
    assert both.shape == (2, len(a), model.d_model)
    assert torch.allclose(both[1], single[0], atol=1e-5)


def _unit_direction(width: int, seed: int = 3) -> torch.Tensor:
    v = torch.randn(width, generator=torch.Generator().manual_seed(seed))
    return v / v.norm()


def test_a_tiny_direction_steers_like_its_unit_vector_instead_of_giving_nan() -> None:
    model = synthetic_model("llama")
    ids = model.to_tokens(PROMPT)
    u = _unit_direction(model.d_model)
    params = SamplingParams(max_new_tokens=4, stop_at_eos=False)
    tiny = steer_at("resid_post.1", Orthogonal((u * 1e-30).tolist(), 0.0))
    unit = steer_at("resid_post.1", Orthogonal(u.tolist(), 0.0))
    got = _capture(model, ["resid_post.2"], steering=tiny)["resid_post.2"]
    want = _capture(model, ["resid_post.2"], steering=unit)["resid_post.2"]
    assert torch.isfinite(got).all()
    assert float((got - want).abs().max()) <= 1e-5 * float(want.abs().max())
    tokens = run(model.generate(ids, params, steering=tiny)).token_ids
    assert tokens == run(model.generate(ids, params, steering=unit)).token_ids
    # Negative control: the ablation changes the activations it is compared on.
    plain = _capture(model, ["resid_post.2"])["resid_post.2"]
    assert float((want - plain).abs().max()) > 1e-2


def test_mask_positions_past_the_prompt_are_refused_by_the_backend() -> None:
    model = synthetic_model("llama")
    n = len(model.to_tokens(PROMPT))
    spec = steer_at("resid_post.1", Additive([1.0] * model.d_model), mask=PositionMask((0, n + 2)))
    with pytest.raises(SteeringSpecError, match=rf"\[{n + 2}\] are past the prompt"):
        _capture(model, ["resid_post.1"], steering=spec)
    with pytest.raises(SteeringSpecError, match="past the prompt"):
        run(model.generate(model.to_tokens(PROMPT), steering=spec))


def test_steering_that_overflows_the_activations_is_refused_not_decoded() -> None:
    model = synthetic_model("llama")
    u = _unit_direction(model.d_model).tolist()
    spec = steer_at("resid_post.1", Orthogonal(u, 3e38))  # a valid float32 coeff
    with pytest.raises(SteeringSpecError) as info:
        run(model.generate(model.to_tokens(PROMPT), steering=spec))
    assert str(info.value) == (
        "steering at resid_post.1 produced inf or NaN from finite activations in torch.float32: "
        "the ops' values are too large for these activations; use smaller coefficients or bounds"
    )


def test_additive_values_beyond_a_float16_model_are_refused_at_apply_time() -> None:
    model = load(str(build("llama")), device="cpu", dtype="float16")
    spec = steer_at("resid_post.1", Additive([1e5] * model.d_model))  # fine in float32
    with pytest.raises(SteeringSpecError, match=r"torch\.float16 max 65504"):
        _capture(model, ["resid_post.1"], steering=spec)
    ok = steer_at("resid_post.1", Additive([1e3] * model.d_model))
    assert torch.isfinite(_capture(model, ["resid_post.1"], steering=ok)["resid_post.1"]).all()


@pytest.mark.parametrize("address", ["embeddings", "final_norm", "resid_post.1"])
def test_a_steering_vector_of_another_width_is_refused_at_trunk_points(address: str) -> None:
    model = synthetic_model("llama")
    wide = model.d_model + 1
    spec = steer_at(address, Additive([1.0] * wide))
    with pytest.raises(SteeringSpecError) as info:
        _capture(model, ["resid_post.0"], steering=spec)
    name = address.partition(".")[0]
    assert str(info.value) == (
        f"steering vector for {name!r} has width {wide}, but the point is {model.d_model} wide on "
        "this model"
    )
