"""The 38 standardized points: what each tensor is, how wide, and its names in peer engines.

This registry says what a point *is*; how a backend is designed to reach it (`Serving`: a hook, a
recompute, a tap, or why not) is the backend plugin's declaration (`BackendPlugin.serving`). Whether a backend serves a point on a family is that
backend's own answer (`model.capabilities()`, committed per backend by the sweep in
`ie_core.capabilities`); `docs/SUPPORTED_POINTS.md` renders both.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum

from ie_core.grammar.address import Address


class Scope(StrEnum):
    TRUNK = "trunk"
    LAYER = "layer"


class Role(StrEnum):
    """`read_write` points can be steered; `capture` points are read only."""

    READ_WRITE = "read_write"
    CAPTURE = "capture"


class Width(StrEnum):
    D = "d_model"
    H = "n_heads*head_dim"
    KV = "n_kv_heads*head_dim"
    N = "d_mlp"
    E = "n_experts"
    K = "experts_per_token"
    S = "n_streams"
    SD = "n_streams x d_model"
    SS = "n_streams x n_streams"
    HQK = "heads x q x k"
    VOCAB = "vocab"


class Service(StrEnum):
    HOOK = "hook"
    RECOMPUTE = "recompute"
    STATIC_TAP = "static tap"
    NOT_SERVED = "not served"


@dataclass(frozen=True)
class Serving:
    """How one backend produces a point; `reason` explains a refusal or a recompute."""

    service: Service
    reason: str = ""

    @property
    def served(self) -> bool:
        return self.service is not Service.NOT_SERVED


@dataclass(frozen=True)
class PeerNames:
    """The same tensor in other engines (Llama module naming for nnsight); None where absent."""

    transformer_lens: str | None = None
    nnsight: str | None = None
    nnterp: str | None = None


@dataclass(frozen=True)
class Point:
    name: str
    scope: Scope
    width: Width
    role: Role
    definition: str
    requires: str | None  # family trait the point needs (see families.Trait), None = every family
    peers: PeerNames

    @property
    def per_layer(self) -> bool:
        return self.scope is Scope.LAYER

    @property
    def writable(self) -> bool:
        return self.role is Role.READ_WRITE

    def address(self, layer: int | None = None, stream: int | None = None) -> Address:
        return Address(self.name, layer if self.per_layer else None, stream)


def _p(
    name: str,
    scope: Scope,
    width: Width,
    role: Role,
    definition: str,
    *,
    requires: str | None = None,
    tl: str | None = None,
    nnsight: str | None = None,
    nnterp: str | None = None,
) -> Point:
    return Point(name, scope, width, role, definition, requires, PeerNames(tl, nnsight, nnterp))


L, T = Scope.LAYER, Scope.TRUNK
RW, CAP = Role.READ_WRITE, Role.CAPTURE

POINTS: tuple[Point, ...] = (
    _p("embeddings", T, Width.D, RW,
       "Output of the token-embedding module. Differs from resid_pre.0 where positions or a scale are added outside the module (GPT-2 positions; Gemma's sqrt(d_model) in vLLM).",
       tl="hook_embed", nnsight="model.embed_tokens.output", nnterp="token_embeddings"),
    _p("resid_pre", L, Width.D, RW, "Input of decoder block L: the residual stream before the block. Multi-stream trunks (DeepSeek-V4) carry n_streams copies: the address names one (`resid_pre.L.stream-N`, [batch, seq, d_model]); without a stream it is refused (read resid_streams).",
       tl="blocks.{L}.hook_resid_pre", nnsight="model.layers[{L}].input", nnterp="layers_input[{L}]"),
    _p("attn_in", L, Width.D, RW,
       "Input of the attention module: the normed residual (the raw residual where the family has no pre-attention norm). On the linear-attention / SSM layers of hybrid families (Qwen3-Next) the token mixer takes the attention slot: attn_in and attn_out are its input and output, while the attention internals (q/k norms, value, scores, probs, z, attn_gate) are refused on those layers.",
       tl="blocks.{L}.ln1.hook_out", nnsight="model.layers[{L}].self_attn.input", nnterp="attentions_input[{L}]"),
    _p("q", L, Width.H, RW, "Queries before the rotary embedding: the query projection's output, n_heads x head_dim (TransformerLens hook_q), before any query norm (so it equals q_norm_in on QK-norm families) or clipping. On fused projections, the query slice. Absent on latent-attention families (DeepSeek-V3/V4).",
       requires="per_head_qk", tl="blocks.{L}.attn.hook_q", nnsight="model.layers[{L}].self_attn.q_proj.output"),
    _p("k", L, Width.KV, RW, "Keys before the rotary embedding: the key projection's output, n_kv_heads x head_dim (before GQA expansion; TransformerLens hook_k), before any key norm (so it equals k_norm_in on QK-norm families). On fused projections, the key slice. Absent on latent-attention families.",
       requires="per_head_qk", tl="blocks.{L}.attn.hook_k", nnsight="model.layers[{L}].self_attn.k_proj.output"),
    _p("q_norm_in", L, Width.H, RW, "Input of the per-head query norm, before RoPE (QK-norm families).",
       requires="qk_norm", tl="blocks.{L}.attn.hook_q", nnsight="model.layers[{L}].self_attn.q_norm.input"),
    _p("q_norm_out", L, Width.H, RW, "Output of the per-head query norm, before RoPE (QK-norm families).",
       requires="qk_norm", tl="blocks.{L}.attn.hook_q_normed", nnsight="model.layers[{L}].self_attn.q_norm.output"),
    _p("k_norm_in", L, Width.KV, RW, "Input of the per-head key norm, before RoPE (QK-norm families).",
       requires="qk_norm", tl="blocks.{L}.attn.hook_k", nnsight="model.layers[{L}].self_attn.k_norm.input"),
    _p("k_norm_out", L, Width.KV, RW, "Output of the per-head key norm, before RoPE (QK-norm families).",
       requires="qk_norm", tl="blocks.{L}.attn.hook_k_normed", nnsight="model.layers[{L}].self_attn.k_norm.output"),
    _p("q_rot", L, Width.H, RW, "Queries after the rotary embedding, as attention dots them with the keys (before the 1/sqrt(head_dim) scale): rotary(q_norm_out) on QK-norm families, rotary(q) elsewhere; partial-rotary families leave the unrotated dims as they were (TransformerLens hook_rot_q). Rotary families only.",
       requires="rotary", tl="blocks.{L}.attn.hook_rot_q"),
    _p("k_rot", L, Width.KV, RW, "Keys after the rotary embedding, n_kv_heads x head_dim (before GQA expansion), this forward's positions only (not the KV cache); a write is what the cache keeps (TransformerLens hook_rot_k). Rotary families only.",
       requires="rotary", tl="blocks.{L}.attn.hook_rot_k"),
    _p("value", L, Width.KV, RW, "Output of the value projection, KV heads wide (before GQA expansion). MLA (DeepSeek-V3): the per-head values kv_b_proj decompresses from the shared latent, n_heads x v_head_dim, not the latent: the latent feeds keys too, and the per-head value is what attention mixes (probs @ value = z). Refused where K and V are one shared tensor (DeepSeek-V4).",
       tl="blocks.{L}.attn.hook_v", nnsight="model.layers[{L}].self_attn.v_proj.output"),
    _p("attn_scores", L, Width.HQK, CAP,
       "Pre-softmax attention scores per head: q.k scaled, softcapped where the family does, plus the additive mask (masked = dtype min). Sink families (gpt-oss, DeepSeek-V4): without the sink column, restored from the family's max-shifted softmax input by adding back the shift.",
       tl="blocks.{L}.attn.hook_attn_scores"),
    _p("attn_probs", L, Width.HQK, CAP, "Attention probabilities per head (softmax of attn_scores). Sink families: softmax over [scores | sink] with the sink column dropped, so rows sum to less than 1 (what multiplies the values).",
       tl="blocks.{L}.attn.hook_pattern",
       nnterp="attention_probabilities[{L}]"),
    _p("z", L, Width.H, RW,
       "Input of the attention output projection (o_proj): per-head mixed values, after any output gate.",
       tl="blocks.{L}.attn.hook_z", nnsight="model.layers[{L}].self_attn.o_proj.input"),
    _p("attn_gate", L, Width.H, CAP, "The attention output gate of gated-attention families (Qwen3-Next): sigmoid of the gate half of q_proj's per-head [q | gate] output, n_heads x head_dim; z = (probs @ value) * attn_gate.",
       requires="gated_attention"),
    _p("attn_out", L, Width.D, RW, "Output of the attention module (after o_proj, before any post-attention norm).",
       tl="blocks.{L}.hook_attn_out", nnsight="model.layers[{L}].self_attn.output[0]",
       nnterp="attentions_output[{L}]"),
    _p("attn_out_post", L, Width.D, RW,
       "Attention output after the post-attention norm of sandwich-norm families (Gemma 2/3, OLMo-2); equals attn_out elsewhere. This is what is added to the residual.",
       tl="blocks.{L}.hook_attn_out", nnsight="model.layers[{L}].post_attention_layernorm.output"),
    _p("resid_mid", L, Width.D, RW,
       "Residual after attention is added, before the MLP's norm. Absent on parallel-block families, where the MLP reads resid_pre. Multi-stream trunks: stream N of the stack after the attention hyper-connection (the MLP hyper-connection's input), `resid_mid.L.stream-N`.",
       requires="sequential_block", tl="blocks.{L}.hook_resid_mid",
       nnsight="model.layers[{L}].post_attention_layernorm.input"),
    _p("mlp_in", L, Width.D, RW, "Input of the MLP module: the normed residual.",
       tl="blocks.{L}.ln2.hook_out", nnsight="model.layers[{L}].mlp.input", nnterp="mlps_input[{L}]"),
    _p("mlp_pre", L, Width.N, RW,
       "Gate projection output (gated MLP) or the first projection (plain MLP), before the activation.",
       tl="blocks.{L}.mlp.hook_pre", nnsight="model.layers[{L}].mlp.gate_proj.output"),
    _p("mlp_pre_linear", L, Width.N, RW, "Up projection output (gated MLPs only).", requires="gated_mlp",
       tl="blocks.{L}.mlp.hook_pre_linear", nnsight="model.layers[{L}].mlp.up_proj.output"),
    _p("mlp_act", L, Width.N, RW, "Input of the down projection: act(gate) * up, or act(pre) on plain MLPs.",
       tl="blocks.{L}.mlp.hook_post", nnsight="model.layers[{L}].mlp.down_proj.input"),
    _p("router_logits", L, Width.E, CAP, "MoE router output, one logit per expert (sparse layers only).",
       requires="moe", tl="blocks.{L}.mlp.gate.hook_out", nnsight="model.layers[{L}].mlp.gate.output[0]"),
    _p("expert_weights", L, Width.K, CAP, "The router's top-k routing weights, in the router's order.",
       requires="moe"),
    _p("expert_indices", L, Width.K, CAP, "The router's top-k expert indices, in the router's order.",
       requires="moe",
       tl="blocks.{L}.mlp.hook_expert_indices"),
    _p("mlp_out", L, Width.D, RW, "Output of the MLP block (the whole MoE block, shared experts included). Granite-4.0-H adds its routed MoE and its shared MLP inside the decoder layer, with no module for the sum: mlp_out is that sum.",
       tl="blocks.{L}.hook_mlp_out", nnsight="model.layers[{L}].mlp.output", nnterp="mlps_output[{L}]"),
    _p("mlp_out_post", L, Width.D, RW,
       "MLP output after the post-MLP norm of sandwich-norm families; mlp_out times residual_multiplier on Granite families; equals mlp_out elsewhere. This is what is added to the residual.",
       tl="blocks.{L}.hook_mlp_out", nnsight="model.layers[{L}].post_feedforward_layernorm.output"),
    _p("resid_post", L, Width.D, RW, "Output of decoder block L: the residual stream after the block (vLLM: hidden + residual). Multi-stream trunks: one stream per address (`resid_post.L.stream-N`).",
       tl="blocks.{L}.hook_resid_post", nnsight="model.layers[{L}].output", nnterp="layers_output[{L}]"),
    _p("final_norm", T, Width.D, RW, "Output of the final norm, the unembed's input. Multi-stream trunks first collapse the streams with the model's own head (hc_head, weights from the normed streams), then norm.",
       tl="ln_final.hook_out", nnsight="model.norm.output", nnterp="ln_final.output"),
    _p("lm_head", T, Width.VOCAB, CAP, "Raw unembed output: no logit multiplier, no softcap.",
       tl="unembed.hook_out",
       nnsight="lm_head.output", nnterp="logits"),
    _p("resid_streams", L, Width.SD, RW, "Hyper-connection trunks (DeepSeek-V4): block L's output stack of S residual streams, flattened stream-major to [batch, seq, S * d_model] (stream N is columns N*d..(N+1)*d); steering takes an S * d_model vector. resid_post.L.stream-N is one slice of it.",
       requires="multi_stream"),
    _p("attn_stream_collapse", L, Width.D, CAP, "Multi-stream trunks: the collapse sum_N pre_N * stream_N that attention reads (before its input norm); pre = sigmoid(fn_pre . rms(all streams) * scale + base) + eps, per token.",
       requires="multi_stream"),
    _p("mlp_stream_collapse", L, Width.D, CAP, "Multi-stream trunks: the collapse of the streams after attention that the MLP reads (before its input norm), weighted as attn_stream_collapse.",
       requires="multi_stream"),
    _p("attn_stream_write", L, Width.S, CAP, "Multi-stream trunks: per-stream write coefficients of attention, [batch, seq, S]: out_K = write_K * attn_out + sum_J mix[J, K] * in_J.",
       requires="multi_stream"),
    _p("mlp_stream_write", L, Width.S, CAP, "Multi-stream trunks: per-stream write coefficients of the MLP, [batch, seq, S]: out_K = write_K * mlp_out + sum_J mix[J, K] * in_J.",
       requires="multi_stream"),
    _p("attn_stream_mix", L, Width.SS, CAP, "Multi-stream trunks: the doubly stochastic (Sinkhorn) stream mixing matrix around attention, flattened row-major to [batch, seq, S * S]: entry J*S+K carries input stream J into output stream K.",
       requires="multi_stream"),
    _p("mlp_stream_mix", L, Width.SS, CAP, "Multi-stream trunks: the stream mixing matrix around the MLP, flattened row-major to [batch, seq, S * S] as attn_stream_mix.",
       requires="multi_stream"),
)  # fmt: skip

POINTS_BY_NAME: dict[str, Point] = {p.name: p for p in POINTS}
