"""Per-prompt steering (`capture(..., row_steering=)`): each batch row equals the same prompt
captured alone under its own steering, so a sweep's cells can share one batched forward."""

from __future__ import annotations

import pytest
import torch
from ie_core import Additive, Patch, Scale, steer_at
from ie_core.errors import SteeringSpecError
from ie_core.runner import run
from ie_eager.backend import EagerModel, load

TOL = 1e-5  # fp32, one engine; a batch of rows against single-row forwards


@pytest.fixture(scope="module")
def model() -> EagerModel:
    return load("ie-synthetic/llama", device="cpu", dtype="float32")


def _alone(model: EagerModel, ids: list[int], address: str, steering: object) -> torch.Tensor:
    return run(model.capture([ids], [address], steering=steering))[address][0]


def test_each_row_equals_its_prompt_captured_alone(model: EagerModel) -> None:
    ids = list(range(3, 12))
    width = model.d_model
    last = f"resid_post.{model.n_layers - 1}"
    patch_row = torch.randn(width, generator=torch.Generator().manual_seed(0))
    rows = [
        None,
        steer_at("resid_pre.1", Patch(patch_row[None], (4,))),
        [steer_at("resid_post.0", Scale(0.5)), steer_at("mlp_out.1", Additive(patch_row, 2.0))],
        steer_at("resid_pre.1", Patch(patch_row[None], (2,))),
    ]
    shared = steer_at("attn_out.0", Additive(patch_row.flip(0), 0.3))
    batch = run(model.capture([ids] * len(rows), [last], steering=shared, row_steering=rows))
    for b, own in enumerate(rows):
        extra = [] if own is None else own if isinstance(own, list) else [own]
        want = _alone(model, ids, last, [shared, *extra])
        scale = want.abs().max()
        assert (batch[last][b] - want).abs().max() <= TOL * scale, b
    # Negative control: the rows differ from each other, so a batch that steered every row
    # alike (or none) could not pass.
    assert (batch[last][1] - batch[last][3]).abs().max() > 1e-2 * batch[last].abs().max()
    assert (batch[last][0] - batch[last][1]).abs().max() > 1e-2 * batch[last].abs().max()


def test_row_steering_needs_one_entry_a_prompt(model: EagerModel) -> None:
    with pytest.raises(SteeringSpecError, match="row_steering has 1 entries for 2 prompts"):
        run(model.capture([[3, 4], [5, 6]], ["resid_post.0"], row_steering=[None]))


def test_a_row_spec_is_admitted_like_a_shared_one(model: EagerModel) -> None:
    bad = steer_at("resid_pre.1", Additive(torch.ones(model.d_model + 1)))
    with pytest.raises(SteeringSpecError, match="width"):
        run(model.capture([[3, 4], [5, 6]], ["resid_post.0"], row_steering=[None, bad]))
