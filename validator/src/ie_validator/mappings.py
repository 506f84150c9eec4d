"""Canonical address -> each engine's hook or accessor name, per family, as data.

`{L}` is the layer. A `Gap` is a declared reason why an engine cannot produce a point on a family;
the sweep turns it into an N/A row with that reason. `docs/ENGINE_HOOK_MAPPINGS.md` is rendered
from these tables (`ie validate mappings --write`).

nnsight and the validator's plain-HF fallback share one accessor syntax: a module path, then
`.input` (first positional argument, else `hidden_states`) or `.output`, optionally `[i]` for a
tuple output.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any

from ie_core.grammar import family_for_architecture


@dataclass(frozen=True)
class Hook:
    name: str
    # The engine's tensor layout when it is not `[batch, seq, ...]`: "bhsd" = [batch, heads, seq,
    # head_dim], transposed to [batch, seq, heads * head_dim] before comparing.
    layout: str = ""

    def at(self, layer: int | None) -> str:
        return self.name.replace("{L}", str(layer)) if layer is not None else self.name


@dataclass(frozen=True)
class Gap:
    reason: str


Entry = Hook | Gap
Table = Mapping[str, Entry]

# HF classes of synthetic families the ie_core registry does not list (yet).
EXTRA_ARCHITECTURES: dict[str, str] = {
    "OlmoForCausalLM": "olmo",
    "GPTBigCodeForCausalLM": "gpt-bigcode",
    "StableLmForCausalLM": "stablelm",
    "FalconForCausalLM": "falcon",
}


def family_key(architecture: str) -> str:
    """The table key of an HF architecture class (`config.architectures[0]`)."""
    family = family_for_architecture(architecture)
    if family is not None:
        return family.slug
    return EXTRA_ARCHITECTURES.get(architecture, architecture)


def _table(base: Mapping[str, Entry], **overrides: Entry | None) -> Table:
    """`base` with overrides; keyword names use the point name, None removes an entry."""
    merged = dict(base)
    for point, entry in overrides.items():
        if entry is None:
            merged.pop(point, None)
        else:
            merged[point] = entry
    return MappingProxyType(merged)


# --- TransformerLens 4.x TransformerBridge ---------------------------------------------------

_TL_SANDWICH_WHY = (
    "TransformerLens' hook_{0}_out fires after the sandwich norm, i.e. it is this project's "
    "{0}_out_post; the bridge's {0}.hook_out is the module output"
)
# Norm outputs are the bridges' hook_out: their hook_normalized fires before the gain is applied
# (x / rms), which the loose fused gate let pass on synthetic gains near 1 but real weights expose.
_TL_BASE: Table = MappingProxyType(
    {
        "embeddings": Hook("hook_embed"),
        "resid_pre": Hook("blocks.{L}.hook_resid_pre"),
        "attn_in": Hook("blocks.{L}.ln1.hook_out"),
        "q": Hook("blocks.{L}.attn.hook_q"),
        "k": Hook("blocks.{L}.attn.hook_k"),
        "q_norm_in": Hook("blocks.{L}.attn.hook_q"),
        "q_norm_out": Hook("blocks.{L}.attn.hook_q_normed", layout="bhsd"),
        "k_norm_in": Hook("blocks.{L}.attn.hook_k"),
        "k_norm_out": Hook("blocks.{L}.attn.hook_k_normed", layout="bhsd"),
        # The bridge fires these after the rotary, [batch, seq, heads, head_dim].
        "q_rot": Hook("blocks.{L}.attn.hook_rot_q"),
        "k_rot": Hook("blocks.{L}.attn.hook_rot_k"),
        "value": Hook("blocks.{L}.attn.hook_v"),
        "attn_scores": Hook("blocks.{L}.attn.hook_attn_scores"),
        "attn_probs": Hook("blocks.{L}.attn.hook_pattern"),
        "z": Hook("blocks.{L}.attn.hook_z"),
        "attn_out": Hook("blocks.{L}.hook_attn_out"),
        "attn_out_post": Hook("blocks.{L}.hook_attn_out"),
        "resid_mid": Hook("blocks.{L}.hook_resid_mid"),
        "mlp_in": Hook("blocks.{L}.ln2.hook_out"),
        "mlp_pre": Hook("blocks.{L}.mlp.hook_pre"),
        "mlp_pre_linear": Hook("blocks.{L}.mlp.hook_pre_linear"),
        "mlp_act": Hook("blocks.{L}.mlp.hook_post"),
        "router_logits": Gap("TransformerLens has no router hook on dense MLPs"),
        "expert_weights": Gap("TransformerLens has no router hook on dense MLPs"),
        "expert_indices": Gap("TransformerLens has no router hook on dense MLPs"),
        "mlp_out": Hook("blocks.{L}.hook_mlp_out"),
        "mlp_out_post": Hook("blocks.{L}.hook_mlp_out"),
        "resid_post": Hook("blocks.{L}.hook_resid_post"),
        "final_norm": Hook("ln_final.hook_out"),
        "lm_head": Hook("unembed.hook_out"),
    }
)
_TL_SANDWICH = {
    "attn_out": Hook("blocks.{L}.attn.hook_out"),
    "mlp_out": Hook("blocks.{L}.mlp.hook_out"),
}
_TL_BLOOM = {
    # The bridge's hook_embed fires after BLOOM's embedding LayerNorm; the embedding module's own
    # output is embed.hook_out.
    "embeddings": Hook("embed.hook_out"),
}
_TL_ONE_NORM = {"mlp_in": Hook("blocks.{L}.ln1.hook_out")}  # parallel block, one LayerNorm
_TL_MOE = {
    "mlp_pre": Gap(
        "TransformerLens' MoE bridge hook_pre is the block input, not an expert projection"
    ),
    "mlp_pre_linear": Gap("TransformerLens' MoE bridge has no per-expert up projection hook"),
    "mlp_act": Gap(
        "TransformerLens' MoE bridge hook_post is the block output, not the down projection input"
    ),
    "router_logits": Hook("blocks.{L}.mlp.gate.hook_out"),
    "expert_weights": Gap(
        "TransformerLens' hook_expert_weights is [tokens, n_experts] (scattered), not the router's top-k in its order"
    ),
    "expert_indices": Hook("blocks.{L}.mlp.hook_expert_indices"),
}

TRANSFORMER_LENS: Mapping[str, Table] = MappingProxyType(
    {
        "default": _TL_BASE,
        "gemma2": _table(_TL_BASE, **_TL_SANDWICH),
        "gemma3": _table(_TL_BASE, **_TL_SANDWICH),
        "olmo2": _table(
            _TL_BASE,
            **_TL_SANDWICH,
            attn_in=Hook("blocks.{L}.attn.hook_in"),
            mlp_in=Hook("blocks.{L}.mlp.hook_in"),
        ),
        # OLMo-3 keeps OLMo-2's post-norm block (it adds sliding-window layers only).
        "olmo3": _table(
            _TL_BASE,
            **_TL_SANDWICH,
            attn_in=Hook("blocks.{L}.attn.hook_in"),
            mlp_in=Hook("blocks.{L}.mlp.hook_in"),
        ),
        # The MLA bridge's hook_v is the decompressed per-head value, [batch, heads, seq, head_dim].
        "deepseek-v3": _table(_TL_BASE, value=Hook("blocks.{L}.attn.hook_v", layout="bhsd")),
        "qwen3-next": _table(
            _TL_BASE,
            q_norm_in=Gap(
                "TransformerLens' hook_q on Qwen3-Next is q_proj's output, which holds the query "
                "and the attention gate together (twice the width); the query alone before its "
                "norm is no hook"
            ),
            q=Gap(
                "TransformerLens' hook_q on Qwen3-Next is q_proj's output, which holds the query "
                "and the attention gate together (twice the width); the query alone is no hook"
            ),
        ),
        "bloom": _table(_TL_BASE, **_TL_BLOOM),
        "granite": _table(
            _TL_BASE,
            # hook_attn_out / hook_mlp_out include residual_multiplier (= this project's *_post):
            # the unscaled module outputs are the bridges' hook_out. The fused gate's rel <= 0.5
            # let the 0.5x scale through, so the table names the right hook instead.
            **_TL_SANDWICH,
            embeddings=Gap(
                "TransformerLens' Granite bridge folds embedding_multiplier into its embedding "
                "hooks (hook_embed and embed.hook_out are the module output times the multiplier); the scaled "
                "tensor is compared as resid_pre.0"
            ),
        ),
        # Granite-4.0-H: hook_attn_out is scaled (this project's attn_out_post) and exists on
        # attention layers only; with experts the bridge has no hook_mlp_out (the MLP branch is
        # block_sparse_moe + shared_mlp summed inline); the router hangs under `moe.gate`.
        "granitemoehybrid": _table(
            _TL_BASE,
            attn_out=Hook("blocks.{L}.attn.hook_out"),
            mlp_out=Gap(
                "TransformerLens' Granite-4.0-H bridge has no hook_mlp_out with experts: the "
                "MLP branch is block_sparse_moe + shared_mlp summed inside the decoder layer"
            ),
            mlp_out_post=Gap(
                "TransformerLens' Granite-4.0-H bridge has no hook_mlp_out with experts (no "
                "module outputs the scaled MLP branch)"
            ),
            router_logits=Hook("blocks.{L}.moe.gate.hook_out"),
            expert_weights=Hook("blocks.{L}.moe.gate.hook_expert_weights"),
            expert_indices=Hook("blocks.{L}.moe.gate.hook_expert_indices"),
            embeddings=Gap(
                "TransformerLens' Granite bridges fold embedding_multiplier into their embedding "
                "hooks; the scaled tensor is compared as resid_pre.0"
            ),
        ),
        "gpt-j": _table(_TL_BASE, **_TL_ONE_NORM),
        "phi": _table(_TL_BASE, **_TL_ONE_NORM),
        "cohere": _table(_TL_BASE, **_TL_ONE_NORM),
        "phi3": _table(_TL_BASE),
        "mixtral": _table(_TL_BASE, **_TL_MOE),
        "qwen3-moe": _table(_TL_BASE, **_TL_MOE),
        "qwen2-moe": _table(_TL_BASE, **_TL_MOE),
    }
)
TL_GAP_NOTES = {
    "sandwich norms": _TL_SANDWICH_WHY.format("attn") + "; the same holds for mlp.",
}

# --- nnsight (and the plain-HF fallback reference) -------------------------------------------

_NO_ATTN_MAP = Gap(
    "nnsight reaches module inputs and outputs; attention scores and probabilities are locals "
    "inside the attention function, not a module boundary"
)
_FUSED_QKV = Gap(
    "the value projection is fused into one qkv module; nnsight sees only the fused output"
)
_FUSED_GATE_UP = Gap("gate and up projections are one fused gate_up_proj module")
_NO_GATE = Gap("plain (ungated) MLP: there is no up projection")
_NO_ROUTER = Gap("dense MLP: no router")
_NO_TOPK = Gap(
    "the router's top-k weights and indices are computed inside the MoE block, not a module output"
)


def _llama_like(prefix: str = "model") -> dict[str, Entry]:
    layer = f"{prefix}.layers[{{L}}]"
    return {
        "embeddings": Hook(f"{prefix}.embed_tokens.output"),
        "resid_pre": Hook(f"{layer}.input"),
        "attn_in": Hook(f"{layer}.self_attn.input"),
        "q": Hook(f"{layer}.self_attn.q_proj.output"),
        "k": Hook(f"{layer}.self_attn.k_proj.output"),
        "q_norm_in": Hook(f"{layer}.self_attn.q_norm.input"),
        "q_norm_out": Hook(f"{layer}.self_attn.q_norm.output"),
        "k_norm_in": Hook(f"{layer}.self_attn.k_norm.input"),
        "k_norm_out": Hook(f"{layer}.self_attn.k_norm.output"),
        "value": Hook(f"{layer}.self_attn.v_proj.output"),
        "attn_scores": _NO_ATTN_MAP,
        "attn_probs": _NO_ATTN_MAP,
        "z": Hook(f"{layer}.self_attn.o_proj.input"),
        "attn_out": Hook(f"{layer}.self_attn.output[0]"),
        "attn_out_post": Hook(f"{layer}.self_attn.output[0]"),
        "resid_mid": Hook(f"{layer}.post_attention_layernorm.input"),
        "mlp_in": Hook(f"{layer}.mlp.input"),
        "mlp_pre": Hook(f"{layer}.mlp.gate_proj.output"),
        "mlp_pre_linear": Hook(f"{layer}.mlp.up_proj.output"),
        "mlp_act": Hook(f"{layer}.mlp.down_proj.input"),
        "router_logits": _NO_ROUTER,
        "expert_weights": _NO_ROUTER,
        "expert_indices": _NO_ROUTER,
        "mlp_out": Hook(f"{layer}.mlp.output"),
        "mlp_out_post": Hook(f"{layer}.mlp.output"),
        "resid_post": Hook(f"{layer}.output"),
        "final_norm": Hook(f"{prefix}.norm.output"),
        "lm_head": Hook("lm_head.output"),
    }


_L = "model.layers[{L}]"
_GRANITE_SCALED = Gap(
    "Granite multiplies the sublayer output by residual_multiplier inside the decoder layer's "
    "forward; no module outputs the scaled tensor that is added to the residual"
)
_GRANITE_MOE_BRANCH = Gap(
    "Granite-4.0-H adds block_sparse_moe(h) + shared_mlp(h) inside the decoder layer's forward; no "
    "module outputs the sum"
)
_LLAMA = MappingProxyType(_llama_like())
_SANDWICH_NN = {
    "attn_out_post": Hook(f"{_L}.post_attention_layernorm.output"),
    "resid_mid": Hook(f"{_L}.pre_feedforward_layernorm.input"),
    "mlp_out_post": Hook(f"{_L}.post_feedforward_layernorm.output"),
}
_MOE_NN = {
    "mlp_pre": Hook(
        f"{_L}.mlp.gate_proj.output"
    ),  # dense layers only; sparse layers lack the module
    "router_logits": Hook(f"{_L}.mlp.gate.output[0]"),
    "expert_weights": _NO_TOPK,
    "expert_indices": _NO_TOPK,
}
_H = "transformer.h[{L}]"
_GPT2 = {
    "embeddings": Hook("transformer.wte.output"),
    "resid_pre": Hook(f"{_H}.input"),
    "attn_in": Hook(f"{_H}.attn.input"),
    "value": _FUSED_QKV,
    "attn_scores": _NO_ATTN_MAP,
    "attn_probs": _NO_ATTN_MAP,
    "z": Hook(f"{_H}.attn.c_proj.input"),
    "attn_out": Hook(f"{_H}.attn.output[0]"),
    "attn_out_post": Hook(f"{_H}.attn.output[0]"),
    "resid_mid": Hook(f"{_H}.ln_2.input"),
    "mlp_in": Hook(f"{_H}.mlp.input"),
    "mlp_pre": Hook(f"{_H}.mlp.c_fc.output"),
    "mlp_pre_linear": _NO_GATE,
    "mlp_act": Hook(f"{_H}.mlp.c_proj.input"),
    "mlp_out": Hook(f"{_H}.mlp.output"),
    "mlp_out_post": Hook(f"{_H}.mlp.output"),
    "resid_post": Hook(f"{_H}.output"),
    "final_norm": Hook("transformer.ln_f.output"),
    "lm_head": Hook("lm_head.output"),
}
_NX = "gpt_neox.layers[{L}]"
_D = "model.decoder.layers[{L}]"

NNSIGHT: Mapping[str, Table] = MappingProxyType(
    {
        "default": _LLAMA,
        "gemma2": _table(_LLAMA, **_SANDWICH_NN),
        "gemma3": _table(
            _LLAMA,
            **_SANDWICH_NN,
            # Gemma 3 normalizes q and k after the head transpose: [batch, heads, seq, head_dim].
            q_norm_in=Hook(f"{_L}.self_attn.q_norm.input", layout="bhsd"),
            q_norm_out=Hook(f"{_L}.self_attn.q_norm.output", layout="bhsd"),
            k_norm_in=Hook(f"{_L}.self_attn.k_norm.input", layout="bhsd"),
            k_norm_out=Hook(f"{_L}.self_attn.k_norm.output", layout="bhsd"),
        ),
        "granite": _table(_LLAMA, attn_out_post=_GRANITE_SCALED, mlp_out_post=_GRANITE_SCALED),
        # Granite-4.0-H: the MLP branch is block_sparse_moe + shared_mlp summed in the layer's
        # forward; the router returns (indices, weights, logits). Mamba2 layers have no self_attn.
        "granitemoehybrid": _table(
            _LLAMA,
            attn_out_post=_GRANITE_SCALED,
            mlp_out_post=_GRANITE_SCALED,
            mlp_in=Hook(f"{_L}.post_attention_layernorm.output"),
            mlp_out=_GRANITE_MOE_BRANCH,
            router_logits=Hook(f"{_L}.block_sparse_moe.router.output[2]"),
            expert_weights=Hook(f"{_L}.block_sparse_moe.router.output[1]"),
            expert_indices=Hook(f"{_L}.block_sparse_moe.router.output[0]"),
        ),
        "olmo2": _table(
            _LLAMA,
            **{
                **_SANDWICH_NN,
                # No pre-MLP norm: the MLP reads resid_mid itself.
                "resid_mid": Hook(f"{_L}.mlp.input"),
            },
        ),
        "olmo3": _table(_LLAMA, **{**_SANDWICH_NN, "resid_mid": Hook(f"{_L}.mlp.input")}),
        # HF GptOssMLP returns (routed output, router scores).
        "gpt-oss": _table(
            _LLAMA, mlp_out=Hook(f"{_L}.mlp.output[0]"), mlp_out_post=Hook(f"{_L}.mlp.output[0]")
        ),
        "mixtral": _table(_LLAMA, **_MOE_NN),
        "qwen3-moe": _table(_LLAMA, **_MOE_NN),
        "qwen2-moe": _table(_LLAMA, **_MOE_NN),
        "phi3": _table(
            _LLAMA, value=_FUSED_QKV, mlp_pre=_FUSED_GATE_UP, mlp_pre_linear=_FUSED_GATE_UP
        ),
        "starcoder2": _table(
            _LLAMA,
            mlp_pre=Hook(f"{_L}.mlp.c_fc.output"),
            mlp_pre_linear=_NO_GATE,
            mlp_act=Hook(f"{_L}.mlp.c_proj.input"),
        ),
        "cohere": _table(_LLAMA, resid_mid=None),
        "phi": _table(
            _LLAMA,
            z=Hook(f"{_L}.self_attn.dense.input"),
            resid_mid=None,
            mlp_pre=Hook(f"{_L}.mlp.fc1.output"),
            mlp_pre_linear=_NO_GATE,
            mlp_act=Hook(f"{_L}.mlp.fc2.input"),
            final_norm=Hook("model.final_layernorm.output"),
        ),
        "gpt2": MappingProxyType(_GPT2),
        "gpt-bigcode": MappingProxyType(_GPT2),
        "gpt-j": _table(
            _GPT2,
            value=Hook(f"{_H}.attn.v_proj.output"),
            z=Hook(f"{_H}.attn.out_proj.input"),
            resid_mid=None,
            mlp_pre=Hook(f"{_H}.mlp.fc_in.output"),
            mlp_act=Hook(f"{_H}.mlp.fc_out.input"),
            resid_post=Hook(f"{_H}.output[0]"),  # GPTJBlock returns (hidden, attn_weights)
        ),
        "gpt-neox": MappingProxyType(
            {
                "embeddings": Hook("gpt_neox.embed_in.output"),
                "resid_pre": Hook(f"{_NX}.input"),
                "attn_in": Hook(f"{_NX}.attention.input"),
                "value": _FUSED_QKV,
                "attn_scores": _NO_ATTN_MAP,
                "attn_probs": _NO_ATTN_MAP,
                "z": Hook(f"{_NX}.attention.dense.input"),
                "attn_out": Hook(f"{_NX}.attention.output[0]"),
                "attn_out_post": Hook(f"{_NX}.attention.output[0]"),
                "mlp_in": Hook(f"{_NX}.mlp.input"),
                "mlp_pre": Hook(f"{_NX}.mlp.dense_h_to_4h.output"),
                "mlp_pre_linear": _NO_GATE,
                "mlp_act": Hook(f"{_NX}.mlp.dense_4h_to_h.input"),
                "mlp_out": Hook(f"{_NX}.mlp.output"),
                "mlp_out_post": Hook(f"{_NX}.mlp.output"),
                "resid_post": Hook(f"{_NX}.output"),
                "final_norm": Hook("gpt_neox.final_layer_norm.output"),
                "lm_head": Hook("embed_out.output"),
            }
        ),
        "opt": MappingProxyType(
            {
                "embeddings": Hook("model.decoder.embed_tokens.output"),
                "resid_pre": Hook(f"{_D}.input"),
                "attn_in": Hook(f"{_D}.self_attn.input"),
                "value": Hook(f"{_D}.self_attn.v_proj.output"),
                "attn_scores": _NO_ATTN_MAP,
                "attn_probs": _NO_ATTN_MAP,
                "z": Hook(f"{_D}.self_attn.out_proj.input"),
                "attn_out": Hook(f"{_D}.self_attn.output[0]"),
                "attn_out_post": Hook(f"{_D}.self_attn.output[0]"),
                "resid_mid": Hook(f"{_D}.final_layer_norm.input"),
                "mlp_in": Hook(f"{_D}.fc1.input"),
                "mlp_pre": Hook(f"{_D}.fc1.output"),
                "mlp_pre_linear": _NO_GATE,
                "mlp_act": Hook(f"{_D}.fc2.input"),
                "mlp_out": Hook(f"{_D}.fc2.output"),
                "mlp_out_post": Hook(f"{_D}.fc2.output"),
                "resid_post": Hook(f"{_D}.output"),
                "final_norm": Hook("model.decoder.final_layer_norm.output"),
                "lm_head": Hook("lm_head.output"),
            }
        ),
        "bloom": MappingProxyType(
            {
                "embeddings": Hook("transformer.word_embeddings.output"),
                "resid_pre": Hook(f"{_H}.input"),
                "attn_in": Hook(f"{_H}.self_attention.input"),
                "value": _FUSED_QKV,
                "attn_scores": _NO_ATTN_MAP,
                "attn_probs": _NO_ATTN_MAP,
                # BloomAttention and BloomMLP add the residual inside; their dense layers do not.
                "z": Hook(f"{_H}.self_attention.dense.input"),
                "attn_out": Hook(f"{_H}.self_attention.dense.output"),
                "attn_out_post": Hook(f"{_H}.self_attention.dense.output"),
                "resid_mid": Hook(f"{_H}.post_attention_layernorm.input"),
                "mlp_in": Hook(f"{_H}.mlp.input"),
                "mlp_pre": Hook(f"{_H}.mlp.dense_h_to_4h.output"),
                "mlp_pre_linear": _NO_GATE,
                "mlp_act": Hook(f"{_H}.mlp.dense_4h_to_h.input"),
                "mlp_out": Hook(f"{_H}.mlp.dense_4h_to_h.output"),
                "mlp_out_post": Hook(f"{_H}.mlp.dense_4h_to_h.output"),
                "resid_post": Hook(f"{_H}.output[0]"),  # BloomBlock returns (hidden, attn_weights)
                "final_norm": Hook("transformer.ln_f.output"),
                "lm_head": Hook("lm_head.output"),
            }
        ),
        "falcon": MappingProxyType(
            {
                "embeddings": Hook("transformer.word_embeddings.output"),
                "resid_pre": Hook(f"{_H}.input"),
                "attn_in": Hook(f"{_H}.self_attention.input"),
                "value": _FUSED_QKV,
                "attn_scores": _NO_ATTN_MAP,
                "attn_probs": _NO_ATTN_MAP,
                "z": Hook(f"{_H}.self_attention.dense.input"),
                "attn_out": Hook(f"{_H}.self_attention.output[0]"),
                "attn_out_post": Hook(f"{_H}.self_attention.output[0]"),
                "mlp_in": Hook(f"{_H}.mlp.input"),
                "mlp_pre": Hook(f"{_H}.mlp.dense_h_to_4h.output"),
                "mlp_pre_linear": _NO_GATE,
                "mlp_act": Hook(f"{_H}.mlp.dense_4h_to_h.input"),
                "mlp_out": Hook(f"{_H}.mlp.output"),
                "mlp_out_post": Hook(f"{_H}.mlp.output"),
                "resid_post": Hook(f"{_H}.output[0]"),  # FalconDecoderLayer returns a tuple
                "final_norm": Hook("transformer.ln_f.output"),
                "lm_head": Hook("lm_head.output"),
            }
        ),
    }
)

# --- nnterp 1.3 StandardizedTransformer ------------------------------------------------------

_NNTERP_ONLY = Gap(
    "nnterp standardizes only the residual, attention/MLP in-out, probabilities and logits"
)
_NNTERP_BASE: Table = MappingProxyType(
    {
        "embeddings": Hook("token_embeddings"),
        "resid_pre": Hook("layers_input[{L}]"),
        "attn_in": Hook("attentions_input[{L}]"),
        "attn_probs": Hook("attention_probabilities[{L}]"),
        "attn_out": Hook("attentions_output[{L}]"),
        "mlp_in": Hook("mlps_input[{L}]"),
        "mlp_out": Hook("mlps_output[{L}]"),
        "resid_post": Hook("layers_output[{L}]"),
        "final_norm": Hook("ln_final.output"),
        "lm_head": Hook("logits"),
    }
)
_NNTERP_BLOOM_RESIDUAL = Gap(
    "HF BLOOM's attention and MLP modules add the residual inside their forward, so nnterp's "
    "attentions_output / mlps_output are attn_out + residual, not the sublayer's output"
)
_NNTERP_TRANSFORMED_LOGITS = Gap(
    "nnterp's `logits` is the model output after the family's logit scale / softcap; lm_head is raw"
)

NNTERP: Mapping[str, Table] = MappingProxyType(
    {
        "default": _NNTERP_BASE,
        "gpt2": _table(
            _NNTERP_BASE,
            attn_probs=Gap("nnterp 1.3 does not expose attention_probabilities on GPT-2"),
        ),
        "bloom": _table(
            _NNTERP_BASE, attn_out=_NNTERP_BLOOM_RESIDUAL, mlp_out=_NNTERP_BLOOM_RESIDUAL
        ),
        "gemma2": _table(_NNTERP_BASE, lm_head=_NNTERP_TRANSFORMED_LOGITS),
        "falcon": _table(
            _NNTERP_BASE,
            attn_probs=Gap(
                "nnterp 1.3's attention-probability hook walks the attention source for "
                "attention_interface_0, which HF Falcon's attention does not call; "
                "StandardizedTransformer(enable_attention_probs=True) raises"
            ),
        ),
        "granite": _table(_NNTERP_BASE, lm_head=_NNTERP_TRANSFORMED_LOGITS),
        "cohere": _table(_NNTERP_BASE, lm_head=_NNTERP_TRANSFORMED_LOGITS),
    }
)
NNTERP_DEFAULT_GAP = _NNTERP_ONLY
# StandardizedTransformer arguments for module names nnterp 1.3 does not know by itself.
NNTERP_LOAD_KWARGS: dict[str, dict[str, Any]] = {
    "phi": {"rename": {"final_layernorm": "ln_final"}},
}

# --- vLLM: what the ie_core registry says each backend serves --------------------------------

ENGINE_TABLES: dict[str, Mapping[str, Table]] = {
    "transformer-lens": TRANSFORMER_LENS,
    "nnsight": NNSIGHT,
    "nnterp": NNTERP,
}
DEFAULT_GAPS: dict[str, Gap] = {
    "transformer-lens": Gap("TransformerLens has no hook for this point"),
    "nnsight": Gap("no module boundary carries this point on this family"),
    "nnterp": NNTERP_DEFAULT_GAP,
}


def lookup(engine: str, family: str, point: str) -> Entry:
    """The engine's name for `point` on `family`, or the declared gap."""
    if engine in ("vllm", "vllm-static", "eager"):
        from ie_core.capabilities import declared_serving
        from ie_core.grammar import get_point

        serving = declared_serving(engine, point)
        if serving is None:
            return Gap(f"no committed {engine} capability sweep declares {point}")
        if serving.served:
            return Hook(f"{point}.{{L}}" if get_point(point).per_layer else point)
        return Gap(serving.reason)
    tables = ENGINE_TABLES[engine]
    table = tables.get(family, tables["default"])
    return table.get(point, DEFAULT_GAPS[engine])
