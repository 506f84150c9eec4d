"""`ie-synthetic/<family>`: tiny random-weight checkpoints, one per architecture, built offline.

Each family is a config class from transformers at toy size (d_model 128, 4 to 6 layers) with the
structural quirks that make the family interesting kept on (GQA, sliding windows, softcaps, MoE,
parallel blocks, fused projections, multipliers). Builds are deterministic: the same family gives
the same bytes on every machine with the same transformers, so tests can compare runs.
"""

from __future__ import annotations

import zlib
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from types import MappingProxyType
from typing import Any

import torch
import transformers
from ie_core.errors import ModelNotFoundError
from ie_core.models import SYNTHETIC_PREFIX, cache_dir
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
from transformers import PretrainedConfig, PreTrainedModel, PreTrainedTokenizerFast

from ie_eager._hf_folder import materialize, name_tokenizer_class
from ie_eager.quantized import build_variant, split_variant

# Bump when the recipe changes, so old cached folders are not reused.
BUILD_VERSION = "v1"

VOCAB_SIZE = 512
PAD, BOS, EOS, UNK = "<pad>", "<bos>", "<eos>", "<unk>"
SPECIAL_TOKENS = (PAD, BOS, EOS, UNK)  # trained first, so their ids are 0..3
PAD_ID, BOS_ID, EOS_ID, UNK_ID = range(4)

CHAT_TEMPLATE = (
    "{{ bos_token }}{% for message in messages %}"
    "<|{{ message['role'] }}|>\n{{ message['content'] }}{{ eos_token }}\n"
    "{% endfor %}{% if add_generation_prompt %}<|assistant|>\n{% endif %}"
)

# A fixed training text: the tokenizer is trained on it at build time, so no vocab file is shipped.
CORPUS = """\
The capital of France is Paris, and the capital of Japan is Tokyo. The capital of Italy is Rome,
the capital of Germany is Berlin, and the capital of Spain is Madrid. London is the capital of the
United Kingdom, and Ottawa is the capital of Canada.

Once upon a time, a small robot lived in a quiet village by the sea. Every morning it walked to the
harbour, counted the boats, and wrote the numbers in a little book: one, two, three, four, five,
six, seven, eight, nine, ten. The fishermen laughed, but the robot kept counting, because it
believed that numbers were a kind of poetry.

Language models read text as a sequence of tokens. Each token is mapped to a vector, the vectors
pass through a stack of attention and feed-forward layers, and the final layer predicts the next
token. Researchers study the activations inside these layers to understand what the model knows
and how it reasons. Steering adds a direction to the residual stream to change what the model says.

Question: What is the largest planet in the solar system? Answer: Jupiter is the largest planet.
Question: What colour is the sky on a clear day? Answer: The sky is blue on a clear day.
Question: How many days are there in a week? Answer: There are seven days in a week.

def add(a, b):
    return a + b

for i in range(10):
    print(i, add(i, i * 2))

I love this movie! It was wonderful, warm and funny. I hate waiting in the rain; it is cold and
boring. She said that he said that they would come home before the end of the summer holidays.
"""


@dataclass(frozen=True)
class FamilySpec:
    """One synthetic family: the HF class to build and the config that shapes it."""

    slug: str
    architecture: str  # transformers model class, written to config.json `architectures`
    config_class: str  # transformers config class
    settings: Mapping[str, Any]  # config kwargs beyond vocab, special token ids and dtype
    exercises: str  # the structure this family is here to test
    embedding_scale: float = 1.0  # applied to the input embedding after init (tied: lm_head too)
    # Saved float buffers HF fills with a constant (DeepSeek's router correction bias): perturbed
    # after the parameters, from the same generator, so they too change the output.
    perturb_buffers: tuple[str, ...] = ()

    @property
    def seed(self) -> int:
        """A per-family seed, so families with equal shapes still get different weights."""
        return zlib.crc32(f"ie-synthetic/{self.slug}/{BUILD_VERSION}".encode())


def _family(
    slug: str,
    architecture: str,
    config_class: str,
    exercises: str,
    *,
    embedding_scale: float = 1.0,
    perturb_buffers: tuple[str, ...] = (),
    **settings: Any,
) -> FamilySpec:
    return FamilySpec(
        slug,
        architecture,
        config_class,
        MappingProxyType(settings),
        exercises,
        embedding_scale,
        perturb_buffers,
    )


# About 1/sqrt(d_model): the usual 0.02 is tuned for d_model >= 768 and, at 128, leaves attention
# near uniform and logits near flat, so greedy output collapses to one repeated token.
_INIT_STD = 0.1

# Llama-style shape: 4 query heads of 32, 2 KV heads (GQA).
_LLAMA_SHAPE: dict[str, Any] = {
    "hidden_size": 128,
    "intermediate_size": 256,
    "num_hidden_layers": 4,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "max_position_embeddings": 512,
    "initializer_range": _INIT_STD,
}
_GPT2_SHAPE: dict[str, Any] = {
    "n_embd": 128,
    "n_layer": 4,
    "n_head": 4,
    "n_inner": 256,
    "n_positions": 512,
    "initializer_range": _INIT_STD,
}
_WINDOW = 8  # short enough that a sliding window matters on a short prompt
# Gemma multiplies embeddings by sqrt(d_model) (11.3 here) and ties lm_head: at the shared init the
# embedding swamps the residual stream and the model predicts its own input token forever.
_GEMMA_EMBEDDING_SCALE = 0.25

# DeepSeek-V4 at toy size: sliding-window layers only (the compressed CSA / HCA layers need an
# indexer far larger than a toy), every MLP a MoE with one shared expert, 4 streams.
_DEEPSEEK_V4_SHAPE: dict[str, Any] = {
    "hidden_size": 128,
    "intermediate_size": 128,
    "moe_intermediate_size": 128,
    "num_hidden_layers": 4,
    "num_attention_heads": 4,
    "head_dim": 32,
    "q_lora_rank": 64,
    "o_groups": 2,
    "o_lora_rank": 32,
    "n_routed_experts": 4,
    "n_shared_experts": 1,
    "num_experts_per_tok": 2,
    "hc_mult": 4,
    "sliding_window": _WINDOW,
    "layer_types": ["sliding_attention"] * 4,
    "mlp_layer_types": ["moe"] * 4,
    "num_nextn_predict_layers": 0,
    "max_position_embeddings": 512,
    "initializer_range": _INIT_STD,
}

_ROUTER_BIAS = ("e_score_correction_bias",)

_FAMILY_LIST: tuple[FamilySpec, ...] = (
    _family("gpt2", "GPT2LMHeadModel", "GPT2Config", "Conv1D fused qkv, learned positions",
            **_GPT2_SHAPE),
    _family("gpt-neox", "GPTNeoXForCausalLM", "GPTNeoXConfig",
            "parallel residual, per-head interleaved fused qkv, partial rotary",
            hidden_size=128, intermediate_size=256, num_hidden_layers=4, num_attention_heads=4,
            max_position_embeddings=512, initializer_range=_INIT_STD, use_parallel_residual=True,
            tie_word_embeddings=False,
            rope_parameters={"rope_type": "default", "rope_theta": 10000.0,
                             "partial_rotary_factor": 0.25}),
    _family("gpt-j", "GPTJForCausalLM", "GPTJConfig",
            "parallel block with one layer norm, interleaved partial rotary",
            n_embd=128, n_layer=4, n_head=4, n_inner=256, n_positions=512, rotary_dim=16,
            initializer_range=_INIT_STD, tie_word_embeddings=False),
    _family("opt", "OPTForCausalLM", "OPTConfig", "learned positions with offset 2, ReLU MLP",
            hidden_size=128, ffn_dim=256, num_hidden_layers=4, num_attention_heads=4,
            word_embed_proj_dim=128, max_position_embeddings=512, do_layer_norm_before=True,
            init_std=_INIT_STD),
    _family("bloom", "BloomForCausalLM", "BloomConfig",
            "ALiBi, embedding layer norm, per-head interleaved fused qkv, 4x MLP",
            hidden_size=128, n_layer=4, n_head=4, initializer_range=_INIT_STD),
    _family("llama", "LlamaForCausalLM", "LlamaConfig", "GQA, RMSNorm, SwiGLU",
            **_LLAMA_SHAPE, head_dim=32),
    _family("mistral", "MistralForCausalLM", "MistralConfig", "sliding window on every layer",
            **_LLAMA_SHAPE, head_dim=32, sliding_window=_WINDOW),
    _family("qwen2", "Qwen2ForCausalLM", "Qwen2Config", "qkv biases",
            **_LLAMA_SHAPE, head_dim=32, use_sliding_window=False, tie_word_embeddings=True),
    _family("qwen3", "Qwen3ForCausalLM", "Qwen3Config",
            "QK-norm, head_dim 64 with 4 heads (heads * head_dim != d_model)",
            **_LLAMA_SHAPE, head_dim=64, use_sliding_window=False, tie_word_embeddings=True),
    _family("qwen3-moe", "Qwen3MoeForCausalLM", "Qwen3MoeConfig",
            "sparse MoE on layers 1-3, dense MLP on layer 0 (mlp_only_layers)",
            **_LLAMA_SHAPE, head_dim=32, num_experts=4, num_experts_per_tok=2,
            moe_intermediate_size=128, decoder_sparse_step=1, mlp_only_layers=[0],
            norm_topk_prob=True, use_sliding_window=False),
    _family("qwen2-moe", "Qwen2MoeForCausalLM", "Qwen2MoeConfig",
            "sparse MoE with a gated shared expert on layers 1-3, dense on layer 0",
            **_LLAMA_SHAPE, num_experts=4, num_experts_per_tok=2, moe_intermediate_size=128,
            shared_expert_intermediate_size=256, decoder_sparse_step=1, mlp_only_layers=[0],
            norm_topk_prob=False, use_sliding_window=False),
    _family("mixtral", "MixtralForCausalLM", "MixtralConfig", "sparse MoE on every layer",
            **_LLAMA_SHAPE, head_dim=32, num_local_experts=4, num_experts_per_tok=2,
            sliding_window=None),
    _family("gemma", "GemmaForCausalLM", "GemmaConfig",
            "sqrt(d) embedding scale, 1+w RMSNorm, MQA (1 KV head), GeGLU",
            embedding_scale=_GEMMA_EMBEDDING_SCALE,
            **{**_LLAMA_SHAPE, "num_key_value_heads": 1}, head_dim=32,
            hidden_activation="gelu_pytorch_tanh"),
    _family("gemma2", "Gemma2ForCausalLM", "Gemma2Config",
            "softcaps (attention 50, logits 30), sandwich norms, alternating sliding window",
            embedding_scale=_GEMMA_EMBEDDING_SCALE,
            **_LLAMA_SHAPE, head_dim=64, query_pre_attn_scalar=64, sliding_window=_WINDOW,
            attn_logit_softcapping=50.0, final_logit_softcapping=30.0,
            hidden_activation="gelu_pytorch_tanh"),
    _family("gemma3", "Gemma3ForCausalLM", "Gemma3TextConfig",
            "QK-norm, sandwich norms, 5 sliding : 1 global layers with two rope bases",
            embedding_scale=_GEMMA_EMBEDDING_SCALE,
            **{**_LLAMA_SHAPE, "num_hidden_layers": 6}, head_dim=32, query_pre_attn_scalar=32,
            sliding_window=_WINDOW, hidden_activation="gelu_pytorch_tanh"),
    _family("olmo", "OlmoForCausalLM", "OlmoConfig", "non-parametric layer norm, clip_qkv",
            **_LLAMA_SHAPE, clip_qkv=8.0),
    _family("olmo2", "Olmo2ForCausalLM", "Olmo2Config",
            "post-norm blocks (norm after attention and MLP), QK-norm over all heads",
            **_LLAMA_SHAPE),
    _family("phi", "PhiForCausalLM", "PhiConfig",
            "parallel block, partial rotary (0.5), dense with biases, untied lm_head bias",
            hidden_size=128, intermediate_size=256, num_hidden_layers=4, num_attention_heads=4,
            num_key_value_heads=4, max_position_embeddings=512, initializer_range=_INIT_STD,
            rope_parameters={"rope_type": "default", "rope_theta": 10000.0,
                             "partial_rotary_factor": 0.5}),
    _family("phi3", "Phi3ForCausalLM", "Phi3Config", "fused qkv_proj and gate_up_proj",
            **_LLAMA_SHAPE, sliding_window=None),
    _family("granite", "GraniteForCausalLM", "GraniteConfig",
            "embedding, residual, attention and logits multipliers",
            **_LLAMA_SHAPE, embedding_multiplier=6.0, residual_multiplier=0.5,
            attention_multiplier=0.125, logits_scaling=2.0),
    _family("starcoder2", "Starcoder2ForCausalLM", "Starcoder2Config",
            "layer norm with biases, plain GELU MLP, GQA",
            **_LLAMA_SHAPE, sliding_window=None, use_bias=True),
    _family("cohere", "CohereForCausalLM", "CohereConfig",
            "parallel block, bias-free layer norm, logit_scale, interleaved rotary",
            **_LLAMA_SHAPE, logit_scale=0.5, use_qk_norm=False),
    # ffn_hidden_size stays 4 * d_model: vLLM's Falcon ignores the field and assumes 4x.
    _family("falcon", "FalconForCausalLM", "FalconConfig",
            "new decoder: two parallel layer norms, fused qkv grouped per KV head",
            hidden_size=128, num_hidden_layers=4, num_attention_heads=4, num_kv_heads=2,
            ffn_hidden_size=512, new_decoder_architecture=True, parallel_attn=True, bias=False,
            alibi=False, max_position_embeddings=512, initializer_range=_INIT_STD),
    _family("gpt-bigcode", "GPTBigCodeForCausalLM", "GPTBigCodeConfig",
            "multi-query attention with a fused c_attn", **_GPT2_SHAPE, multi_query=True),
    _family("stablelm", "StableLmForCausalLM", "StableLmConfig",
            "layer norm, partial rotary (0.25), qkv bias",
            **_LLAMA_SHAPE, use_qkv_bias=True,
            rope_parameters={"rope_type": "default", "rope_theta": 10000.0,
                             "partial_rotary_factor": 0.25}),
    # --- families added after v1: their own recipes, the ones above are untouched -------------
    _family("deepseek-v4", "DeepseekV4ForCausalLM", "DeepseekV4Config",
            "4 hyper-connection residual streams (mHC), shared-KV MQA with sinks, MoE every layer",
            perturb_buffers=_ROUTER_BIAS, **_DEEPSEEK_V4_SHAPE),
    _family("qwen3-next", "Qwen3NextForCausalLM", "Qwen3NextConfig",
            "3 gated-delta linear-attention layers : 1 gated softmax attention, MoE + shared expert",
            **_LLAMA_SHAPE, head_dim=32, linear_num_value_heads=4, linear_num_key_heads=2,
            linear_key_head_dim=32, linear_value_head_dim=32, linear_conv_kernel_dim=4,
            num_experts=4, num_experts_per_tok=2, moe_intermediate_size=128,
            shared_expert_intermediate_size=128, decoder_sparse_step=1, mlp_only_layers=[0]),
    _family("deepseek-v3", "DeepseekV3ForCausalLM", "DeepseekV3Config",
            "multi-head latent attention (q and kv LoRA), MoE with a shared expert from layer 1",
            perturb_buffers=_ROUTER_BIAS,
            **{**_LLAMA_SHAPE, "num_key_value_heads": 4}, moe_intermediate_size=128,
            q_lora_rank=64, kv_lora_rank=32, qk_rope_head_dim=32, qk_nope_head_dim=32,
            v_head_dim=32, n_routed_experts=4, n_shared_experts=1, num_experts_per_tok=2,
            n_group=1, topk_group=1, first_k_dense_replace=1),
    _family("gpt-oss", "GptOssForCausalLM", "GptOssConfig",
            "learned attention sinks, alternating sliding window, clamped-SwiGLU MoE every layer",
            **{**_LLAMA_SHAPE, "intermediate_size": 128}, head_dim=32, num_local_experts=4,
            num_experts_per_tok=2, sliding_window=_WINDOW,
            layer_types=["sliding_attention", "full_attention"] * 2,
            rope_parameters={"rope_type": "yarn", "rope_theta": 150000.0, "factor": 32.0,
                             "beta_fast": 32.0, "beta_slow": 1.0, "truncate": False,
                             "original_max_position_embeddings": 16}),
    _family("olmo3", "Olmo3ForCausalLM", "Olmo3Config",
            "OLMo-2 post-norm blocks with 3 sliding : 1 global layers",
            **_LLAMA_SHAPE, sliding_window=_WINDOW),
    _family("glm4-moe", "Glm4MoeForCausalLM", "Glm4MoeConfig",
            "QK-norm, partial rotary, sigmoid-routed MoE with a shared expert from layer 1",
            perturb_buffers=_ROUTER_BIAS,
            **_LLAMA_SHAPE, head_dim=32, moe_intermediate_size=128, n_routed_experts=4,
            n_shared_experts=1, num_experts_per_tok=2, n_group=1, topk_group=1,
            first_k_dense_replace=1, use_qk_norm=True),
    _family("lfm2", "Lfm2ForCausalLM", "Lfm2Config",
            "hybrid: gated short-convolution layers between QK-norm attention layers",
            **_LLAMA_SHAPE, layer_types=["conv", "full_attention"] * 2,
            block_auto_adjust_ff_dim=False),
    # Granite-4.0-H: NoPE attention as in the real checkpoints; Mamba2 heads of 32 over 2 x d.
    _family("granitemoehybrid", "GraniteMoeHybridForCausalLM", "GraniteMoeHybridConfig",
            "hybrid: Mamba2 layers between attention layers, MoE + shared MLP, Granite multipliers",
            **{**_LLAMA_SHAPE, "intermediate_size": 128}, shared_intermediate_size=256,
            num_local_experts=4, num_experts_per_tok=2,
            layer_types=["linear_attention", "full_attention"] * 2, mamba_n_heads=8,
            mamba_d_state=16, mamba_chunk_size=16, embedding_multiplier=6.0,
            residual_multiplier=0.5, attention_multiplier=0.125, logits_scaling=2.0),
)  # fmt: skip

FAMILIES: dict[str, FamilySpec] = {spec.slug: spec for spec in _FAMILY_LIST}


def family_dir(family: str) -> Path:
    """The cache folder of one built family (it may not exist yet)."""
    return cache_dir() / "synthetic" / f"{family}-{BUILD_VERSION}"


def source(model_id: str) -> Path:
    """The `ie.model_sources` entry point: `ie-synthetic/<family>` -> a built HF folder.

    `ie-synthetic/<family>-<scheme>` (`-w8a8`, `-w4a16`, `-fp8`) is the family quantized
    (`ie_eager.quantized`).
    """
    family, scheme = split_variant(model_id.removeprefix(SYNTHETIC_PREFIX))
    if scheme is None:
        return build(family)
    return build_variant(family, build(family), scheme)


def build(family: str) -> Path:
    """Build family `family` into the cache once (atomically) and return its folder."""
    spec = FAMILIES.get(family)
    if spec is None:
        known = ", ".join(sorted(FAMILIES))
        raise ModelNotFoundError(
            f"unknown synthetic family {family!r}; known families: {known} "
            f"(use the id {SYNTHETIC_PREFIX}<family>)"
        )
    return materialize(family_dir(family), lambda folder: write_family(spec, folder))


def write_family(spec: FamilySpec, folder: Path) -> None:
    """Write model weights, config and tokenizer of `spec` into an existing empty folder."""
    tokenizer = build_tokenizer()
    assert len(tokenizer) == VOCAB_SIZE, f"tokenizer trained to {len(tokenizer)} tokens"
    model = build_model(spec)
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    name_tokenizer_class(folder)


def make_config(spec: FamilySpec) -> PretrainedConfig:
    """The family's config with the shared vocabulary, special token ids and float32."""
    config_class = getattr(transformers, spec.config_class)
    config = config_class(
        vocab_size=VOCAB_SIZE,
        bos_token_id=BOS_ID,
        eos_token_id=EOS_ID,
        pad_token_id=PAD_ID,
        **{key: _copy(value) for key, value in spec.settings.items()},
    )
    config.architectures = [spec.architecture]
    config.dtype = torch.float32
    return config


def build_model(spec: FamilySpec) -> PreTrainedModel:
    """A float32 model of `spec` with seeded random weights, every parameter non-constant."""
    config = make_config(spec)
    torch.manual_seed(spec.seed)
    model_class = getattr(transformers, spec.architecture)
    model: PreTrainedModel = model_class(config).to(torch.float32).eval()
    embedding = model.get_input_embeddings()
    assert isinstance(embedding, torch.nn.Embedding)
    with torch.no_grad():
        embedding.weight.mul_(spec.embedding_scale)
    generator = torch.Generator().manual_seed(spec.seed)
    _perturb_constant_parameters(model, generator)
    _perturb_buffers(model, spec.perturb_buffers, generator)
    return model


def _perturb_buffers(
    model: torch.nn.Module, suffixes: tuple[str, ...], gen: torch.Generator
) -> None:
    with torch.no_grad():
        for name, buffer in model.named_buffers():
            if suffixes and name.endswith(suffixes):
                buffer.add_((torch.randn(buffer.shape, generator=gen) * 0.02).to(buffer.dtype))


def _perturb_constant_parameters(model: torch.nn.Module, generator: torch.Generator) -> None:
    """Add noise to parameters HF initializes to a constant (norm gains 1 or 0, biases 0).

    Constant gains and zero biases hide bugs (a dropped bias, a wrong `1 + w`, a norm folded
    twice): with noise, every parameter changes the output, on random weights as on real ones.
    """
    with torch.no_grad():
        for name, parameter in model.named_parameters():
            flat = parameter.flatten()
            if flat.numel() == 0 or not bool((flat == flat[0]).all()):
                continue
            scale = 0.02 if name.endswith("bias") else 0.1
            noise = torch.randn(parameter.shape, generator=generator) * scale
            parameter.add_(noise.to(parameter.dtype))


def build_tokenizer() -> PreTrainedTokenizerFast:
    """A byte-level BPE of `VOCAB_SIZE` tokens trained on `CORPUS`, with a trivial chat template.

    The tokenizer prepends `<bos>` (as Llama's does) so position 0 is the same token everywhere.
    """
    backend = Tokenizer(models.BPE(unk_token=UNK))
    backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    backend.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB_SIZE,
        min_frequency=1,
        special_tokens=list(SPECIAL_TOKENS),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    backend.train_from_iterator(CORPUS.splitlines(keepends=True), trainer=trainer)
    backend.post_processor = processors.TemplateProcessing(
        single=f"{BOS} $A",
        pair=f"{BOS} $A {BOS} $B",
        special_tokens=[(BOS, BOS_ID)],
    )
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=backend,
        bos_token=BOS,
        eos_token=EOS,
        unk_token=UNK,
        pad_token=PAD,
        model_max_length=512,
        clean_up_tokenization_spaces=False,
    )
    tokenizer.chat_template = CHAT_TEMPLATE
    return tokenizer


def _copy(value: Any) -> Any:
    """A fresh copy of a settings value, so configs never share (and mutate) spec state."""
    if isinstance(value, dict):
        return {key: _copy(item) for key, item in value.items()}
    if isinstance(value, list):
        return [_copy(item) for item in value]
    return value
