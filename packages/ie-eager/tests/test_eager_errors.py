"""Bad input gets a named error whose message says what and why."""

from __future__ import annotations

import pytest
import torch
from conftest import PROMPT, synthetic_model
from ie_core.errors import (
    LayerOutOfRangeError,
    PointUnavailableError,
    SteeringSpecError,
    UnknownPointError,
)
from ie_core.runner import run
from ie_core.steering import Additive, steer_at
from ie_eager.backend import DeviceUnavailableError, load


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
    with pytest.raises(PointUnavailableError, match="no module at"):
        _capture(synthetic_model("llama"), ["path.model.layers.99.mlp"])


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
