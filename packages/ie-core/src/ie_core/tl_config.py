"""`model.cfg`: a model's shape under TransformerLens's names, the same on every backend.

Built from the Hugging Face config the backend loaded (eager's model, vLLM's engine) or, where a
backend has none (a remote model), from its `ModelInfo`: fields it cannot know are None. The names
and conventions are TransformerLens's (`HookedTransformerConfig` / `TransformerBridgeConfig`):
`d_head` is the per-head width, `n_key_value_heads` the KV heads of grouped-query attention,
`normalization_type` "RMS" or "LN" (unfolded: no `fold_ln` processing here), `n_ctx` the
config's longest position, `d_vocab_out` the unembed's width.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass
from typing import Any

from ie_core.grammar import Trait, family_for_architecture

__all__ = ["TLConfig", "tl_config"]


@dataclass(frozen=True)
class TLConfig:
    """TransformerLens's config fields for one model (None where the source does not say)."""

    n_layers: int
    d_model: int
    d_vocab: int
    d_vocab_out: int
    n_heads: int | None = None
    d_head: int | None = None
    n_key_value_heads: int | None = None
    d_mlp: int | None = None
    n_ctx: int | None = None
    act_fn: str | None = None
    eps: float | None = None
    normalization_type: str | None = None
    final_rms: bool = False
    positional_embedding_type: str | None = None
    gated_mlp: bool = False
    parallel_attn_mlp: bool = False
    attn_only: bool = False
    tie_word_embeddings: bool = False
    original_architecture: str = ""
    model_name: str = ""

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def _get(config: Any, *names: str) -> Any:
    """The first of `names` the config has (an HF config object or a plain mapping)."""
    for name in names:
        value = config.get(name) if isinstance(config, Mapping) else getattr(config, name, None)
        if value is not None:
            return value
    return None


def _int(value: Any) -> int | None:
    return None if value is None else int(value)


def tl_config(
    hf_config: Any | None,
    *,
    n_layers: int,
    d_model: int,
    d_vocab: int,
    architecture: str = "",
    model_name: str = "",
    n_heads: int | None = None,
) -> TLConfig:
    """TransformerLens's fields from `hf_config` (the text config of a multimodal model), with
    the model's own counts (`n_layers`, `d_model`, `d_vocab`: what the backend serves) winning.
    Without a config only those counts (and `n_heads` where known) are filled."""
    family = family_for_architecture(architecture) if architecture else None
    traits = family.traits if family is not None else frozenset()
    if hf_config is None:
        return TLConfig(
            n_layers=n_layers, d_model=d_model, d_vocab=d_vocab, d_vocab_out=d_vocab,
            n_heads=n_heads, original_architecture=architecture, model_name=model_name,
        )  # fmt: skip
    heads = _int(_get(hf_config, "num_attention_heads", "n_head", "num_heads")) or n_heads
    d_head = _int(_get(hf_config, "head_dim"))
    if d_head is None and heads:
        d_head = d_model // heads
    d_mlp = _int(_get(hf_config, "intermediate_size", "n_inner", "ffn_hidden_size"))
    if d_mlp is None and Trait.MOE not in traits:
        d_mlp = 4 * d_model  # GPT-2's n_inner=None means 4 * n_embd
    rms = Trait.LAYERNORM not in traits and _get(hf_config, "layer_norm_epsilon") is None
    if Trait.ALIBI in traits:
        positions = "alibi"
    elif Trait.LEARNED_POSITIONS in traits:
        positions = "standard"
    else:
        positions = "rotary"
    tied = _get(hf_config, "tie_word_embeddings")
    return TLConfig(
        n_layers=n_layers,
        d_model=d_model,
        d_vocab=d_vocab,
        d_vocab_out=d_vocab,
        n_heads=heads,
        d_head=d_head,
        n_key_value_heads=_int(_get(hf_config, "num_key_value_heads", "num_kv_heads")),
        d_mlp=d_mlp,
        n_ctx=_int(_get(hf_config, "max_position_embeddings", "n_positions", "n_ctx")),
        act_fn=_get(hf_config, "hidden_act", "activation_function", "hidden_activation"),
        eps=_get(hf_config, "rms_norm_eps", "layer_norm_epsilon", "layer_norm_eps", "norm_eps"),
        normalization_type="RMS" if rms else "LN",
        final_rms=rms,
        positional_embedding_type=positions,
        gated_mlp=Trait.GATED_MLP in traits,
        parallel_attn_mlp=Trait.PARALLEL_BLOCK in traits,
        tie_word_embeddings=bool(tied) if tied is not None else Trait.TIED_EMBEDDINGS in traits,
        original_architecture=architecture,
        model_name=model_name,
    )
