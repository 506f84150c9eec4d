"""Module names and residual conventions of each family layout on vLLM's module tree.

Families that vLLM implements natively use vLLM's own names; families that vLLM runs through its
Transformers modeling backend (GPT-NeoX, OLMo, OLMo-2, Phi, StarCoder2, GPT-BigCode in vLLM 0.32)
keep Hugging Face's module tree with fused projections swapped in, and see `[1, tokens, width]`
tensors (`batched`).
"""

from __future__ import annotations

from dataclasses import dataclass, replace

__all__ = ["PROFILES", "Profile", "profile_for"]


@dataclass(frozen=True)
class Profile:
    """Module names of one family layout on vLLM's tree (relative to the causal-LM module)."""

    layers: str
    embed: str
    final_norm: str
    attn: str = "self_attn"
    qkv: str = "qkv_proj"
    o_proj: str = "o_proj"
    mlps: tuple[str, ...] = ("mlp", "block_sparse_moe")
    down: str = "down_proj"
    router: str = "gate"
    pre_mlp_norm: str = "post_attention_layernorm"  # its input is resid_mid
    post_attn_norm: str | None = None  # sandwich norms define the *_post points
    post_mlp_norm: str | None = None
    fused_residual: bool = True  # decoder layers take and return (hidden, residual)
    hidden_arg: int = 1  # position of hidden_states in the decoder layer's call
    # Position of the residual in the decoder layer's call (None: right after hidden_states) and
    # of hidden_states in the attention module's call (None: 1 on fused layers, else 0); gpt-oss
    # calls layer(hidden, positions, residual) and attn(hidden, positions).
    residual_arg: int | None = None
    attn_hidden_arg: int | None = None
    embed_scale: bool = False  # vLLM multiplies the embedding output outside the module
    # A layer returns (stream, something else): resid_post is the first item (Cohere, StableLM).
    first_out: bool = False
    parallel: bool = False  # attention and MLP read the same input: no resid_mid
    resid_mid_at_mlp: bool = False  # no pre-MLP norm: the MLP's input is resid_mid (OLMo-2)
    value_per_head: bool = False  # fused qkv laid out [q, k, v] per head (HF GPT-NeoX)
    block_mlp: tuple[str, str] | None = None  # (first, last) MLP linears on the block (OPT)
    batched: bool = False  # Transformers backend: tensors are [1, tokens, width]
    # HF config attribute Granite-style models multiply sublayer outputs by before the residual
    # add. (Granite's embedding_multiplier also acts outside the embedding module, in HF as in
    # vLLM, so `embeddings` is the module's own output there, as eager reads it.)
    residual_multiplier: str | None = None
    # Token mixers some layers have instead of attention (Granite-4.0-H's Mamba2 `mamba`): their
    # input and output are attn_in / attn_out; value, z and the attention maps do not exist there.
    mixers: tuple[str, ...] = ()
    # A dense MLP the layer runs beside the routed one and sums inline (Granite-4.0-H's
    # `shared_mlp`): mlp_out is the sum, and mlp_in the norm output both read.
    shared_mlp: str | None = None


LLAMA = Profile(layers="model.layers", embed="model.embed_tokens", final_norm="model.norm")
SANDWICH = Profile(
    layers="model.layers",
    embed="model.embed_tokens",
    final_norm="model.norm",
    pre_mlp_norm="pre_feedforward_layernorm",
    post_attn_norm="post_attention_layernorm",
    post_mlp_norm="post_feedforward_layernorm",
    embed_scale=True,
)
GPT2 = Profile(
    layers="transformer.h",
    embed="transformer.wte",
    final_norm="transformer.ln_f",
    attn="attn",
    qkv="c_attn",
    o_proj="c_proj",
    mlps=("mlp",),
    down="c_proj",
    pre_mlp_norm="ln_2",
    fused_residual=False,
    hidden_arg=0,
)
# vLLM-native layers that take (positions, hidden) and return one tensor.
_UNFUSED = replace(LLAMA, fused_residual=False, mlps=("mlp",))
# The Transformers modeling backend: HF decoder layers called with hidden_states first.
_HF = replace(_UNFUSED, hidden_arg=0, batched=True)
# vLLM's BLOOM attention / MLP return their own output (HF's add the residual inside), and
# vLLM repacks the per-head [q, k, v] weights into contiguous q | k | v at load.
BLOOM = replace(
    _UNFUSED,
    layers="transformer.h",
    embed="transformer.word_embeddings",
    final_norm="transformer.ln_f",
    attn="self_attention",
    qkv="query_key_value",
    o_proj="dense",
    down="dense_4h_to_h",
)

PROFILES: dict[str, Profile] = {
    "LlamaForCausalLM": LLAMA,
    "MistralForCausalLM": LLAMA,
    "Qwen2ForCausalLM": LLAMA,
    "Qwen3ForCausalLM": LLAMA,
    "MixtralForCausalLM": LLAMA,
    "Qwen3MoeForCausalLM": LLAMA,
    "Qwen2MoeForCausalLM": LLAMA,
    "Phi3ForCausalLM": LLAMA,
    "GemmaForCausalLM": Profile(
        layers="model.layers", embed="model.embed_tokens", final_norm="model.norm", embed_scale=True
    ),
    "Gemma2ForCausalLM": SANDWICH,
    "Gemma3ForCausalLM": SANDWICH,
    "GPT2LMHeadModel": GPT2,
    # vLLM-native families.
    "GPTJForCausalLM": replace(
        _UNFUSED,
        layers="transformer.h",
        embed="transformer.wte",
        final_norm="transformer.ln_f",
        attn="attn",
        o_proj="out_proj",
        down="fc_out",
        parallel=True,
    ),
    "OPTForCausalLM": replace(
        _UNFUSED,
        layers="model.decoder.layers",
        embed="model.decoder.embed_tokens",
        final_norm="model.decoder.final_layer_norm",
        o_proj="out_proj",
        mlps=(),
        pre_mlp_norm="final_layer_norm",
        hidden_arg=0,
        block_mlp=("fc1", "fc2"),
    ),
    "BloomForCausalLM": BLOOM,
    # Falcon names its modules as BLOOM does; its blocks are parallel.
    "FalconForCausalLM": replace(BLOOM, parallel=True),
    "GraniteForCausalLM": replace(_UNFUSED, residual_multiplier="residual_multiplier"),
    # Granite-4.0-H: layers called with keywords return (stream, resid_mid); the next layer takes
    # only the stream. Mamba2 or attention per layer; routed experts plus a shared MLP.
    "GraniteMoeHybridForCausalLM": replace(
        _UNFUSED,
        first_out=True,
        mlps=("block_sparse_moe",),
        residual_multiplier="residual_multiplier",
        mixers=("mamba",),
        shared_mlp="shared_mlp",
    ),
    "CohereForCausalLM": replace(_UNFUSED, first_out=True, parallel=True),
    "StableLmForCausalLM": replace(_UNFUSED, first_out=True),
    # vLLM-native gpt-oss: fused (hidden, residual) pair, but positions sit between them, the
    # attention takes hidden first, and the MoE's router is named `router`.
    "GptOssForCausalLM": replace(
        LLAMA,
        embed="model.embedding",
        attn="attn",
        mlps=("mlp",),
        router="router",
        hidden_arg=0,
        residual_arg=2,
        attn_hidden_arg=0,
    ),
    "Glm4MoeForCausalLM": LLAMA,
    # Transformers-backend families (HF module names).
    "GPTNeoXForCausalLM": replace(
        _HF,
        embed="model.embed_in",
        final_norm="model.final_layer_norm",
        attn="attention",
        qkv="query_key_value",
        o_proj="dense",
        down="dense_4h_to_h",
        parallel=True,
        value_per_head=True,
    ),
    "OlmoForCausalLM": _HF,
    "Olmo2ForCausalLM": replace(
        _HF,
        pre_mlp_norm="",
        post_attn_norm="post_attention_layernorm",
        post_mlp_norm="post_feedforward_layernorm",
        resid_mid_at_mlp=True,
    ),
    "Olmo3ForCausalLM": replace(
        _HF,
        pre_mlp_norm="",
        post_attn_norm="post_attention_layernorm",
        post_mlp_norm="post_feedforward_layernorm",
        resid_mid_at_mlp=True,
    ),
    "PhiForCausalLM": replace(
        _HF, final_norm="model.final_layernorm", o_proj="dense", down="fc2", parallel=True
    ),
    "Starcoder2ForCausalLM": replace(_HF, down="c_proj"),
    "GPTBigCodeForCausalLM": replace(
        _HF,
        layers="model.h",
        embed="model.wte",
        final_norm="model.ln_f",
        attn="attn",
        qkv="c_attn",
        o_proj="c_proj",
        down="c_proj",
        pre_mlp_norm="ln_2",
    ),
}


def profile_for(architecture: str) -> Profile | None:
    return PROFILES.get(architecture)
