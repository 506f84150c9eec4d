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
from ie_core.logprobs import MAX_LOGPROBS, StepLogprobs
from ie_core.runner import run
from vllm_parity import by_point, scaled_diffs, servable_addresses

__all__ = ["GreedyAgreement", "QuantParity", "greedy_agreement", "measure"]

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


@dataclass(frozen=True)
class GreedyAgreement:
    """Greedy tokens of vLLM and eager from one prompt, and the logit numbers that explain them.

    `errors[s]` is the largest change the backend makes to any pairwise logit gap among the
    tokens both rank in their top 20 at step s: the range of lp_vllm(t) - lp_eager(t) over those
    tokens (log-softmax shifts every logit of a step by one constant, so the range is the logit
    error that can reorder two tokens). Steps are compared while the prefixes are equal.
    """

    agreed: int  # equal tokens before the first divergence (n when none)
    gaps: tuple[float, ...]  # eager's top-2 logprob gap at each compared step
    errors: tuple[float, ...]  # the logit error at each compared step (see above)

    @property
    def divergence_gap(self) -> float:
        """Eager's top-2 gap at the step where the tokens part (inf when they never do)."""
        return self.gaps[self.agreed] if self.agreed < len(self.gaps) else float("inf")


def _gap_error(got: StepLogprobs, want: StepLogprobs) -> float:
    theirs = dict(zip(got.top_ids, got.top_logprobs, strict=True))
    diffs = [
        theirs[t] - lp for t, lp in zip(want.top_ids, want.top_logprobs, strict=True) if t in theirs
    ]
    return max(diffs) - min(diffs) if len(diffs) > 1 else float("inf")


def greedy_agreement(vllm_q: Any, eager_q: Any, ids: Sequence[int], n: int) -> GreedyAgreement:
    params = SamplingParams(max_new_tokens=n, stop_at_eos=False, logprobs=MAX_LOGPROBS)
    got = run(vllm_q.generate(list(ids), params))
    want = run(eager_q.generate(list(ids), params))
    assert got.logprobs is not None and want.logprobs is not None
    agreed = next(
        (s for s, (a, b) in enumerate(zip(got.token_ids, want.token_ids, strict=True)) if a != b), n
    )
    steps = range(min(agreed + 1, n))
    return GreedyAgreement(
        agreed,
        tuple(want.logprobs[s].top_logprobs[0] - want.logprobs[s].top_logprobs[1] for s in steps),
        tuple(_gap_error(got.logprobs[s], want.logprobs[s]) for s in steps),
    )
