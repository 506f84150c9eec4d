"""`probe_scores` on eager (the capture-and-score path every backend without in-worker reducers
takes) against the probe applied by hand to a plain HF forward's hidden states."""

from __future__ import annotations

import pytest
import torch
from ie_core import Additive, SyncModel, steer_at
from ie_core.errors import SteeringSpecError
from ie_core.experiments.probes import Probe, probe_scores
from ie_eager.backend import EagerModel, load

TOL = 1e-5  # fp32 on CPU, one engine against its own HF module


@pytest.fixture(scope="module")
def model() -> EagerModel:
    return load("ie-synthetic/llama", device="cpu", dtype="float32")


def _hidden(model: EagerModel, ids: list[int], layer: int) -> torch.Tensor:
    """resid_post.layer from HF itself: hidden_states[layer + 1] (below the final norm)."""
    with torch.no_grad():
        out = model.hf_model(input_ids=torch.tensor([ids]), output_hidden_states=True)
    return out.hidden_states[layer + 1][0].double()


def test_scores_equal_the_probe_applied_to_hf_hidden_states(model: EagerModel) -> None:
    ids = list(range(3, 14))
    g = torch.Generator().manual_seed(0)
    w = torch.randn(model.d_model, generator=g)
    h = _hidden(model, ids, 1)
    got = probe_scores(model, ids, "resid_post.1", w, bias=0.2, activation="sigmoid")
    assert got.shape == (1, len(ids))
    want = torch.sigmoid(h @ w.double() + 0.2)
    assert float((got[0].double() - want).abs().max()) <= TOL
    m = torch.randn(model.d_model, 3, generator=g)
    got_m = probe_scores(SyncModel(model), [ids, ids], "resid_post.1", m, bias=[0.1, 0.0, -0.1])
    want_m = h @ m.double() + torch.tensor([0.1, 0.0, -0.1], dtype=torch.float64)
    assert got_m.shape == (2, len(ids), 3)
    assert float((got_m.double() - want_m).abs().max()) <= TOL * max(1.0, float(want_m.abs().max()))
    # Negative control: another layer's rows give other scores.
    assert (
        float(
            (got[0].double() - torch.sigmoid(_hidden(model, ids, 0) @ w.double() + 0.2)).abs().max()
        )
        > 1e-3
    )


def test_scores_read_the_steered_rows(model: EagerModel) -> None:
    ids = list(range(3, 10))
    w = torch.randn(model.d_model, generator=torch.Generator().manual_seed(1))
    plain = probe_scores(model, ids, "resid_post.1", w)
    spec = steer_at("resid_post.1", Additive(w / w.norm(), 5.0))
    steered = probe_scores(model, ids, "resid_post.1", w, steering=spec)
    # An additive step of 5 along the unit probe direction moves each score by 5 * |w|.
    moved = steered.double() - plain.double()
    assert float((moved - 5.0 * float(w.norm())).abs().max()) <= TOL * float(moved.abs().max())


def test_bad_probes_are_refused_before_a_forward(model: EagerModel) -> None:
    ids = list(range(3, 8))
    with pytest.raises(SteeringSpecError, match="7 wide"):
        probe_scores(model, ids, "resid_post.1", torch.ones(7))
    with pytest.raises(SteeringSpecError, match="finite"):
        probe_scores(model, ids, "resid_post.1", torch.ones(model.d_model), bias=float("nan"))
    with pytest.raises(SteeringSpecError, match="2 entries"):
        probe_scores(model, ids, "resid_post.1", torch.ones(model.d_model, 3), bias=[0.0, 1.0])
    with pytest.raises(SteeringSpecError, match="activation"):
        probe_scores(model, ids, "resid_post.1", torch.ones(model.d_model), activation="gelu")


def test_a_probe_crosses_the_reducer_wire_unchanged() -> None:
    probe = Probe.build(torch.randn(4, 2), [0.5, -0.5], "tanh", width=4, point="resid_post.0")
    assert Probe.from_params(probe.to_params()) == probe
    vector = Probe.build(torch.randn(4), 0.5, width=4, point="resid_post.0")
    assert Probe.from_params(vector.to_params()) == vector
    assert vector.scores(torch.randn(2, 3, 4)).shape == (2, 3)
