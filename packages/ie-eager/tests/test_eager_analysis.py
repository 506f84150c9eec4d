"""ie_core.experiments.analysis on eager: head contributions sum to attn_out, routing, chat message spans."""

from __future__ import annotations

import pytest
import torch
from eager_support import FAMILY_SLUGS, PROMPT, synthetic_model
from ie_core.errors import PointUnavailableError
from ie_core.experiments.analysis import (
    chat_spans,
    expert_assignment,
    head_contributions,
    topk_experts,
)
from ie_core.sync import SyncModel
from ie_eager.analysis import out_projection

TOL = 1e-5


@pytest.mark.parametrize("slug", FAMILY_SLUGS)
def test_head_contributions_sum_to_attn_out(slug: str) -> None:
    model = SyncModel(synthetic_model(slug))
    layer = 0
    try:
        weight, bias = out_projection(model.model, layer)
        cache = model.capture(PROMPT, [f"z.{layer}", f"attn_out.{layer}"])
    except PointUnavailableError as err:
        pytest.skip(f"{slug}: {err}")
    z, attn_out = cache[f"z.{layer}"], cache[f"attn_out.{layer}"]
    n_heads = model.model.structure.shapes.n_heads
    parts = head_contributions(z, weight, n_heads)
    assert parts.shape == (*z.shape[:-1], n_heads, model.d_model)
    total = parts.sum(-2) + (0 if bias is None else bias)
    assert float((total - attn_out).abs().max()) < TOL
    # Negative control: heads sliced innermost ([head_dim, n_heads]) mix heads; one head's
    # contribution moves even though the sum is the same matmul.
    head_dim = z.shape[-1] // n_heads
    wrong = torch.einsum(
        "...dh,mdh->...hm",
        z.reshape(*z.shape[:-1], head_dim, n_heads),
        weight.reshape(weight.shape[0], head_dim, n_heads),
    )
    assert float((wrong[..., 0, :] - parts[..., 0, :]).abs().max()) > 100 * TOL


@pytest.mark.parametrize("slug", ["mixtral", "qwen2-moe", "qwen3-moe"])
def test_router_top_k_is_the_models_routing(slug: str) -> None:
    model = SyncModel(synthetic_model(slug))
    layer = next(i for i in range(model.n_layers) if f"router_logits.{i}" in _served(model, i))
    cache = model.capture(PROMPT, [f"router_logits.{layer}", f"expert_indices.{layer}"])
    logits, chosen = cache[f"router_logits.{layer}"], cache[f"expert_indices.{layer}"].long()
    k, n_experts = chosen.shape[-1], logits.shape[-1]
    mine = topk_experts(logits, k)
    assert torch.equal(mine.sort(-1).values, chosen.sort(-1).values)
    assignment = expert_assignment(chosen, n_experts)
    assert assignment.shape == (*chosen.shape[:-1], n_experts)
    assert assignment.sum(-1).eq(k).all()
    assert torch.equal(assignment, expert_assignment(mine, n_experts))
    # Negative control: a router read one expert off (k - 1 plus the worst) is not the routing.
    worst = torch.topk(-logits.float(), 1, dim=-1).indices
    assert not torch.equal(
        expert_assignment(torch.cat([mine[..., :-1], worst], -1), n_experts), assignment
    )


def _served(model: SyncModel, layer: int) -> set[str]:
    try:
        model.point_width(f"router_logits.{layer}")
    except Exception:
        return set()
    return {f"router_logits.{layer}"}


def test_chat_spans_cover_each_message() -> None:
    from ie_core import load_model

    model = load_model("HuggingFaceTB/SmolLM2-135M-Instruct", backend="eager")
    messages = [
        {"role": "system", "content": "You answer briefly."},
        {"role": "user", "content": "What is the capital of France?"},
        {"role": "assistant", "content": "Paris."},
        {"role": "user", "content": "And of Japan?"},
    ]
    spans = chat_spans(model, messages)
    text = model.apply_chat_template(messages)
    assert list(spans.ids) == model.to_tokens(text, prepend_bos=False)
    assert [s.role for s in spans.spans] == [m["role"] for m in messages]
    assert spans.spans[0].start == 0
    for a, b in zip(spans.spans, spans.spans[1:], strict=False):
        assert a.stop == b.start and a.start < a.stop

    # SmolLM2's template is ChatML: each span is exactly one turn, markers included.
    def turn(m: dict[str, str]) -> str:
        return f"<|im_start|>{m['role']}\n{m['content']}<|im_end|>\n"

    for span, message in zip(spans.spans, messages, strict=True):
        assert model.to_string(spans.ids[span.start : span.stop]) == turn(message)
    assert model.to_string(spans.ids[spans.spans[-1].stop :]) == "<|im_start|>assistant\n"
    # Negative control: a boundary off by one row no longer gives the turn.
    s = spans.spans[1]
    assert model.to_string(spans.ids[s.start + 1 : s.stop + 1]) != turn(messages[1])
