"""Circuit tracing on eager (ie_core.circuits): completeness and exact reconstruction against the
HF model's own forward, a negative control (norm scales recomputed instead of frozen), the
feature cap, the graph JSON, and named refusals. Random-weight transcoders the test writes in
circuit-tracer's per-layer format; fp32 on the CPU, tolerance 1e-5 relative."""

from __future__ import annotations

import dataclasses
import json
from typing import Any

import pytest
import torch
from eager_support import PROMPT, synthetic_model
from ie_core.circuits import (
    AttributionInputError,
    TranscoderLayerError,
    TranscoderSet,
    TranscoderWidthError,
    attribute,
    attribute_state,
    graph_json,
    load_transcoders,
    prepare,
    prune,
    random_transcoder,
    write_layer_file,
)
from ie_core.circuits.graph import Graph
from ie_core.circuits.replacement import run_at

FAMILIES = ("llama", "gpt2")
WIDTH = 48  # transcoder features per layer: a few hundred active ones over the prompt
TOL = 1e-5


def _set(slug: str, tmp_path_factory: pytest.TempPathFactory) -> TranscoderSet:
    """A random set written to disk in circuit-tracer's layout and read back (ReLU on llama,
    JumpReLU on gpt2)."""
    m = synthetic_model(slug)
    folder = tmp_path_factory.mktemp(f"tc-{slug}")
    activation = "jumprelu" if slug == "gpt2" else "relu"
    for layer in range(m.n_layers):
        tc = random_transcoder(m.d_model, WIDTH, layer, seed=10 + layer, activation=activation)
        write_layer_file(tc, folder / f"layer_{layer}.safetensors")
    return load_transcoders(folder)


@pytest.fixture(scope="module", params=FAMILIES)
def traced(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory):
    slug = request.param
    ts = _set(slug, tmp_path_factory)
    state = prepare(synthetic_model(slug), PROMPT, ts)
    return slug, ts, state, attribute_state(state)


def _hf_reference(slug: str, tokens: tuple[int, ...]) -> tuple[torch.Tensor, list[torch.Tensor]]:
    """Logits and each MLP's input from the HF model itself (forward pre-hooks on the MLPs)."""
    hf: Any = synthetic_model(slug).hf_model
    blocks = hf.model.layers if slug != "gpt2" else hf.transformer.h
    seen: list[torch.Tensor] = []
    handles = [b.mlp.register_forward_pre_hook(lambda m, a: seen.append(a[0][0])) for b in blocks]
    try:
        with torch.no_grad():
            logits = hf(input_ids=torch.tensor([tokens])).logits[0]
    finally:
        for h in handles:
            h.remove()
    return logits, seen


def _target_rows(g: Graph) -> torch.Tensor:
    return torch.cat([torch.arange(g.n_features), torch.arange(g.logit_offset, g.n_nodes)])


def _completeness_gap(g: Graph) -> torch.Tensor:
    """|incoming edges + bias - input| over the size of the summed terms, per target node."""
    rows = _target_rows(g)
    a, bias, inputs = g.adjacency[rows], g.node_bias[rows], g.node_inputs[rows]
    scale = a.abs().sum(1) + bias.abs() + inputs.abs()
    return (a.sum(1) + bias - inputs).abs() / scale


def test_inputs_are_the_models_own(traced) -> None:
    slug, ts, _, g = traced
    logits, mlp_in = _hf_reference(slug, g.tokens)
    # Feature inputs: pre-activations of the HF model's MLP inputs; logits: demeaned HF logits.
    for i in range(g.n_features):
        layer, pos, feat = (int(v) for v in g.active_features[g.selected_features[i]])
        w = ts.transcoders[layer].weights
        want = mlp_in[layer][pos] @ w["W_enc"][:, feat] + w["b_enc"][feat]
        assert abs(float(g.node_inputs[i] - want)) <= TOL * max(1.0, abs(float(want)))
    last = logits[-1]
    for k, target in enumerate(g.logit_targets):
        want = last[target.token_id] - last.mean()
        assert abs(float(g.node_inputs[g.logit_offset + k] - want)) <= TOL * float(last.abs().max())
    probs = torch.softmax(last.double(), -1)
    assert g.logit_targets[0].token_id == int(probs.argmax())
    assert abs(g.logit_targets[0].probability - float(probs.max())) <= TOL * float(probs.max())


def test_completeness(traced) -> None:
    _, _, _, g = traced
    assert g.n_features > 50, "the random set should light up features"
    assert float(_completeness_gap(g).max()) <= TOL


def test_exact_reconstruction(traced) -> None:
    slug, _, state, g = traced
    logits, _ = _hf_reference(slug, g.tokens)
    n = state.active_features.shape[0]
    ones = (torch.ones(n), torch.ones(state.n_layers, state.n_pos), torch.ones(state.n_pos))
    out = run_at(state.weights, state.frozen, state.sources, *ones)
    assert float((out.logits - logits).abs().max()) <= TOL * float(logits.abs().max())
    # Without the error nodes the replacement is not exact (they carry what transcoders miss).
    no_err = (torch.ones(n), torch.zeros(state.n_layers, state.n_pos), torch.ones(state.n_pos))
    off = run_at(state.weights, state.frozen, state.sources, *no_err).logits
    assert float((off - logits).abs().max()) > 100 * TOL * float(logits.abs().max())


def test_negative_control_unfrozen_norms_fail_completeness(traced) -> None:
    """Norm scales recomputed from the replacement's own residual: the map is no longer linear,
    so edges plus bias miss the inputs (while the forward at c = 1 is still the model's)."""
    _, _, state, _ = traced
    g = attribute_state(dataclasses.replace(state, freeze_norms=False))
    assert float(_completeness_gap(g).max()) > 1e-2


def test_negative_control_transposed_decoder_fails_reconstruction(traced) -> None:
    """A decoder read transposed for the feature nodes' write vectors (the layout slip of a
    [d_model, d_transcoder] file; square transcoders here so the shapes still fit): the
    replacement no longer reproduces the model's logits."""
    slug = traced[0]
    m = synthetic_model(slug)
    square = [random_transcoder(m.d_model, m.d_model, i, seed=i) for i in range(m.n_layers)]
    st = prepare(m, PROMPT, square)
    layer, _, feat = st.active_features.unbind(1)
    pairs = zip(layer.tolist(), feat.tolist(), strict=True)
    wrong = torch.stack([square[a].weights["W_dec"].T[f] for a, f in pairs])
    bad = dataclasses.replace(st.sources, decoder_vecs=wrong * st.activation_values[:, None])
    logits, _ = _hf_reference(slug, st.tokens)
    n = st.active_features.shape[0]
    ones = (torch.ones(n), torch.ones(st.n_layers, st.n_pos), torch.ones(st.n_pos))
    good = run_at(st.weights, st.frozen, st.sources, *ones).logits
    off = run_at(st.weights, st.frozen, bad, *ones).logits
    scale = float(logits.abs().max())
    assert float((good - logits).abs().max()) <= TOL * scale
    assert float((off - logits).abs().max()) > 100 * TOL * scale


def test_device_argument_moves_the_backward(traced) -> None:
    """device= runs the rows on a copy of the state moved there (here the CPU again: this box
    has no GPU); the graph is the same and its tensors are on the CPU."""
    _, _, state, g = traced
    moved = attribute_state(state, device="cpu")
    torch.testing.assert_close(moved.adjacency, g.adjacency, rtol=0, atol=0)
    assert moved.adjacency.device.type == "cpu"


def test_feature_cap_keeps_rows_of_the_full_graph(traced) -> None:
    _, _, state, g = traced
    capped = attribute_state(state, max_feature_nodes=25, batch_size=8)
    assert capped.n_features == 25
    assert capped.n_nodes == 25 + (state.n_layers + 1) * state.n_pos + len(g.logit_targets)
    # The same rows and columns as the uncapped graph (selected features are a subset).
    pick = capped.selected_features
    full_cols = torch.cat([pick, torch.arange(g.n_features, g.n_nodes)])
    rows = torch.cat([pick, torch.arange(g.logit_offset, g.n_nodes)])
    cap_rows = torch.cat([torch.arange(25), torch.arange(capped.logit_offset, capped.n_nodes)])
    torch.testing.assert_close(capped.adjacency[cap_rows], g.adjacency[rows][:, full_cols])


def test_a_chunked_feature_cap_equals_one_chunk(traced) -> None:
    """Ranking and copying the kept rows a row at a time gives the graph of one chunk of all
    rows: the same features (the argsort sees scores within 1e-6), the adjacency within 1e-6."""
    _, _, state, _ = traced
    whole = attribute_state(state, max_feature_nodes=25, batch_size=8, chunk=10**9)
    for chunk in (1, 7):
        part = attribute_state(state, max_feature_nodes=25, batch_size=8, chunk=chunk)
        assert torch.equal(part.selected_features, whole.selected_features)
        scale = float(whole.adjacency.abs().max())
        torch.testing.assert_close(part.adjacency, whole.adjacency, rtol=1e-6, atol=1e-6 * scale)
    with pytest.raises(AttributionInputError, match="chunk is 0"):
        attribute_state(state, max_feature_nodes=25, chunk=0)


def test_graph_json_is_the_viewers_schema(traced) -> None:
    _, _, _, g = traced
    data = json.loads(json.dumps(graph_json(g, slug="t", scan="synthetic")))
    assert set(data) == {"metadata", "qParams", "nodes", "links"}
    assert data["metadata"]["prompt_tokens"] == list(g.token_strings)
    ids = [n["node_id"] for n in data["nodes"]]
    # circuit-tracer's error ids `0_{layer}_{pos}` can equal a layer-0 feature's
    # `{layer}_{feature}_{pos}`; kept as it writes them, so ids are unique within a kind.
    assert len({(n["node_id"], n["feature_type"]) for n in data["nodes"]}) == len(ids)
    assert {link["source"] for link in data["links"]} | {
        link["target"] for link in data["links"]
    } <= set(ids)
    kinds = {n["feature_type"] for n in data["nodes"]}
    assert {"embedding", "logit", "cross layer transcoder"} <= kinds
    logits = [n for n in data["nodes"] if n["feature_type"] == "logit"]
    assert sum(n["is_target_logit"] for n in logits) == 1
    assert len([n for n in data["nodes"] if n["feature_type"] == "embedding"]) == g.n_pos
    pruned = prune(g)
    assert int(pruned.node_mask.sum()) < g.n_nodes


def test_attribute_end_to_end_and_refusals(tmp_path) -> None:
    m = synthetic_model("llama")
    good = [random_transcoder(m.d_model, 16, i, seed=i) for i in range(m.n_layers)]
    g = attribute(m, "Paris is", good, max_feature_nodes=10)
    assert g.n_features <= 10 and g.prompt == "Paris is"
    with pytest.raises(TranscoderLayerError, match=r"layers 0\.\.2"):
        attribute(m, PROMPT, good[:3])
    narrow = [random_transcoder(64, 16, i, seed=i) for i in range(m.n_layers)]
    with pytest.raises(TranscoderWidthError, match="d_model is 128"):
        attribute(m, PROMPT, narrow)
    assert m.max_positions is not None
    with pytest.raises(AttributionInputError, match="context"):
        attribute(m, [1] * (m.max_positions + 1), good)
    with pytest.raises(AttributionInputError, match="no tokens"):
        attribute(m, [], good)
    with pytest.raises(AttributionInputError, match="batch_size"):
        attribute(m, PROMPT, good, batch_size=0)
    with pytest.raises(AttributionInputError, match="node_threshold"):
        prune(g, node_threshold=1.5)
    with pytest.raises(AttributionInputError, match="edge_threshold"):
        prune(g, edge_threshold=-0.1)


def test_ie_trace_writes_the_graph(tmp_path) -> None:
    """`ie trace` (its command function; the entry point is pyproject's `ie.commands`)."""
    from ie_core.circuits.command import trace_command

    m = synthetic_model("llama")
    folder = tmp_path / "tc"
    folder.mkdir()
    for layer in range(m.n_layers):
        tc = random_transcoder(m.d_model, 16, layer, seed=layer)
        write_layer_file(tc, folder / f"layer_{layer}.safetensors")
    out, raw = tmp_path / "g.json", tmp_path / "g.pt"
    argv = ["ie-synthetic/llama", "--backend", "eager", "--transcoders", str(folder)]
    argv += ["--prompt", "Paris is", "--out", str(out), "--raw", str(raw)]
    assert trace_command(argv) == 0
    data = json.loads(out.read_text())
    assert data["metadata"]["slug"] == "g" and data["metadata"]["prompt"] == "Paris is"
    saved = torch.load(raw, weights_only=False)
    assert saved["adjacency"].shape[0] == saved["node_inputs"].shape[0]
    with pytest.raises(AttributionInputError, match="node_threshold"):  # before the load
        trace_command([*argv, "--node-threshold", "2"])
    with pytest.raises(AttributionInputError, match="chunk is 0"):  # before the load
        trace_command([*argv, "--chunk", "0"])


def test_edge_cases_give_complete_graphs() -> None:
    """No feature fires, a one-token prompt (position 0 is left out), a TopK set: each gives a
    graph whose rows still sum to their inputs. A cap of 0 gives no feature node (a capped
    graph's rows miss the left-out features' edges, as circuit-tracer's do)."""
    from ie_core.experiments.saes import from_tensors

    m = synthetic_model("llama")
    base = [random_transcoder(m.d_model, 16, i, seed=i) for i in range(m.n_layers)]

    def variant(tc: Any, **kw: Any) -> Any:
        w = dict(tc.weights) | kw.pop("weights", {})
        return from_tensors(w, address=tc.address, out_address=tc.out_address, **kw)

    dead = [variant(t, weights={"b_enc": t.weights["b_enc"] - 100}) for t in base]
    topk = [variant(t, activation="topk", k=3) for t in base]
    for prompt, ts in (("Paris is", dead), ([5], base), ("Paris is", topk)):
        g = attribute(m, prompt, ts)
        assert g.n_nodes == g.n_features + (m.n_layers + 1) * g.n_pos + len(g.logit_targets)
        assert float(_completeness_gap(g).max()) <= TOL
        assert graph_json(g)["nodes"]
    assert attribute(m, "Paris is", topk).n_features == 3 * m.n_layers * 3  # k per row, pos > 0
    capped = attribute(m, "Paris is", base, max_feature_nodes=0)
    assert capped.n_features == 0 and graph_json(capped)["nodes"]
