"""A request's captured rows as the host gets them back: each captured address read from the
worker's sites (attention maps recomputed from the tapped q and k), then its reducers' outputs.
Hooked vLLM and vllm-static keep rows the same way (`registry.Rows` per site) and differ only in
which sites an address reads, which the caller passes."""

from __future__ import annotations

from collections.abc import Callable

import torch
from ie_core.grammar import to_address

from ie_vllm.specs import RequestSpec
from ie_vllm.worker.point_table import AttnGeom
from ie_vllm.worker.registry import Rows, gather_reduced
from ie_vllm.worker.transfer import to_device

ATTN_POINTS = ("attn_scores", "attn_probs")


def capture_sites(address: str) -> tuple[str, ...]:
    """The hook sites an address needs (attention scores are recomputed from q and k)."""
    addr = to_address(address)
    if addr.name in ATTN_POINTS:
        return (f"attn_q.{addr.layer}", f"attn_k.{addr.layer}")
    return (address,)


def attention_rows(
    q: torch.Tensor, k: torch.Tensor, geom: AttnGeom, start: int, probs: bool
) -> torch.Tensor:
    """Scores (or probabilities) `[heads, q rows, k rows]` for queries at positions start.. of k.

    q: `[nq, heads*head_dim]` post-RoPE at positions start..start+nq-1; k: `[nk, kv*head_dim]`
    post-RoPE at positions 0..nk-1. Masked entries are the dtype's min, as in eager.
    """
    nq, nk = q.shape[0], k.shape[0]
    qh = q.reshape(nq, geom.heads, geom.head_dim).transpose(0, 1).float()
    kh = k.reshape(nk, geom.kv_heads, geom.head_dim).transpose(0, 1).float()
    kh = kh.repeat_interleave(geom.heads // geom.kv_heads, dim=0)
    scores = (qh @ kh.transpose(-1, -2)) * geom.scale
    if geom.softcap:
        scores = geom.softcap * torch.tanh(scores / geom.softcap)
    qpos = torch.arange(start, start + nq, device=q.device)[:, None]
    kpos = torch.arange(nk, device=q.device)[None, :]
    if geom.alibi:
        # BLOOM's scores carry slope * key position (HF's build_alibi_tensor).
        slopes = to_device(torch.tensor(geom.alibi, dtype=scores.dtype), q.device)
        scores = scores + slopes[:, None, None] * kpos.to(scores.dtype)
    visible = kpos <= qpos
    if geom.window:
        visible &= (qpos - kpos) < geom.window
    scores = scores.masked_fill(~visible, torch.finfo(scores.dtype).min)
    if probs and geom.sinks:
        # gpt-oss: each row's softmax includes the head's sink logit, which is then dropped
        # (rows need not sum to 1), as HF's eager_attention_forward does.
        sink = to_device(torch.tensor(geom.sinks, dtype=scores.dtype), q.device)
        sink = sink[:, None, None].expand(-1, nq, 1)
        return torch.softmax(torch.cat([scores, sink], dim=-1), dim=-1)[..., :-1].to(q.dtype)
    out = torch.softmax(scores, dim=-1) if probs else scores
    return out.to(q.dtype)


def gather_captures(
    spec: RequestSpec,
    rows: dict[str, Rows],
    sites_of: Callable[[str], tuple[str, ...]],
    attn: dict[int, AttnGeom],
    start: int,
    stop: int | None,
) -> dict[str, torch.Tensor]:
    """Rows for positions [start, stop) of every address `spec` captures and every output of its
    reducers. `sites_of` names the sites an address was kept under (q then k for an attention
    map); an address whose rows are not all here (another pipeline stage's) is left out."""
    out: dict[str, torch.Tensor] = {}
    for address in spec.captures:
        got = [rows.get(name) for name in sites_of(address)]
        kept = [r for r in got if r is not None]
        if not got or len(kept) < len(got):
            continue
        addr = to_address(address)
        if addr.name not in ATTN_POINTS:
            out[address] = kept[0].gather(start, stop)
            continue
        geom = attn.get(addr.layer) if addr.layer is not None else None
        if geom is not None:
            q, k = kept[0].gather(start, stop), kept[1].gather(0, stop)
            out[address] = attention_rows(q, k, geom, start, addr.name == "attn_probs")
    out.update(gather_reduced(rows, spec.reducers, start, stop))
    return out


__all__ = ["ATTN_POINTS", "attention_rows", "capture_sites", "gather_captures"]
