"""Architecture families: HF classes, structural traits, and which points each one has.

The cheat sheet reads this without torch. Backends resolve points from the loaded model's own
structure; this registry says what a family is expected to offer, and a test checks they agree.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum

from ie_core.grammar.points import POINTS, Point


class Trait(StrEnum):
    GQA = "gqa"
    QK_NORM = "qk_norm"
    SANDWICH_NORM = "sandwich_norm"
    PARALLEL_BLOCK = "parallel_block"
    MOE = "moe"
    SHARED_EXPERTS = "shared_experts"
    GATED_MLP = "gated_mlp"
    SLIDING_WINDOW = "sliding_window"
    ATTN_SOFTCAP = "attn_softcap"
    LOGIT_SOFTCAP = "logit_softcap"
    HYBRID_LINEAR_ATTENTION = "hybrid_linear_attention"
    FUSED_QKV = "fused_qkv"
    MULTI_STREAM = "multi_stream"
    GATED_ATTENTION = "gated_attention"
    LEARNED_POSITIONS = "learned_positions"
    ALIBI = "alibi"
    EMBEDDING_SCALE = "embedding_scale"
    MULTIPLIERS = "multipliers"
    ATTENTION_SINKS = "attention_sinks"
    LAYERNORM = "layernorm"
    TIED_EMBEDDINGS = "tied_embeddings"
    SPARSE_ONLY = "sparse_only"
    SHARED_KV = "shared_kv"
    LATENT_ATTENTION = "latent_attention"
    SPLIT_ROTARY = "split_rotary"
    NOPE = "nope"


# Dense-MLP internals: one [batch, seq, d_mlp] tensor exists only on layers with a dense MLP.
DENSE_MLP_POINTS = frozenset({"mlp_pre", "mlp_pre_linear", "mlp_act"})

TRAIT_NOTES: dict[Trait, str] = {
    Trait.GQA: "fewer key/value heads than query heads; expand by repeat-interleave",
    Trait.QK_NORM: "per-head RMSNorm on queries and keys before RoPE",
    Trait.SANDWICH_NORM: "norms after attention and after the MLP define the *_out_post points",
    Trait.PARALLEL_BLOCK: "attention and MLP read the same input; no resid_mid",
    Trait.MOE: "mixture-of-experts MLP with a router",
    Trait.SHARED_EXPERTS: "MoE block with always-on shared experts",
    Trait.GATED_MLP: "act(gate) * up MLP (SwiGLU / GeGLU)",
    Trait.SLIDING_WINDOW: "some or all layers attend within a window",
    Trait.ATTN_SOFTCAP: "attention scores pass through c * tanh(x / c)",
    Trait.LOGIT_SOFTCAP: "final logits pass through c * tanh(x / c)",
    Trait.HYBRID_LINEAR_ATTENTION: "some layers are linear attention / SSM / conv; attention points only on softmax layers",
    Trait.FUSED_QKV: "one projection produces q, k and v",
    Trait.MULTI_STREAM: "several residual streams (hyper-connections)",
    Trait.GATED_ATTENTION: "a sigmoid output gate on attention",
    Trait.LEARNED_POSITIONS: "learned absolute position embeddings added outside the token embedding",
    Trait.ALIBI: "ALiBi position biases instead of rotary embeddings",
    Trait.EMBEDDING_SCALE: "token embeddings scaled by sqrt(d_model)",
    Trait.MULTIPLIERS: "embedding, residual, attention and logit multipliers",
    Trait.ATTENTION_SINKS: "learned sink logits: attention rows need not sum to 1",
    Trait.LAYERNORM: "LayerNorm with bias rather than RMSNorm",
    Trait.TIED_EMBEDDINGS: "unembed shares the embedding matrix",
    Trait.SHARED_KV: "keys and values are one shared projection (K = V, with RoPE on its rope slice), so there is no separate value tensor",
    Trait.LATENT_ATTENTION: "queries and keys are decompressed from low-rank latents, with RoPE on a separate slice of each head, so there is no plain per-head query or key projection output",
    Trait.SPLIT_ROTARY: "the attention rotates a slice of each head and concatenates the pass-through rest itself, so no one rotary call returns the whole rotated head",
    Trait.NOPE: "attention layers add no position information (NoPE): no rotary, learned positions or ALiBi",
    Trait.SPARSE_ONLY: "every MLP is a sparse mixture of experts: expert activations are per expert, so there is no dense mlp_pre / mlp_pre_linear / mlp_act",
}


# Requirements met unless the family has one of these traits: `per_head_qk` (a plain per-head
# query / key projection output) and `rotary` (one rotary call returning the whole rotated head).
_ABSENT_WITH: dict[str, frozenset[Trait]] = {
    "per_head_qk": frozenset({Trait.LATENT_ATTENTION}),
    "rotary": frozenset(
        {
            Trait.LEARNED_POSITIONS,
            Trait.ALIBI,
            Trait.NOPE,
            Trait.LATENT_ATTENTION,
            Trait.SPLIT_ROTARY,
        }
    ),
}
_INSTEAD = {
    "per_head_qk": "read attn_in, value or the attention's modules by path",
    "rotary": "read q / k (the queries and keys attention dots, up to the rotary where it has one)",
}


@dataclass(frozen=True)
class Family:
    slug: str  # also the `ie-synthetic/<slug>` name when `synthetic` is true
    name: str
    hf_classes: tuple[str, ...]
    traits: frozenset[Trait]
    significance: str
    examples: tuple[str, ...]
    synthetic: bool = True

    def has(self, trait: Trait) -> bool:
        return trait in self.traits

    def has_point(self, point: Point) -> bool:
        if point.name in DENSE_MLP_POINTS and Trait.SPARSE_ONLY in self.traits:
            return False
        if point.name == "value" and Trait.SHARED_KV in self.traits:
            return False
        if point.requires is None:
            return True
        if point.requires == "sequential_block":
            return Trait.PARALLEL_BLOCK not in self.traits
        if point.requires in _ABSENT_WITH:
            return not self.traits & _ABSENT_WITH[point.requires]
        return Trait(point.requires) in self.traits

    @property
    def points(self) -> tuple[Point, ...]:
        return tuple(p for p in POINTS if self.has_point(p))

    def missing_reason(self, point: Point) -> str:
        """Why the family lacks `point` (empty when it has it)."""
        if self.has_point(point):
            return ""
        if point.requires == "sequential_block":
            return f"{self.name} runs attention and MLP in parallel, so there is no residual between them"
        if point.name in DENSE_MLP_POINTS and Trait.SPARSE_ONLY in self.traits:
            return f"in {self.name} {TRAIT_NOTES[Trait.SPARSE_ONLY]}"
        if point.name == "value" and Trait.SHARED_KV in self.traits:
            return f"in {self.name} {TRAIT_NOTES[Trait.SHARED_KV]}"
        if point.requires in _ABSENT_WITH:
            trait = min(self.traits & _ABSENT_WITH[point.requires])
            return f"in {self.name} {TRAIT_NOTES[trait]}; {_INSTEAD[point.requires]}"
        trait = Trait(point.requires or "")
        return f"{self.name} has no {trait.value.replace('_', ' ')} ({TRAIT_NOTES[trait]})"


def _f(
    slug: str,
    name: str,
    classes: str,
    traits: str,
    significance: str,
    examples: str,
    synthetic: bool = True,
) -> Family:
    return Family(
        slug,
        name,
        tuple(classes.split()),
        frozenset(Trait(t) for t in traits.split()),
        significance,
        tuple(examples.split()),
        synthetic,
    )


FAMILIES: tuple[Family, ...] = (
    _f("gpt2", "GPT-2", "GPT2LMHeadModel", "learned_positions layernorm fused_qkv tied_embeddings",
       "The classic: LayerNorm, learned positions added outside the embedding, Conv1D fused QKV.", "openai-community/gpt2"),
    _f("gpt-neox", "GPT-NeoX / Pythia", "GPTNeoXForCausalLM", "parallel_block layernorm fused_qkv",
       "Parallel attention + MLP; fused QKV interleaved per head.", "EleutherAI/pythia-160m EleutherAI/pythia-1.4b"),
    _f("gpt-j", "GPT-J", "GPTJForCausalLM", "parallel_block layernorm split_rotary",
       "Parallel block with one shared LayerNorm and partial rotary.", "EleutherAI/gpt-j-6b"),
    _f("opt", "OPT", "OPTForCausalLM", "learned_positions layernorm tied_embeddings",
       "Learned positions with an offset of 2; ReLU MLP.", "facebook/opt-125m facebook/opt-1.3b"),
    _f("bloom", "BLOOM", "BloomForCausalLM", "alibi layernorm fused_qkv tied_embeddings",
       "ALiBi biases, an embedding LayerNorm, fused QKV interleaved per head.", "bigscience/bloom-560m"),
    _f("llama", "Llama", "LlamaForCausalLM", "gqa gated_mlp",
       "The reference modern decoder: RMSNorm, RoPE, SwiGLU, GQA.", "meta-llama/Llama-3.1-8B HuggingFaceTB/SmolLM2-135M-Instruct"),
    _f("mistral", "Mistral", "MistralForCausalLM", "gqa gated_mlp sliding_window",
       "Llama with sliding-window attention.", "mistralai/Mistral-7B-v0.1"),
    _f("qwen2", "Qwen2 / Qwen2.5", "Qwen2ForCausalLM", "gqa gated_mlp",
       "Llama-like with biases on q, k, v.", "Qwen/Qwen2.5-0.5B Qwen/Qwen2.5-7B"),
    _f("qwen3", "Qwen3", "Qwen3ForCausalLM", "gqa gated_mlp qk_norm",
       "Adds per-head QK-norm before RoPE.", "Qwen/Qwen3-0.6B Qwen/Qwen3-4B Qwen/Qwen3-8B"),
    _f("qwen3-moe", "Qwen3-MoE", "Qwen3MoeForCausalLM", "gqa gated_mlp qk_norm moe",
       "QK-norm with a sparse MoE MLP; which layers are sparse comes from the config.", "Qwen/Qwen3-30B-A3B"),
    _f("qwen2-moe", "Qwen2-MoE", "Qwen2MoeForCausalLM", "gqa gated_mlp moe shared_experts",
       "MoE with a gated shared expert added to the routed experts.", "Qwen/Qwen1.5-MoE-A2.7B"),
    _f("mixtral", "Mixtral", "MixtralForCausalLM", "gqa gated_mlp moe sparse_only",
       "Sparse MoE, 8 experts, top-2.", "mistralai/Mixtral-8x7B-v0.1"),
    _f("gemma", "Gemma", "GemmaForCausalLM", "gated_mlp embedding_scale tied_embeddings",
       "Embeddings scaled by sqrt(d_model); RMSNorm gain is 1 + w; GeGLU.", "google/gemma-2b"),
    _f("gemma2", "Gemma 2", "Gemma2ForCausalLM",
       "gqa gated_mlp embedding_scale sandwich_norm attn_softcap logit_softcap sliding_window tied_embeddings",
       "Sandwich norms, attention and logit softcaps, alternating sliding window.", "google/gemma-2-2b google/gemma-2-9b"),
    _f("gemma3", "Gemma 3", "Gemma3ForCausalLM",
       "gqa gated_mlp embedding_scale sandwich_norm qk_norm sliding_window tied_embeddings",
       "Sandwich norms plus QK-norm; embedding scale inside the module; 5:1 local:global.", "google/gemma-3-1b-it google/gemma-3-4b-it"),
    _f("olmo", "OLMo", "OlmoForCausalLM", "gated_mlp layernorm",
       "Non-parametric LayerNorm (no gain, no bias) and optional clipping of q, k, v.", "allenai/OLMo-1B-hf allenai/OLMo-7B-0724-hf"),
    _f("olmo2", "OLMo-2", "Olmo2ForCausalLM", "gated_mlp qk_norm sandwich_norm",
       "Norms after attention and MLP only (no pre-norm); QK-norm over the whole projection.", "allenai/OLMo-2-1124-7B"),
    _f("phi", "Phi-1/2", "PhiForCausalLM", "parallel_block layernorm split_rotary",
       "Parallel block with one LayerNorm, partial rotary, dense biases.", "microsoft/phi-2"),
    _f("phi3", "Phi-3", "Phi3ForCausalLM", "gated_mlp fused_qkv",
       "Fused qkv_proj and gate_up_proj in contiguous thirds / halves.", "microsoft/Phi-3-mini-4k-instruct"),
    _f("granite", "Granite", "GraniteForCausalLM", "gqa gated_mlp multipliers",
       "Llama with embedding, residual, attention and logit multipliers.", "ibm-granite/granite-3.1-2b-instruct"),
    _f("starcoder2", "StarCoder2", "Starcoder2ForCausalLM", "gqa layernorm sliding_window",
       "LayerNorm, biases, plain GELU MLP, sliding window.", "bigcode/starcoder2-3b"),
    _f("cohere", "Cohere (Command-R)", "CohereForCausalLM", "gqa gated_mlp parallel_block layernorm multipliers tied_embeddings",
       "Parallel block with one LayerNorm and a logit scale.", "CohereForAI/c4ai-command-r-v01"),
    _f("falcon", "Falcon", "FalconForCausalLM", "parallel_block layernorm fused_qkv",
       "Parallel block; fused QKV grouped per KV head in the new decoder.", "tiiuae/falcon-7b"),
    _f("gpt-bigcode", "GPTBigCode / StarCoder", "GPTBigCodeForCausalLM", "gqa learned_positions layernorm fused_qkv tied_embeddings",
       "GPT-2 layout with multi-query attention: one key/value head in a fused c_attn.", "bigcode/gpt_bigcode-santacoder bigcode/starcoderbase-1b"),
    _f("stablelm", "StableLM", "StableLmForCausalLM", "gqa gated_mlp layernorm split_rotary",
       "LayerNorm with a SwiGLU MLP, partial rotary and q/k/v biases.", "stabilityai/stablelm-2-1_6b stabilityai/stablelm-3b-4e1t"),
    _f("deepseek-v4", "DeepSeek-V4 (hyper-connections)", "DeepseekV4ForCausalLM",
       "moe shared_experts gated_mlp multi_stream attention_sinks sliding_window sparse_only shared_kv latent_attention",
       "Several residual streams mixed by hyper-connections; residual points take a stream.", "deepseek-ai/DeepSeek-V4-Flash"),
    _f("qwen3-next", "Qwen3-Next / Qwen3.5", "Qwen3NextForCausalLM",
       "gqa gated_mlp qk_norm moe shared_experts hybrid_linear_attention gated_attention",
       "Hybrid gated-delta linear attention with gated softmax attention every fourth layer.", "Qwen/Qwen3-Next-80B-A3B-Instruct"),
    _f("deepseek-v3", "DeepSeek-V3 (MLA)", "DeepseekV3ForCausalLM", "moe shared_experts gated_mlp latent_attention",
       "Multi-head latent attention: keys and values decompressed per head from one shared latent.", "deepseek-ai/DeepSeek-V3 moonshotai/Kimi-K2-Instruct"),
    _f("gpt-oss", "gpt-oss", "GptOssForCausalLM", "gqa moe sliding_window attention_sinks sparse_only",
       "MoE with learned attention sinks: probability rows need not sum to 1.", "openai/gpt-oss-20b"),
    _f("olmo3", "OLMo-3", "Olmo3ForCausalLM", "gqa gated_mlp qk_norm sandwich_norm sliding_window",
       "OLMo-2's post-norm blocks with 3 sliding-window layers to 1 global.", "allenai/Olmo-3-7B-Instruct"),
    _f("glm4-moe", "GLM-4.5 (MoE)", "Glm4MoeForCausalLM", "gqa gated_mlp qk_norm moe shared_experts",
       "Sigmoid-routed MoE with a shared expert after dense first layers; partial rotary.", "zai-org/GLM-4.5-Air"),
    _f("lfm2", "LFM2", "Lfm2ForCausalLM", "gqa gated_mlp qk_norm hybrid_linear_attention",
       "Hybrid of gated short convolutions and QK-norm attention; final norm named embedding_norm.", "LiquidAI/LFM2-1.2B"),
    _f("granitemoehybrid", "Granite-4.0-H (hybrid MoE)", "GraniteMoeHybridForCausalLM",
       "gqa gated_mlp moe shared_experts sparse_only hybrid_linear_attention multipliers nope",
       "Mamba2 layers between attention layers; routed experts plus a shared MLP summed inside the layer; Granite multipliers.", "ibm-granite/granite-4.0-h-tiny ibm-granite/granite-4.0-h-small"),
)  # fmt: skip

FAMILIES_BY_SLUG: dict[str, Family] = {f.slug: f for f in FAMILIES}
_BY_CLASS: dict[str, Family] = {c: f for f in FAMILIES for c in f.hf_classes}


def get_family(slug: str) -> Family:
    try:
        return FAMILIES_BY_SLUG[slug]
    except KeyError:
        raise KeyError(f"unknown family {slug!r}; known: {', '.join(FAMILIES_BY_SLUG)}") from None


def family_for_architecture(hf_class: str) -> Family | None:
    """The family of an HF architecture class name (`config.architectures[0]`), if registered."""
    return _BY_CLASS.get(hf_class)
