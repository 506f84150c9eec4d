"""Attention attribution on eager (ie_core.circuits.heads / qk, issue #45).

OV: head flows of graph edges against a hand-written frozen forward where a head's mixed values
are pinned at their prompt values (flow = target with the source off and the head pinned, less
target with the source off), on llama (GQA, rotary), gpt2 and a llama CLT; the per-layer
completeness; exact zeros where no path runs. QK: query- and key-side shares plus rests against
the model's captured attn_scores, single shares against the HF modules' own projections on
llama, gpt2 and qwen3 (QK norm). Negative controls: unfrozen norms, a wrong head, a wrong KV
group, no rotary. fp32 on the CPU."""

from __future__ import annotations

import dataclasses
import json
from types import SimpleNamespace
from typing import Any

import pytest
import torch
from eager_support import PROMPT, synthetic_model
from ie_core.circuits import (
    AttributionInputError,
    HeadFlows,
    ReplacementUnsupportedError,
    attention_shares,
    attribute_state,
    head_flows,
    prepare,
    qk_weights_for,
    random_transcoder,
    top_edge_heads,
    write_layer_file,
)
from ie_core.circuits.clt import random_clt
from ie_core.circuits.graph import Graph
from ie_core.circuits.heads import graph_source, graph_target
from ie_core.circuits.prompt_state import PromptState
from ie_core.circuits.qk import qk_weights_of
from ie_core.runner import run

TOL = 1e-5


@pytest.fixture(scope="module", params=("llama", "gpt2", "llama-clt"))
def traced(request: pytest.FixtureRequest) -> tuple[str, PromptState, Graph]:
    slug = request.param
    m = synthetic_model(slug.removesuffix("-clt"))
    if slug.endswith("-clt"):
        ts: Any = random_clt(m.d_model, 32, m.n_layers, seed=4)
    else:
        ts = [random_transcoder(m.d_model, 48, i, seed=10 + i) for i in range(m.n_layers)]
    st = prepare(m, PROMPT, ts)
    return slug, st, attribute_state(st)


def _hand_norm(x: torch.Tensor, nw: Any, scale: torch.Tensor | None) -> torch.Tensor:
    h = x - x.mean(-1, keepdim=True) if nw.centred else x
    s = torch.rsqrt(h.pow(2).mean(-1) + nw.eps) if scale is None else scale
    out = h * s[:, None] * nw.weight
    return out if nw.bias is None else out + nw.bias


def _hand_forward(
    st: PromptState, off: int | None = None, pin: dict[tuple[int, int], torch.Tensor] | None = None
) -> dict[str, Any]:
    """The frozen replacement written out head by head, source `off` (state order) at
    coefficient 0, heads in `pin` held at the given mixed values. Returns norm1 outputs, each
    head's z, the MLP inputs and the final norm's output."""
    src, w, fr = st.sources, st.weights, st.frozen
    n_feat, n_pos = st.active_features.shape[0], st.n_pos
    c = torch.ones(n_feat + (st.n_layers + 1) * n_pos)
    if off is not None:
        c[off] = 0
    c_err = c[n_feat : n_feat + st.n_layers * n_pos].view(st.n_layers, n_pos)
    writes = src.mlp_const + c_err[..., None] * src.errors
    vecs = c[src.write_feat, None] * src.decoder_vecs
    writes = writes.index_put((src.write_layer, src.write_pos), vecs, accumulate=True)
    resid = src.position_const + c[-n_pos:, None] * src.token_vectors
    frz = st.freeze_norms
    out: dict[str, Any] = {"attn_in": [], "z": {}, "mlp_in": []}
    for layer, lw in enumerate(w.layers):
        h = _hand_norm(resid, lw.norm1, fr.scale_attn[layer] if frz else None)
        out["attn_in"].append(h)
        v = h @ lw.W_V.T + (0 if lw.b_V is None else lw.b_V)
        hd, group = lw.head_dim, lw.n_heads // lw.n_kv_heads
        add = torch.zeros_like(resid) if lw.b_O is None else lw.b_O.expand_as(resid)
        for j in range(lw.n_heads):
            kv = j // group
            z = fr.patterns[layer][j] @ v[:, kv * hd : (kv + 1) * hd]
            z = (pin or {}).get((layer, j), z)
            out["z"][layer, j] = z
            add = add + z @ lw.W_O[:, j * hd : (j + 1) * hd].T
        resid = resid + add
        out["mlp_in"].append(_hand_norm(resid, lw.norm2, fr.scale_mlp[layer] if frz else None))
        resid = resid + writes[layer]
    out["final"] = _hand_norm(resid, w.final_norm, fr.scale_final if frz else None)
    return out


def _target_value(st: PromptState, out: dict[str, Any], t: int) -> float:
    n_feat = st.active_features.shape[0]
    if t < n_feat:
        layer, pos, _ = (int(v) for v in st.active_features[t])
        return float(out["mlp_in"][layer][pos] @ st.encoder_vecs[t])
    return float(out["final"][-1] @ st.unembed_dirs[t - n_feat])


def _brute(st: PromptState, s: int, t: int) -> tuple[float, torch.Tensor, torch.Tensor]:
    """Edge (target at c = 1 less at c_s = 0), per-head flows (source off with the head pinned
    at its c = 1 value, less source off) and the edges skipping each whole layer's heads."""
    full = _hand_forward(st)
    t1, t0 = _target_value(st, full, t), _target_value(st, _hand_forward(st, s), t)
    lw = st.weights.layers[0]
    flows = torch.zeros(st.n_layers, lw.n_heads, dtype=torch.float64)
    skip = torch.zeros(st.n_layers, dtype=torch.float64)
    for layer in range(st.n_layers):
        for j in range(lw.n_heads):
            pinned = _hand_forward(st, s, {(layer, j): full["z"][layer, j]})
            flows[layer, j] = _target_value(st, pinned, t) - t0
        pin = {(layer, j): full["z"][layer, j] for j in range(lw.n_heads)}
        skip[layer] = t1 - _target_value(st, _hand_forward(st, s, pin), t)
    return t1 - t0, flows, skip


def _edges(g: Graph) -> list[tuple[int, int]]:
    """(source, target) graph nodes: a token to the top logit, the largest cross-position edge
    from a layer-0 feature to a logit, from an error node and from a token into a last-position
    feature, and a feature-to-feature edge at any positions."""
    nodes = g.nodes()
    kind = [n.kind for n in nodes]
    layer = torch.tensor([n.layer for n in nodes])
    pos = torch.tensor([n.pos for n in nodes])

    def of(k: str) -> torch.Tensor:
        return torch.tensor([x == k for x in kind])

    def best(src_ok: torch.Tensor, tgt_ok: torch.Tensor) -> tuple[int, int]:
        score = torch.where(tgt_ok[:, None] & src_ok[None, :], g.adjacency.abs(), -1)
        i = int(torch.argmax(score))
        assert float(score.flatten()[i]) > 0, "no such edge on this prompt"
        return i % g.n_nodes, i // g.n_nodes

    last = g.n_pos - 1
    feat, at_last = of("feature"), pos == last
    return [
        (g.token_offset + 5, g.logit_offset),
        best(feat & (layer == 0) & ~at_last, of("logit")),
        best(of("error") & (layer == 1), feat & (layer == 3) & at_last),
        best(of("token") & (pos < last - 2), feat & (layer >= 2) & at_last),
        best(feat & (layer == 0), feat & (layer == 2)),
    ]


def test_head_flows_equal_pinned_head_differences(traced) -> None:
    _, st, g = traced
    hf = HeadFlows(st)
    for s_node, t_node in _edges(g):
        s, t = graph_source(st, g, s_node), graph_target(st, g, t_node)
        flows = hf.flows([(s, t)])[0].double()
        edge, brute, skip = _brute(st, s, t)
        scale = abs(edge) + float(brute.abs().sum())
        assert abs(edge - float(g.adjacency[t_node, s_node])) <= TOL * scale
        assert float((flows - brute).abs().max()) <= TOL * scale, (s_node, t_node)
        # Per-layer completeness: the edge is the path skipping layer l plus l's head flows.
        assert float((skip + flows.sum(1) - edge).abs().max()) <= TOL * scale
        # No path reaches heads at or below the source's layer or above the target's read.
        src_layer, tgt_node = g.node(s_node).layer, g.node(t_node)
        reach = tgt_node.layer + 1 if tgt_node.kind == "feature" else st.n_layers
        assert not flows[: max(src_layer + 1, 0)].any() and not flows[reach:].any()
        assert flows[max(src_layer + 1, 0) : reach].abs().sum() > 0
        # Negative control: another head's flows (heads rolled by one) miss the pinned ones.
        assert float((flows.roll(1, 1) - brute).abs().max()) > 100 * TOL * scale
    torch.testing.assert_close(
        head_flows(st, g, *_edges(g)[1]), hf.graph_flows(g, _edges(g)[1:2])[0]
    )


def test_negative_control_unfrozen_norms_miss_the_differences(traced) -> None:
    """Norm scales recomputed from the replacement's own residual: flows are then local
    derivatives of a non-linear map and no longer the pinned-head differences."""
    _, st, g = traced
    loose = dataclasses.replace(st, freeze_norms=False)
    s_node, t_node = _edges(g)[0]
    s, t = graph_source(st, g, s_node), graph_target(st, g, t_node)
    edge, brute, _ = _brute(loose, s, t)
    flows = HeadFlows(loose).flows([(s, t)])[0].double()
    assert float((flows - brute).abs().max()) > 1e-3 * (abs(edge) + float(brute.abs().sum()))


def test_top_edge_heads_and_refusals(traced) -> None:
    _, st, g = traced
    top = top_edge_heads(st, g, n_edges=5, n_heads=3)
    assert len(top) == 5 and all(g.node(e["source"]).pos != g.node(e["target"]).pos for e in top)
    w = [abs(e["weight"]) for e in top]
    pos = torch.tensor([n.pos for n in g.nodes()])
    cross = torch.where(pos[:, None] != pos[None, :], g.adjacency.abs(), 0)
    assert w == sorted(w, reverse=True) and w[0] == float(cross.max())
    assert all(len(e["heads"]) == 3 for e in top)
    with pytest.raises(AttributionInputError, match="no incoming edges"):
        head_flows(st, g, 0, g.token_offset)
    with pytest.raises(AttributionInputError, match="no outgoing edges"):
        head_flows(st, g, g.logit_offset, 0)


def _rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    half = torch.cat((-x[..., x.shape[-1] // 2 :], x[..., : x.shape[-1] // 2]), dim=-1)
    return x * cos + half * sin


def _hf_qk(slug: str, st: PromptState, h: torch.Tensor, layer: int) -> tuple[Any, Any]:
    """Query and key `[pos, heads, hd]` of norm1 output rows `h` through the HF modules' own
    projections, rotated with the HF rotary (families without a QK norm)."""
    hf: Any = synthetic_model(slug).hf_model
    lw = st.weights.layers[layer]
    hd = lw.head_dim
    if slug == "gpt2":
        attn = hf.transformer.h[layer].attn
        qkv = attn.c_attn(h)
        d = h.shape[-1]
        return qkv[:, :d].unflatten(-1, (-1, hd)), qkv[:, d : 2 * d].unflatten(-1, (-1, hd))
    attn = hf.model.layers[layer].self_attn
    q, k = attn.q_proj(h).unflatten(-1, (-1, hd)), attn.k_proj(h).unflatten(-1, (-1, hd))
    cos, sin = hf.model.rotary_emb(h[None], torch.arange(h.shape[0])[None])
    return _rotate(q, cos[0, :, None], sin[0, :, None]), _rotate(
        k, cos[0, :, None], sin[0, :, None]
    )


@pytest.mark.parametrize("slug", ("llama", "gpt2", "qwen3"))
def test_attention_shares_sum_to_the_captured_score(slug: str) -> None:
    m = synthetic_model(slug)
    st = prepare(m, PROMPT, [random_transcoder(m.d_model, 32, i, seed=i) for i in range(4)])
    qk = qk_weights_for(m)
    scores = run(m.capture([list(st.tokens)], [f"attn_scores.{i}" for i in (0, 1, 3)]))
    last = st.n_pos - 1
    for layer, head, key in ((0, 3, 5), (1, 1, 7), (3, 2, 0), (3, 3, last)):
        r = attention_shares(st, qk, layer, head, last, key)
        want = float(scores[f"attn_scores.{layer}"][0, head, last, key])
        tol = TOL * max(1.0, abs(want))
        assert abs(r.score - want) <= tol
        assert abs(float(r.query_shares.double().sum()) + r.query_rest - want) <= tol
        assert abs(float(r.key_shares.double().sum()) + r.key_rest - want) <= tol
        # Negative control: another head's shares do not add up to this head's score.
        other = attention_shares(st, qk, layer, (head + 1) % 4, last, key)
        assert abs(float(other.query_shares.sum()) + other.query_rest - want) > 100 * tol
    if slug == "llama":  # no rotary: the sum misses the score
        flat = attention_shares(st, dataclasses.replace(qk, cos=None, sin=None), 1, 1, last, 7)
        want = float(scores["attn_scores.1"][0, 1, last, 7])
        assert abs(float(flat.query_shares.sum()) + flat.query_rest - want) > 1e-3


@pytest.mark.parametrize("slug", ("llama", "gpt2"))
def test_single_shares_equal_hf_projection_differences(slug: str) -> None:
    """A node's query-side share is (q with the node on less q with it off) . k, here with the
    HF modules' own q_proj / k_proj (or c_attn) and rotary on the hand-written forward's norm1
    output; its key-side share likewise. GQA: head 1 reads KV group 0 (head // 2), and KV group
    1 (head % 2, the slip) gives other numbers."""
    m = synthetic_model(slug)
    st = prepare(m, PROMPT, [random_transcoder(m.d_model, 32, i, seed=i) for i in range(4)])
    layer, head, t, s = 2, 1, st.n_pos - 1, 6
    r = attention_shares(st, qk_weights_for(m), layer, head, t, s)
    scale = st.weights.layers[layer].head_dim ** -0.5
    n_kv = st.weights.layers[layer].n_kv_heads
    kv = head // (4 // n_kv)
    with torch.no_grad():
        q1, k1 = _hf_qk(slug, st, _hand_forward(st)["attn_in"][layer], layer)
        for side, shares in (("q", r.query_shares), ("k", r.key_shares)):
            for n in torch.topk(shares.abs(), 4).indices.tolist():
                q0, k0 = _hf_qk(slug, st, _hand_forward(st, n)["attn_in"][layer], layer)
                if side == "q":
                    want = (q1[t, head] - q0[t, head]) @ k1[s, kv] * scale
                else:
                    want = q1[t, head] @ (k1[s, kv] - k0[s, kv]) * scale
                assert abs(float(shares[n]) - float(want)) <= TOL * max(1.0, abs(r.score)), (
                    side,
                    n,
                )
        if n_kv < 4:  # the GQA slip: head 1 with KV head 1
            slip = q1[t, head] @ k1[s, head % n_kv] * scale
            assert abs(float(slip) - r.score) > 1e-3


def test_attention_share_refusals() -> None:
    m = synthetic_model("llama")
    st = prepare(
        m, "Paris is the capital", [random_transcoder(m.d_model, 16, i, seed=i) for i in range(4)]
    )
    qk = qk_weights_for(m)
    with pytest.raises(AttributionInputError, match="later keys are masked"):
        attention_shares(st, qk, 1, 0, 1, 2)
    with pytest.raises(AttributionInputError, match="no head 4"):
        attention_shares(st, qk, 1, 4, 2, 1)
    with pytest.raises(AttributionInputError, match="another model"):
        attention_shares(st, qk_weights_for(synthetic_model("gpt2")), 1, 0, 2, 1)
    hybrid = SimpleNamespace(config=SimpleNamespace(model_type="qwen3_next"))
    with pytest.raises(ReplacementUnsupportedError, match="attn_probs"):
        qk_weights_of(hybrid)
    mistral = synthetic_model("mistral")
    ms = prepare(mistral, PROMPT, [random_transcoder(128, 16, i, seed=i) for i in range(4)])
    with pytest.raises(AttributionInputError, match="sliding window of 8"):
        attention_shares(ms, qk_weights_for(mistral), 1, 0, 20, 2)


def test_ie_trace_heads_adds_head_flows(tmp_path) -> None:
    from ie_core.circuits.command import trace_command

    m = synthetic_model("llama")
    folder = tmp_path / "tc"
    folder.mkdir()
    for layer in range(m.n_layers):
        write_layer_file(
            random_transcoder(m.d_model, 16, layer, seed=layer),
            folder / f"layer_{layer}.safetensors",
        )
    out = tmp_path / "g.json"
    argv = ["ie-synthetic/llama", "--backend", "eager", "--transcoders", str(folder)]
    assert trace_command([*argv, "--prompt", "Paris is", "--out", str(out), "--heads", "3"]) == 0
    data = json.loads(out.read_text())
    ids = {n["node_id"] for n in data["nodes"]}
    links = {(x["source"], x["target"]): x["weight"] for x in data["links"]}
    assert len(data["head_flows"]) == 3
    for e in data["head_flows"]:
        assert e["source"] in ids and e["target"] in ids
        assert abs(links[e["source"], e["target"]] - e["weight"]) < 1e-6
        assert len(e["heads"]) == 5 and e["heads"][0]["flow"] != 0
