"""Per-step logprobs on the vLLM backends: vLLM's own (SamplingParams.logprobs, raw_logprobs mode)
turned into ie_core's StepLogprobs."""

from __future__ import annotations

from typing import Any

from ie_core.logprobs import StepLogprobs


def step(entry: dict[int, Any], token: int, k: int) -> StepLogprobs:
    """One step from vLLM's `{token_id: Logprob}`: the top-k by rank plus the sampled token."""
    if token not in entry:
        raise RuntimeError(f"vLLM returned no logprob for the sampled token {token}")
    ranked = sorted(
        ((lp.rank, tid, lp.logprob) for tid, lp in entry.items() if lp.rank is not None),
        key=lambda r: r[0],
    )[:k]
    return StepLogprobs(
        token_id=int(token),
        logprob=float(entry[token].logprob),
        top_ids=tuple(int(tid) for _, tid, _ in ranked),
        top_logprobs=tuple(float(v) for _, _, v in ranked),
    )


def steps(completion: Any, k: int, start: int = 0) -> tuple[StepLogprobs, ...]:
    """Steps `start..` of one CompletionOutput (cumulative token ids and logprobs)."""
    entries = completion.logprobs
    tokens = list(completion.token_ids)
    if entries is None or len(entries) < len(tokens):
        raise RuntimeError(
            f"vLLM returned logprobs for {0 if entries is None else len(entries)} of "
            f"{len(tokens)} generated tokens"
        )
    return tuple(step(entries[i], tokens[i], k) for i in range(start, len(tokens)))


__all__ = ["step", "steps"]
