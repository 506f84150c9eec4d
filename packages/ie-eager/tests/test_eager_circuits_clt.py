"""Circuit tracing through a cross-layer transcoder (CLT) on eager: a random CLT written in
circuit-tracer's CLT format and read back; the frozen replacement reproduces the HF model's logits
and every node's edges plus bias sum to its input (1e-5), on llama (ReLU) and gpt2 (JumpReLU).
Negative controls: the cross-layer decoders dropped, or a decoder read transposed, break
completeness; `ie trace` takes the CLT folder."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

import pytest
import torch
from eager_support import PROMPT, synthetic_model
from ie_core.circuits import (
    TranscoderSet,
    TranscoderWidthError,
    attribute,
    attribute_state,
    load_transcoders,
    prepare,
)
from ie_core.circuits.clt import cross_layer_set, random_clt, write_clt
from ie_core.circuits.graph import Graph
from ie_core.circuits.prompt_state import PromptState
from ie_core.circuits.replacement import Sources, run_at

FAMILIES = ("llama", "gpt2")
WIDTH = 48
TOL = 1e-5


@pytest.fixture(scope="module", params=FAMILIES)
def traced(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory):
    slug = request.param
    m = synthetic_model(slug)
    activation = "jumprelu" if slug == "gpt2" else "relu"
    folder = tmp_path_factory.mktemp(f"clt-{slug}")
    write_clt(random_clt(m.d_model, WIDTH, m.n_layers, seed=7, activation=activation), folder)
    ts = load_transcoders(folder)
    state = prepare(m, PROMPT, ts)
    return slug, ts, state, attribute_state(state)


def _completeness_gap(g: Graph) -> torch.Tensor:
    """|incoming edges + bias - input| over the size of the summed terms, per target node."""
    rows = torch.cat([torch.arange(g.n_features), torch.arange(g.logit_offset, g.n_nodes)])
    a, bias, inputs = g.adjacency[rows], g.node_bias[rows], g.node_inputs[rows]
    return (a.sum(1) + bias - inputs).abs() / (a.abs().sum(1) + bias.abs() + inputs.abs())


def _hf_logits(slug: str, tokens: tuple[int, ...]) -> torch.Tensor:
    hf: Any = synthetic_model(slug).hf_model
    with torch.no_grad():
        return hf(input_ids=torch.tensor([tokens])).logits[0]


def _with_writes(st: PromptState, keep: torch.Tensor, vecs: torch.Tensor | None = None) -> Any:
    """`st` with only the writes `keep` selects (and their vectors replaced by `vecs`)."""
    src: Sources = st.sources
    decoder_vecs = src.decoder_vecs[keep] if vecs is None else vecs
    fields = {"write_feat": src.write_feat[keep], "write_layer": src.write_layer[keep]}
    fields |= {"write_pos": src.write_pos[keep], "decoder_vecs": decoder_vecs}
    return dataclasses.replace(st, sources=dataclasses.replace(src, **fields))


def test_the_folder_is_a_cross_layer_set(traced) -> None:
    _, ts, state, g = traced
    assert ts.is_cross_layer and ts.n_layers == state.n_layers
    assert [tuple(ts.decoders(i).shape)[:2] for i in range(ts.n_layers)] == [
        (WIDTH, ts.n_layers - i) for i in range(ts.n_layers)
    ]
    # Each feature writes once at its own layer and once at every later layer.
    per_feature = torch.bincount(state.sources.write_feat, minlength=g.n_features)
    torch.testing.assert_close(per_feature, state.n_layers - state.active_features[:, 0])


def test_exact_reconstruction_and_completeness(traced) -> None:
    slug, _, state, g = traced
    assert g.n_features > 50, "the random CLT should light up features"
    logits = _hf_logits(slug, g.tokens)
    n = state.active_features.shape[0]
    ones = (torch.ones(n), torch.ones(state.n_layers, state.n_pos), torch.ones(state.n_pos))
    out = run_at(state.weights, state.frozen, state.sources, *ones)
    assert float((out.logits - logits).abs().max()) <= TOL * float(logits.abs().max())
    assert float(_completeness_gap(g).max()) <= TOL
    # Feature inputs are the CLT's pre-activations of the model's own MLP inputs.
    f_layer, f_pos, _ = state.active_features.unbind(1)
    want = (out.mlp_in[f_layer, f_pos] * state.encoder_vecs).sum(-1) + state.encoder_bias
    torch.testing.assert_close(g.node_inputs[: g.n_features], want, rtol=TOL, atol=TOL)


def test_negative_control_dropped_cross_layer_decoders(traced) -> None:
    """Only each feature's decoder to its own layer (the errors still computed with all): the
    replacement misses the cross-layer writes, so edges plus bias miss the inputs."""
    _, _, state, _ = traced
    own = state.sources.write_layer == state.active_features[state.sources.write_feat, 0]
    g = attribute_state(_with_writes(state, own))
    assert float(_completeness_gap(g).max()) > 1e-2


def test_negative_control_transposed_decoder(traced) -> None:
    """A square CLT whose decoder rows are read transposed ([d_model, d_transcoder] slip)."""
    slug = traced[0]
    m = synthetic_model(slug)
    ts = random_clt(m.d_model, m.d_model, m.n_layers, seed=11)
    st = prepare(m, PROMPT, ts)
    src = st.sources
    feat = st.active_features[src.write_feat]
    k = src.write_layer - feat[:, 0]
    rows = zip(feat[:, 0].tolist(), k.tolist(), feat[:, 2].tolist(), strict=True)
    wrong = torch.stack([ts.decoders(a)[:, j].T[f] for a, j, f in rows])
    keep = torch.ones(len(k), dtype=torch.bool)
    bad = _with_writes(st, keep, wrong * st.activation_values[src.write_feat, None])
    assert float(_completeness_gap(attribute_state(st)).max()) <= TOL
    assert float(_completeness_gap(attribute_state(bad)).max()) > 1e-2


def test_topk_clt_in_memory_and_width_check() -> None:
    m = synthetic_model("llama")
    topk = random_clt(m.d_model, 16, m.n_layers, seed=5, activation="topk", k=3)
    g = attribute(m, "Paris is", topk)
    # At most k per row (fewer where a top pre-activation is not positive), position 0 left out.
    assert 0 < g.n_features <= 3 * m.n_layers * (g.n_pos - 1)
    assert float(_completeness_gap(g).max()) <= TOL
    narrow = random_clt(64, 16, m.n_layers, seed=5)
    with pytest.raises(TranscoderWidthError, match="d_model is 128"):
        attribute(m, PROMPT, narrow)
    # Decoders whose width is not the encoders' output width are refused when the set is built.
    decs = [d[..., :-1] for d in topk.cross_decoders]
    with pytest.raises(TranscoderWidthError, match=r"\[d_transcoder, n_layers - 0, d_model\]"):
        TranscoderSet(topk.transcoders, "", tuple(decs))
    assert cross_layer_set(topk.transcoders, topk.cross_decoders).is_cross_layer


def test_ie_trace_takes_a_clt_folder(tmp_path: Path) -> None:
    from ie_core.circuits.command import trace_command

    m = synthetic_model("llama")
    folder = tmp_path / "clt"
    write_clt(random_clt(m.d_model, 16, m.n_layers, seed=1), folder)
    (folder / "config.yaml").write_text(
        "model_kind: cross_layer_transcoder\nscan: my-clt\nfeature_input_hook: mlp.hook_in\n"
        "feature_output_hook: mlp.hook_out\n"
    )
    out = tmp_path / "g.json"
    argv = ["ie-synthetic/llama", "--backend", "eager", "--transcoders", str(folder)]
    assert trace_command([*argv, "--prompt", "Paris is", "--out", str(out)]) == 0
    data = json.loads(out.read_text())
    assert data["metadata"]["prompt"] == "Paris is" and data["metadata"]["scan"] == "my-clt"
    assert data["nodes"]
