"""The eager backend through ie_core: entry points, free functions, protocol conformance."""

from __future__ import annotations

import ie_core
import torch
from eager_support import PROMPT, synthetic_model
from ie_core import Additive, steer, steer_at
from ie_core.protocol import InterpModel
from ie_eager.backend import EagerModel, load


def test_load_model_finds_the_eager_backend_and_synthetic_source() -> None:
    model = ie_core.load_model("ie-synthetic/llama", backend="eager", device="cpu")
    assert isinstance(model, EagerModel) and isinstance(model, InterpModel)
    assert (model.backend, model.family.slug, model.n_layers, model.d_model) == (
        "eager",
        "llama",
        4,
        128,
    )
    assert model.dtype == torch.float32 and model.device.type == "cpu"


def test_free_functions_and_steer_context() -> None:
    model = synthetic_model("llama")
    ids = model.to_tokens(PROMPT)
    plain = ie_core.capture(model, ids, ["resid_post.2"])["resid_post.2"]
    spec = steer_at("resid_post.2", Additive([0.5] * model.d_model))
    with steer(model, spec):
        steered = ie_core.capture(model, ids, ["resid_post.2"])["resid_post.2"]
    assert torch.allclose(steered, plain + 0.5, atol=1e-5)
    top = ie_core.decode_residuals(model, plain[0], k=3)
    assert top.ids.shape == (len(ids), 3)
    out = ie_core.generate(model, ids, max_new_tokens=3, stop_at_eos=False)
    assert len(out.token_ids) == 3


def test_capture_attention_every_layer() -> None:
    model = synthetic_model("gemma3")
    ids = model.to_tokens(PROMPT)
    cache = ie_core.capture_attention(model, ids)
    assert len(cache) == model.n_layers
    heads = model.structure.shapes.n_heads
    assert cache["attn_probs.5"].shape == (1, heads, len(ids), len(ids))


def test_wrapping_an_hf_object_matches_loading_the_folder() -> None:
    ref = synthetic_model("qwen2")
    wrapped = load(ref.hf_model, tokenizer=ref.tokenizer, name="qwen2-object")
    ids = [ref.to_tokens(PROMPT)]
    assert torch.equal(ref.forward_with_cache(ids)[0], wrapped.forward_with_cache(ids)[0])
    assert wrapped.model_id == "qwen2-object"


def test_chat_template_helper() -> None:
    model = synthetic_model("llama")
    text = model.apply_chat_template([{"role": "user", "content": "Hello"}])
    assert text.endswith("<|assistant|>\n") and "Hello" in text
