"""`model.cfg` and the weights by TransformerLens's names on eager SmolLM2 (issue 68).

TransformerLens's conventions, as facts (TransformerLens 4.3, no weight processing): W_E
`[d_vocab, d_model]`, W_U `[d_model, d_vocab]`, W_Q `[n_layers, n_heads, d_model, d_head]`, W_K and
W_V over the KV heads, W_O `[n_layers, n_heads, d_head, d_model]`, W_in / W_gate `[n_layers,
d_model, d_mlp]`, W_out `[n_layers, d_mlp, d_model]`, b_U zeros where the unembed has no bias,
other missing biases refused. Checked against the HF modules rearranged here and applied to a
vector (a transposed or mis-split weight of the right shape fails), and against TransformerLens
itself where it is installed.
"""

from __future__ import annotations

import pytest
import torch
from ie_core import load_model
from ie_core.errors import UnsupportedOperationError

SMOLLM2 = "HuggingFaceTB/SmolLM2-135M-Instruct"
SHAPES = {
    "W_E": (49152, 576), "W_U": (576, 49152), "b_U": (49152,),
    "W_Q": (30, 9, 576, 64), "W_K": (30, 3, 576, 64), "W_V": (30, 3, 576, 64),
    "W_O": (30, 9, 64, 576), "W_in": (30, 576, 1536), "W_gate": (30, 576, 1536),
    "W_out": (30, 1536, 576),
}  # fmt: skip
CFG = {
    "n_layers": 30, "d_model": 576, "n_heads": 9, "d_head": 64, "d_vocab": 49152,
    "d_vocab_out": 49152, "n_ctx": 8192, "act_fn": "silu", "normalization_type": "RMS",
    "n_key_value_heads": 3, "d_mlp": 1536, "positional_embedding_type": "rotary",
    "gated_mlp": True, "final_rms": True, "parallel_attn_mlp": False, "attn_only": False,
    "tie_word_embeddings": True,
}  # fmt: skip


@pytest.fixture(scope="module")
def smollm2():
    return load_model(SMOLLM2, backend="eager", device="cpu", dtype="float32")


def test_cfg_has_transformer_lens_names_and_values(smollm2) -> None:
    cfg = smollm2.cfg
    assert {k: getattr(cfg, k) for k in CFG} == CFG
    assert cfg.original_architecture == "LlamaForCausalLM"
    assert abs(cfg.eps - 1e-5) < 1e-9


def test_weights_have_transformer_lens_shapes_and_equal_the_hf_modules(smollm2) -> None:
    for name, shape in SHAPES.items():
        assert tuple(getattr(smollm2, name).shape) == shape, name
    hf = smollm2.hf_model
    layer, head = 7, 4
    attn, mlp = hf.model.layers[layer].self_attn, hf.model.layers[layer].mlp
    x = torch.randn(576, generator=torch.Generator().manual_seed(0))
    cols = slice(head * 64, (head + 1) * 64)
    kv_cols = slice((head // 3) * 64, (head // 3 + 1) * 64)
    with torch.no_grad():
        # x @ W_Q[l, h] is head h's query; the KV head h // 3 serves it (GQA).
        assert torch.allclose(x @ smollm2.W_Q[layer, head], attn.q_proj(x)[cols], atol=1e-5)
        assert torch.allclose(x @ smollm2.W_K[layer, head // 3], attn.k_proj(x)[kv_cols], atol=1e-5)
        assert torch.allclose(x @ smollm2.W_V[layer, head // 3], attn.v_proj(x)[kv_cols], atol=1e-5)
        z = torch.randn(9, 64, generator=torch.Generator().manual_seed(1))
        summed = torch.einsum("hd,hdm->m", z, smollm2.W_O[layer])
        assert torch.allclose(summed, attn.o_proj(z.reshape(-1)), atol=1e-5)
        assert torch.allclose(x @ smollm2.W_in[layer], mlp.up_proj(x), atol=1e-5)
        assert torch.allclose(x @ smollm2.W_gate[layer], mlp.gate_proj(x), atol=1e-5)
        h = torch.randn(1536, generator=torch.Generator().manual_seed(2))
        assert torch.allclose(h @ smollm2.W_out[layer], mlp.down_proj(h), atol=1e-5)
        assert torch.allclose(x @ smollm2.W_U, hf.lm_head(x), atol=1e-4)
        assert torch.equal(smollm2.W_E, hf.model.embed_tokens.weight)
        # Negative control: the query weight without TL's transpose (same numbers, [h, d_head,
        # d_model] read as [h, d_model, d_head]) gives another vector.
        wrong = attn.q_proj.weight.reshape(9, 576, 64)[head]
        assert not torch.allclose(x @ wrong, attn.q_proj(x)[cols], atol=1e-3)
    assert torch.count_nonzero(smollm2.b_U) == 0


def test_missing_biases_and_positions_are_refused_by_name(smollm2) -> None:
    for name in ("b_Q", "b_O", "b_in", "W_pos"):
        with pytest.raises(UnsupportedOperationError, match=name):
            getattr(smollm2, name)


def test_equal_to_transformer_lens_itself(smollm2) -> None:
    bridge_cls = pytest.importorskip("transformer_lens.model_bridge").TransformerBridge
    from ie_core.models import resolve_model_path

    path = resolve_model_path(SMOLLM2)
    bridge = bridge_cls.boot_transformers(str(path), device="cpu", dtype=torch.float32)
    for name in SHAPES:
        assert torch.equal(getattr(smollm2, name), getattr(bridge, name)), name
    for field, value in CFG.items():
        assert getattr(bridge.cfg, field) == value, field
