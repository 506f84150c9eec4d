"""Fast tests of the family profiles, readers and capability derivation (no engine)."""

from __future__ import annotations

import torch
from ie_core.grammar import FAMILIES
from ie_vllm.host.backend import VLLMModel
from ie_vllm.host.capability import capabilities
from ie_vllm.worker.access import column_slice, head_slice, post_first, scaled_out
from ie_vllm.worker.profiles import PROFILES


def test_every_synthetic_family_has_a_profile() -> None:
    # Architectures vLLM 0.32 CPU does not load (docs/notes/vllm_family_support.md) have no map:
    # every point on them is refused with "ie-vllm has no map of ...".
    unmapped = {"qwen3-next", "deepseek-v4", "deepseek-v3", "lfm2", "qwen3.5"}
    unmapped |= {"falcon-h1"}
    missing = [f.slug for f in FAMILIES if f.synthetic and f.hf_classes[0] not in PROFILES]
    assert set(missing) <= unmapped, set(missing) - unmapped


def test_head_slice_reads_and_writes_gpt_neox_per_head_value() -> None:
    heads, hd, tokens = 4, 3, 5
    g = torch.Generator().manual_seed(0)
    fused = torch.randn(1, tokens, heads * 3 * hd, generator=g)
    # HF GPT-NeoX: view [.., heads, 3*hd] and chunk the last dim into q, k, v.
    want = fused.view(1, tokens, heads, 3 * hd).chunk(3, dim=-1)[2].reshape(tokens, heads * hd)
    read, write = head_slice(heads, 3, 2, hd, batched=True)
    assert torch.equal(read((), {}, fused), want)
    # Negative control: the contiguous last third is not the value on this layout.
    wrong, _ = column_slice(2 * heads * hd, 3 * heads * hd, batched=True)
    assert not torch.equal(wrong((), {}, fused), want)
    new = torch.randn(tokens, heads * hd, generator=g)
    out = write((), {}, fused, new)
    assert torch.equal(read((), {}, out), new)
    q_k = out.view(1, tokens, heads, 3 * hd)[..., : 2 * hd]
    assert torch.equal(q_k, fused.view(1, tokens, heads, 3 * hd)[..., : 2 * hd])


def test_scaled_and_first_readers_round_trip() -> None:
    x = torch.randn(1, 4, 6)
    read, write = scaled_out(0.5, batched=True)
    assert torch.equal(read((), {}, x), x[0] * 0.5)
    assert torch.allclose(write((), {}, x, torch.ones(4, 6)), torch.full((1, 4, 6), 2.0))
    stream, other = torch.randn(4, 6), torch.randn(4, 6)
    read, write = post_first()
    assert torch.equal(read((), {}, (stream, other)), stream)
    new = write((), {}, (stream, other), torch.zeros(4, 6))
    assert torch.equal(new[0], torch.zeros(4, 6)) and new[1] is other


def test_capabilities_from_table_info() -> None:
    info = {
        "n_layers": 2,
        "d_model": 8,
        "widths": {"resid_pre.0": 8, "resid_pre.1": 8, "embeddings": 8, "mlp_act.1": 16},
        "writable": ["resid_pre.0", "resid_pre.1", "embeddings"],
        "refused": {"resid_mid": "parallel block", "mlp_act.0": "sparse layer"},
    }
    # The answer goes through the same `_check` a capture does; no engine is needed for it.
    caps = capabilities(VLLMModel(None, info, None, "m", "vllm"))  # type: ignore[arg-type]
    assert caps["resid_pre"].served and caps["resid_pre"].layers == (0, 1)
    assert caps["resid_pre"].writable and caps["resid_pre"].reason == ""
    assert caps["embeddings"].served and caps["embeddings"].layers == ()
    assert not caps["resid_mid"].served and caps["resid_mid"].reason == "parallel block"
    assert caps["mlp_act"].served and caps["mlp_act"].layers == (1,)
    assert caps["mlp_act"].reason == "layer 0: sparse layer" and not caps["mlp_act"].writable
    assert set(caps) >= {"attn_scores", "lm_head"}
    assert not caps["attn_scores"].served and caps["attn_scores"].reason
