"""Per-step log-probabilities of a generation: what `SamplingParams(logprobs=k)` asks for.

Every backend reports the same quantity: the log-softmax of the model's own next-token logits
(after any logit multiplier and final softcap, before temperature, top-k or top-p), so a sampled
run and a greedy run report the same numbers for the same prefix. vLLM calls this
`logprobs_mode="raw_logprobs"`, its default.
"""

from __future__ import annotations

from dataclasses import dataclass

from ie_core.errors import SamplingParamsError

MAX_LOGPROBS = 20  # vLLM's default `max_logprobs`; the same cap on every backend


@dataclass(frozen=True)
class StepLogprobs:
    """One generated step: the chosen token's logprob and the top-k (id, logprob), best first."""

    token_id: int
    logprob: float
    top_ids: tuple[int, ...]
    top_logprobs: tuple[float, ...]


def check_logprobs(value: object) -> None:
    """None (off) or an int in [0, MAX_LOGPROBS]; 0 returns the chosen token's logprob only."""
    if value is None:
        return
    if isinstance(value, bool) or not isinstance(value, int):
        raise SamplingParamsError(
            f"logprobs must be None or an int, got {type(value).__name__} {value!r}"
        )
    if not 0 <= value <= MAX_LOGPROBS:
        raise SamplingParamsError(
            f"logprobs must be in 0..{MAX_LOGPROBS} (top-k per step; 0 = the chosen token "
            f"only), got {value}"
        )


__all__ = ["MAX_LOGPROBS", "StepLogprobs", "check_logprobs"]
