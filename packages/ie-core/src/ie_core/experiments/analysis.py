"""Analysis helpers over captured tensors: per-head contributions to attn_out, MoE expert
assignment per token, and which token rows belong to which chat message.

Pure functions of tensors (and, for chat spans, of the model's tokenizer and chat template), so
they work on a cache from any backend. Importing this module imports torch.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch

from ie_core.errors import UnsupportedOperationError


def head_contributions(z: torch.Tensor, o_weight: torch.Tensor, n_heads: int) -> torch.Tensor:
    """Each head's write into attn_out: `[..., n_heads * head_dim]` z rows and the output
    projection's weight `[d_model, n_heads * head_dim]` (torch Linear layout) give
    `[..., n_heads, d_model]`; summed over heads plus the projection's bias this is attn_out.

    Head h owns z columns `h * head_dim .. (h + 1) * head_dim` (the layout every family's
    o_proj reads: heads outermost)."""
    width = z.shape[-1]
    if o_weight.ndim != 2 or o_weight.shape[1] != width:
        raise ValueError(
            f"o_weight must be [d_model, {width}] for z rows of width {width}, got "
            f"{tuple(o_weight.shape)}"
        )
    if n_heads < 1 or width % n_heads:
        raise ValueError(f"z width {width} does not split into {n_heads} heads")
    head_dim = width // n_heads
    per_head = z.reshape(*z.shape[:-1], n_heads, head_dim)
    w = o_weight.to(z.dtype).reshape(o_weight.shape[0], n_heads, head_dim)
    return torch.einsum("...hd,mhd->...hm", per_head, w)


def topk_experts(router_logits: torch.Tensor, k: int) -> torch.Tensor:
    """The top-k expert indices per token from router logits `[..., n_experts]`, best first.

    This is the routing of softmax-then-top-k routers (Mixtral, Qwen-MoE, OLMoE): softmax is
    monotonic, so the top-k of the logits is the top-k of the probabilities. Routers with a
    selection bias or group limits (DeepSeek-V3) choose differently: read `expert_indices`."""
    if not 1 <= k <= router_logits.shape[-1]:
        raise ValueError(f"k must be in 1..{router_logits.shape[-1]}, got {k}")
    return torch.topk(router_logits.float(), k, dim=-1).indices


def expert_assignment(expert_indices: torch.Tensor, n_experts: int) -> torch.Tensor:
    """`[..., k]` expert indices -> `[..., n_experts]` bool: True where the token went."""
    idx = expert_indices.long()
    if idx.numel() and (idx.min() < 0 or idx.max() >= n_experts):
        raise ValueError(f"expert indices must lie in 0..{n_experts - 1}")
    out = torch.zeros((*idx.shape[:-1], n_experts), dtype=torch.bool, device=idx.device)
    return out.scatter(-1, idx, True)


@dataclass(frozen=True)
class MessageSpan:
    """Token rows `start..stop` (stop exclusive) of message `index` in the templated prompt,
    the template's own markers (role header, end-of-turn) included."""

    index: int
    role: str
    start: int
    stop: int


@dataclass(frozen=True)
class ChatSpans:
    """The templated prompt's ids and one span per message; rows from the last span's stop to
    the end are the generation prompt (the assistant header), if one was added."""

    ids: tuple[int, ...]
    spans: tuple[MessageSpan, ...]


def chat_spans(
    model: Any,
    messages: Sequence[dict[str, str]],
    *,
    add_generation_prompt: bool = True,
    prepend_bos: bool = False,
) -> ChatSpans:
    """Which rows of `model.to_tokens(model.apply_chat_template(messages))` belong to which
    message: the template is rendered for each prefix of the conversation and message i's rows
    are where prefix i+1's tokens extend prefix i's. Text the template puts before the first
    message (a default system prompt) counts toward message 0. A template that re-renders
    earlier messages when later ones arrive is refused (its prefixes do not nest)."""
    if not messages:
        raise ValueError("chat_spans needs at least one message")

    def ids(msgs: Sequence[dict[str, str]], gen: bool) -> list[int]:
        text = model.apply_chat_template(list(msgs), add_generation_prompt=gen)
        return list(model.to_tokens(text, prepend_bos=prepend_bos))

    full = ids(messages, add_generation_prompt)
    spans: list[MessageSpan] = []
    start = 0
    for i, message in enumerate(messages):
        prefix = ids(messages[: i + 1], False)
        if full[: len(prefix)] != prefix or len(prefix) < start:
            raise UnsupportedOperationError(
                f"{getattr(model, 'model_id', 'this model')}'s chat template renders messages "
                f"0..{i} differently once later messages follow, so token rows cannot be "
                "assigned to messages by prefix; split the prompt by hand"
            )
        spans.append(MessageSpan(i, str(message.get("role", "")), start, len(prefix)))
        start = len(prefix)
    return ChatSpans(tuple(full), tuple(spans))


__all__ = [
    "ChatSpans",
    "MessageSpan",
    "chat_spans",
    "expert_assignment",
    "head_contributions",
    "topk_experts",
]
