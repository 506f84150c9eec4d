"""Quantized-checkpoint parity helpers: a vLLM engine serving `ie-synthetic/<family>-<scheme>` in
bfloat16 against eager references (the same quantized checkpoint, and the full-precision family).

vLLM 0.32's CPU kernels for INT8 W8A8 and WNA16 take bf16 / fp16 activations only
(ie_vllm.host.cpu_support refuses float32), so the engine runs in bfloat16. The reference is eager on
the same checkpoint in float32: compressed-tensors dequantizes the weights to float32 at load and
fake-quantizes the activations of W8A8 / FP8 in float32, so the difference measured is vLLM's
bf16 compute and its integer / fp8 kernels, not the quantization itself.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from ie_core import SamplingParams
from ie_core.runner import run
from vllm_parity import by_point, scaled_diffs, servable_addresses

__all__ = ["QuantParity", "first_divergence", "measure"]

QUANT_DTYPE = "bfloat16"


@dataclass(frozen=True)
class QuantParity:
    """Per point name: vLLM (quantized) vs eager on the same checkpoint, and vs full precision."""

    same: dict[str, float]  # worst scaled diff over layers against eager, quantized checkpoint
    control: dict[str, float]  # the same against eager on the control checkpoint


def measure(vllm_q: Any, eager_q: Any, eager_control: Any, ids: Sequence[int]) -> QuantParity:
    addresses = [a for a in servable_addresses(vllm_q) if not a.startswith("attn_scores")]
    got = run(vllm_q.capture([list(ids)], addresses))
    same = run(eager_q.capture([list(ids)], addresses))
    other = run(eager_control.capture([list(ids)], addresses))
    return QuantParity(
        by_point(scaled_diffs(got, same, addresses)), by_point(scaled_diffs(got, other, addresses))
    )


def first_divergence(vllm_q: Any, eager_q: Any, ids: Sequence[int], n: int) -> tuple[int, float]:
    """(index of the first differing greedy token or n, eager's top-2 logit gap there)."""
    params = SamplingParams(max_new_tokens=n, stop_at_eos=False)
    got = run(vllm_q.generate(list(ids), params)).token_ids
    want = run(eager_q.generate(list(ids), params)).token_ids
    for step, (a, b) in enumerate(zip(got, want, strict=True)):
        if a != b:
            last = f"resid_post.{eager_q.n_layers - 1}"
            prefix = [list(ids) + list(want[:step])]
            row = run(eager_q.capture(prefix, [last]))[last][0, -1:]
            top = run(eager_q.decode_residuals(row))[-1].float().topk(2).values
            return step, float(top[0] - top[1])
    return n, float("inf")
