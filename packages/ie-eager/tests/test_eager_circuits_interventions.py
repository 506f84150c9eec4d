"""Interventions from a graph on eager (ie_core.circuits.intervene): clamping transcoder features
equals a hand-written HF forward that reads each MLP's input, computes the feature there and adds
`(value - activation) * decoder` to the MLP's output (1e-5 relative to the logits' scale), for
per-layer sets (ReLU on llama, JumpReLU on gpt2) and a CLT (every later layer written). Controls:
clamping a feature to its own activation changes nothing; a reference that adds `value *
decoder` without subtracting the live activation misses; bad input gets named errors."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

import pytest
import torch
from eager_support import PROMPT, synthetic_model
from ie_core.circuits import (
    AttributionInputError,
    FeatureIntervention,
    TranscoderSet,
    attribute_state,
    clamp_steering,
    intervene,
    prepare,
    random_transcoder,
)
from ie_core.circuits.clt import random_clt
from ie_core.circuits.graph import Node
from ie_core.errors import SteeringSpecError
from ie_core.experiments.sae_math import encode
from ie_core.ops import TranscoderClamp, op_from_dict

WIDTH = 48
TOL = 1e-5


def _set(slug: str, cross: bool = False) -> TranscoderSet:
    m = synthetic_model(slug)
    activation = "jumprelu" if slug == "gpt2" else "relu"
    if cross:
        return random_clt(m.d_model, WIDTH, m.n_layers, seed=7, activation=activation)
    tcs = [random_transcoder(m.d_model, WIDTH, i, seed=10 + i, activation=activation)
           for i in range(m.n_layers)]  # fmt: skip
    return TranscoderSet.of(tcs)


def _blocks(hf: Any, slug: str) -> Any:
    return hf.transformer.h if slug == "gpt2" else hf.model.layers


def _reference(
    slug: str, ts: TranscoderSet, tokens: Sequence[int], ivs: Sequence[FeatureIntervention],
    live: bool = True,
) -> torch.Tensor:  # fmt: skip
    """Last-position logits of the HF model with each feature set by hand: its activation from
    the MLP's input in this forward (`live`; else taken as 0), the decoder rows added to the
    MLP outputs it writes."""
    hf: Any = synthetic_model(slug).hf_model
    blocks = _blocks(hf, slug)
    acts: dict[int, torch.Tensor] = {}

    def read(layer: int) -> Any:
        def hook(_m: Any, args: Any) -> None:
            tc = ts.transcoders[layer]
            acts[layer] = encode(args[0][0].double(), tc.weights, tc.meta)

        return hook

    def write(layer: int) -> Any:
        def hook(_m: Any, _args: Any, out: torch.Tensor) -> torch.Tensor:
            delta = torch.zeros(out.shape[1:], dtype=torch.float64)
            for iv in ivs:
                k = layer - iv.layer
                dec = ts.decoders(iv.layer)
                if not 0 <= k < dec.shape[1]:
                    continue
                a = acts[iv.layer][:, iv.feature] if live else torch.zeros(out.shape[1])
                change = (iv.value - a)[:, None] * dec[iv.feature, k].double()
                if iv.positions is not None:
                    keep = torch.zeros(out.shape[1], dtype=torch.bool)
                    keep[list(iv.positions)] = True
                    change = change * keep[:, None]
                delta += change
            return out + delta.float()

        return hook

    handles = [b.mlp.register_forward_pre_hook(read(i)) for i, b in enumerate(blocks)]
    handles += [b.mlp.register_forward_hook(write(i)) for i, b in enumerate(blocks)]
    try:
        with torch.no_grad():
            return hf(input_ids=torch.tensor([list(tokens)])).logits[0, -1]
    finally:
        for h in handles:
            h.remove()


def _gap(got: torch.Tensor, want: torch.Tensor) -> float:
    return float((got - want).abs().max() / want.abs().max())


@pytest.mark.parametrize(("slug", "cross"), [("llama", False), ("gpt2", False), ("llama", True)])
def test_clamps_equal_a_hand_written_forward(slug: str, cross: bool) -> None:
    m, ts = synthetic_model(slug), _set(slug, cross)
    ivs = [
        FeatureIntervention(1, 3, 4.0),  # every position
        FeatureIntervention(0, 5, 0.0, (2, 4)),  # ablated at two positions
        FeatureIntervention(m.n_layers - 1, 7, -2.5, (len(m.to_tokens(PROMPT)) - 1,)),
    ]
    res = intervene(m, PROMPT, ts, ivs)
    want = _reference(slug, ts, res.tokens, ivs)
    assert _gap(res.logits_after, want) <= TOL
    assert _gap(res.logits_before, _reference(slug, ts, res.tokens, [])) <= TOL
    assert _gap(res.logits_after, res.logits_before) > 1e-3  # the clamps do something
    # Negative control: ignoring the live activation (adding value * decoder) is not the clamp.
    assert _gap(res.logits_after, _reference(slug, ts, res.tokens, ivs, live=False)) > 1e-3
    assert res.top_after[0].probability == pytest.approx(
        float(res.logits_after.softmax(-1).max()), rel=1e-6
    )


@pytest.mark.parametrize("slug", ["llama", "gpt2"])
def test_a_graph_node_clamped_to_its_own_activation_changes_nothing(slug: str) -> None:
    m, ts = synthetic_model(slug), _set(slug)
    g = attribute_state(prepare(m, PROMPT, ts))
    node = max((g.node(i) for i in range(g.n_features)), key=lambda n: n.activation or 0.0)
    assert node.activation is not None and node.activation > 0
    same = intervene(m, PROMPT, ts, [FeatureIntervention.at_node(node, node.activation)])
    assert _gap(same.logits_after, same.logits_before) <= TOL
    # circuit-tracer's tuple form; ablating the strongest feature moves the logits.
    off = intervene(m, PROMPT, ts, [(node.layer, node.pos, node.index, 0.0)])
    assert _gap(off.logits_after, off.logits_before) > 1e-4
    assert not same.moved and set(same.to_json()) == {"tokens", "moved", "before", "after"}


def test_clamp_steering_writes_every_later_layer_of_a_clt_and_travels_as_json() -> None:
    m = synthetic_model("llama")
    specs = clamp_steering(_set("llama", cross=True), [FeatureIntervention(1, 0, 1.0)])
    assert [str(a) for s in specs for a in s.addresses()] == [
        f"mlp_out.{layer}" for layer in range(1, m.n_layers)
    ]
    op = specs[0].ops[0]
    assert isinstance(op, TranscoderClamp) and op.read == "mlp_in.1"
    assert op_from_dict(op.to_wire()) == op
    assert "vllm-static" in op.static_refusal()


def test_bad_interventions_get_named_errors() -> None:
    m, ts = synthetic_model("llama"), _set("llama")
    n = len(m.to_tokens(PROMPT))
    with pytest.raises(AttributionInputError, match="outside the transcoder set"):
        intervene(m, PROMPT, ts, [FeatureIntervention(m.n_layers, 0, 1.0)])
    with pytest.raises(ValueError, match="feature"):
        intervene(m, PROMPT, ts, [FeatureIntervention(0, WIDTH, 1.0)])
    with pytest.raises(AttributionInputError, match="past the prompt"):
        intervene(m, PROMPT, ts, [FeatureIntervention(0, 0, 1.0, (n,))])
    with pytest.raises(AttributionInputError, match="at least one"):
        intervene(m, PROMPT, ts, [])
    with pytest.raises(AttributionInputError, match="layer, position, feature, value"):
        intervene(m, PROMPT, ts, [(0, 1, 2)])
    with pytest.raises(AttributionInputError, match="feature nodes"):
        FeatureIntervention.at_node(Node("error", 0, 1, -1), 1.0)
    with pytest.raises(SteeringSpecError, match="value"):
        FeatureIntervention(0, 0, float("nan"))
    with pytest.raises(SteeringSpecError, match="not computed after"):
        TranscoderClamp([1.0] * 4, [1.0] * 4, "mlp_out.3", value=1.0).check_site("mlp_out.2")
    first = ts.transcoders[0]
    topk = dataclasses.replace(first, meta=dataclasses.replace(first.meta, activation="topk", k=4))
    tk = TranscoderSet.of([topk, *ts.transcoders[1:]])
    with pytest.raises(AttributionInputError, match="TopK"):
        clamp_steering(tk, [FeatureIntervention(0, 0, 1.0)])
