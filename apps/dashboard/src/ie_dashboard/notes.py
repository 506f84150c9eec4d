"""What a point holds on one architecture, where a trait changes it (same name, different tensor).

The compare page marks a row when the two architectures' notes differ, not only when one lacks the
point: `attn_out_post` on Gemma 2 is a normed tensor, on Llama the same values as `attn_out`.
"""

from __future__ import annotations

Rule = tuple[str, str]  # (trait, what the point is on an architecture with it)

_RULES: dict[str, tuple[Rule, ...]] = {
    "embeddings": (
        (
            "learned_positions",
            "position embeddings are added outside the module, so this differs from resid_pre.0",
        ),
        (
            "embedding_scale",
            "scaled by sqrt(d_model) (inside the module in HF Gemma 3, outside in vLLM)",
        ),
        ("multipliers", "an embedding multiplier is applied after the module"),
    ),
    "attn_in": (("layernorm", "LayerNorm (with bias) output"),),
    "value": (("gqa", "KV heads wide: fewer heads than the queries; expand by repeat-interleave"),),
    "k_norm_in": (("gqa", "KV heads wide"),),
    "k_norm_out": (("gqa", "KV heads wide"),),
    "attn_scores": (
        ("attn_softcap", "softcapped: c * tanh(x / c) before the mask"),
        ("alibi", "includes the ALiBi position bias"),
        ("sliding_window", "sliding-window layers mask keys past the window"),
        ("hybrid_linear_attention", "only on softmax-attention layers"),
    ),
    "attn_probs": (
        ("attention_sinks", "rows need not sum to 1 (learned sink logits take the rest)"),
        ("sliding_window", "sliding-window layers are zero past the window"),
        ("hybrid_linear_attention", "only on softmax-attention layers"),
    ),
    "attn_out_post": (
        ("sandwich_norm", "after the post-attention norm: a different tensor from attn_out"),
    ),
    "mlp_out_post": (
        ("sandwich_norm", "after the post-MLP norm: a different tensor from mlp_out"),
    ),
    "mlp_in": (("parallel_block", "reads the block input (resid_pre), normed"),),
    "mlp_pre": (("gated_mlp", "the gate projection, before the activation"),),
    "mlp_act": (("gated_mlp", "act(gate) * up"),),
    "mlp_out": (
        ("shared_experts", "includes the shared experts' output"),
        ("moe", "the whole MoE block"),
    ),
    "lm_head": (
        ("logit_softcap", "raw: the model softcaps logits after this"),
        ("multipliers", "raw: the model scales logits after this"),
    ),
}

# What the point is where none of its rules' traits apply (the plain reading of the definition).
_DEFAULTS: dict[str, str] = {
    "embeddings": "the same values as resid_pre.0",
    "attn_out_post": "the same values as attn_out (no post-attention norm)",
    "mlp_out_post": "the same values as mlp_out (no post-MLP norm)",
    "mlp_pre": "the first projection, before the activation",
    "mlp_act": "act(pre)",
    "mlp_in": "reads resid_mid, normed",
}


def point_note(point: str, traits: set[str]) -> str:
    """One line on what `point` holds for an architecture with `traits` ('' when nothing special)."""
    hits = [text for trait, text in _RULES.get(point, ()) if trait in traits]
    return "; ".join(hits) if hits else _DEFAULTS.get(point, "")
