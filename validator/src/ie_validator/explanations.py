"""Why a cell of the matrix is not a pass: a declared gap or a named upstream bug, as data.

Keys are `(engine, family)`. The README lists every non-pass cell with its explanation, and
`UNEXPLAINED` where none is recorded, so a new failure cannot hide behind an old note.
"""

from __future__ import annotations

from typing import Any

_TL_SCORES_ARE_PATTERN = (
    "upstream bug, TransformerLens 4.3.0: on the {0} bridge `blocks.L.attn.hook_attn_scores` "
    "carries the softmaxed pattern (bit-identical to `hook_pattern`, rows sum to 1, no mask), not "
    "the pre-softmax scores; every other point of the model passes, attn_probs included"
)

_VLLM_BLOOM_GELU = (
    "by design, vLLM 0.32: its BloomMLP applies the exact (erf) GELU where HF's BloomGelu uses "
    "the tanh approximation, so every point after layer 0's MLP differs by up to 3e-4 relative "
    "(above the fused gate's 1e-4; cos >= 0.99999995); with eager's GELU switched to the exact "
    "form the points agree within 1e-4 (ie-vllm's parity tests, vllm_parity.ENGINE_DIFFERENCES) and "
    "greedy tokens are equal either way"
)

EXPLANATIONS: dict[tuple[str, str], str] = {
    ("vllm", "bloom"): _VLLM_BLOOM_GELU,
    ("vllm-static", "bloom"): _VLLM_BLOOM_GELU,
    ("transformer-lens", "gpt-j"): _TL_SCORES_ARE_PATTERN.format("GPT-J"),
    ("transformer-lens", "opt"): _TL_SCORES_ARE_PATTERN.format("OPT"),
    ("transformer-lens", "falcon"): (
        "upstream bug, TransformerLens 4.3.0: its Falcon adapter splits the fused query_key_value "
        "as [d_model, kv, kv], which is wrong for the new decoder architecture (grouped per KV "
        "head), so `boot_transformers` raises before any forward"
    ),
    ("nnterp", "deepseek-v4"): (
        "nnterp 1.3 cannot standardize a hyper-connection trunk: its IO check of the decoder "
        "layers fails (RenamingError: Could not check the IO), since a layer takes and returns "
        "a stack of residual streams, not one hidden state"
    ),
    ("nnterp", "lfm2"): (
        "nnterp 1.3 finds no attention module on every layer of this hybrid (short-convolution "
        "layers have none) and asks for attn_rename, so it cannot load the model"
    ),
    ("nnterp", "qwen3-next"): (
        "nnterp 1.3 finds no attention module on every layer of this hybrid (gated-delta "
        "layers have linear_attn instead) and asks for attn_rename, so it cannot load the model"
    ),
    ("transformer-lens", "granitemoehybrid"): (
        "upstream bug, TransformerLens 4.3.0: its Granite-4.0-H adapter maps model.rotary_emb "
        "even on a NoPE config (position_embedding_type None, as in the real Granite-4.0-H "
        "checkpoints), where HF builds no rotary embedding, so the forward raises 'Original "
        "component not set for model.rotary_emb'; the same build with position_embedding_type "
        "'rope' runs"
    ),
    ("nnterp", "granitemoehybrid"): (
        "nnterp 1.3 standardizes self_attn from layer 0, which HF sets to None on this hybrid's "
        "Mamba2 layers (layer 0 is one), so its IO check reading attentions_input[0] fails "
        "(RenamingError: Could not check the IO) and it cannot load the model"
    ),
    ("nnterp", "gpt-oss"): (
        "by design, nnterp 1.3: StandardizedTransformer checks at load that attention "
        "probabilities sum to 1, and gpt-oss's learned sinks take a share of every softmax row "
        "(rows sum to less than 1), so nnterp refuses the model with RenamingError"
    ),
}


# The words `ie_vllm.host.cpu_support.check_cpu_support` refuses a checkpoint with, before any engine
# starts; the error that follows them is vLLM's own, recorded there per architecture.
_CPU_REFUSAL = "(CPU) cannot run"


# TransformerLens on a compressed-tensors checkpoint (every quantized scheme fails the same way).
_TL_COMPRESSED = (
    "upstream limitation, TransformerLens 4.3.0 with compressed-tensors 0.17: transformers leaves "
    "the linears compressed and compressed-tensors decompresses them in a forward pre-hook on the "
    "model's first forward; under TransformerBridge that hook finds no `weight` entry "
    "(`weight_packed` for 4-bit) in the module state it decompresses (KeyError in the "
    "compressor's decompress), so the forward raises before any hook fires. nnsight runs the "
    "same HF model and is bit-exact"
)


def explain(engine: str, family: str, result: dict[str, Any]) -> str:
    """The recorded explanation of a non-pass cell, or "" (rendered UNEXPLAINED)."""
    error = str(result.get("error") or "")
    if result.get("quantization") and engine == "transformer-lens" and "KeyError: 'weight" in error:
        return _TL_COMPRESSED
    known = EXPLANATIONS.get((engine, family), "")
    if known:
        return known
    if (
        engine in ("vllm", "vllm-static")
        and "UnsupportedModelError" in error
        and _CPU_REFUSAL in error
    ):
        return (
            "vLLM's CPU build cannot construct this model (vLLM's error below, recorded per "
            "architecture in ie_vllm/host/cpu_support.py); the backend refuses it before starting an "
            "engine, and eager serves it"
        )
    return ""
