"""Per-step logprobs on eager: the log-softmax of the step's logits row, in fp32."""

from __future__ import annotations

import torch
from ie_core.logprobs import StepLogprobs


def step_logprobs(logits: torch.Tensor, token: int, k: int) -> StepLogprobs:
    """`logits` is one `[vocab]` row as the model computed it (multiplier and softcap included);
    temperature and top-k/top-p are sampling choices and do not enter (vLLM's raw_logprobs)."""
    logp = torch.log_softmax(logits.detach().float(), dim=-1)
    values, ids = torch.topk(logp, min(k, logp.numel()))
    return StepLogprobs(
        token_id=int(token),
        logprob=float(logp[token]),
        top_ids=tuple(int(i) for i in ids),
        top_logprobs=tuple(float(v) for v in values),
    )


__all__ = ["step_logprobs"]
