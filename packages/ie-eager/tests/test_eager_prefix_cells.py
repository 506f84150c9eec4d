"""Sweep cells computed from the first position they change (`ie_eager.prefix_cells`) against the
same cells computed from position 0, on synthetic families that cover the cache kinds (learned
positions, ALiBi, sliding windows with softcaps, two rope bases, sinks, latent attention,
hyper-connection streams) and the hybrids that must fall back (linear attention, Mamba, short
convolutions). fp32; 1e-5 relative to the logits' scale. Negative
control: starting one position after the patch skips it, and the numbers move."""

from __future__ import annotations

from typing import Any

import pytest
import torch
from eager_support import PROMPT, synthetic_model
from ie_core.errors import BadPromptError
from ie_core.ops import Patch, Steering, steer_at
from ie_core.runner import run
from ie_eager import prefix_cells
from ie_eager.admission import EagerAdmission
from ie_eager.prefix_cells import final_token_logits, first_written

FAMILIES = ("llama", "gpt2", "bloom", "gemma2", "gemma3", "gpt-oss", "deepseek-v3", "deepseek-v4",
            "qwen3-next", "granitemoehybrid", "lfm2")  # fmt: skip
TOL = 1e-5


def _cells(model, ids: list[int], stream: str = "") -> list[Steering | None]:
    """A small grid: resid_pre patches of a donor's rows at every (layer, position), and None."""
    donor = [(i * 7 + 3) % 50 + 1 for i in range(len(ids))]
    at = [f"resid_pre.{i}{stream}" for i in range(model.n_layers)]
    src = run(model.capture([donor], at))
    cells: list[Steering | None] = [None]
    for a in at:
        cells += [steer_at(a, Patch(src[a][0][[p]], (p,))) for p in range(len(ids))]
    return cells


@pytest.mark.parametrize("slug", FAMILIES)
def test_cells_from_their_first_position_equal_cells_from_zero(slug: str) -> None:
    model = synthetic_model(slug)
    ids = model.to_tokens(PROMPT)[:10]
    cells = _cells(model, ids, ".stream-1" if slug == "deepseek-v4" else "")  # 4 streams
    prompts, tokens = [ids] * len(cells), [5, 9, 17]
    args = (model.hf_model, model.admission, prompts, cells, tokens)
    short, short_lse = final_token_logits(*args)
    full, full_lse = final_token_logits(*args, start=lambda s, n: 0)
    scale = max(1.0, float(full.abs().max()))
    assert float((short - full).abs().max()) <= TOL * scale, slug
    assert float((short_lse - full_lse).abs().max()) <= TOL * max(1.0, float(full_lse.abs().max()))
    # The cells differ from one another (the patches reached the logits) ...
    assert float((full[1:] - full[0]).abs().max()) > 1e-3
    # ... and the direct logits agree with the model's own forward for the unpatched row.
    with torch.no_grad():
        logits = model.hf_model(input_ids=torch.tensor([ids])).logits[0, -1].float()
    assert float((full[0] - logits[tokens]).abs().max()) <= TOL * scale


def test_starting_after_the_patch_is_caught_by_the_numbers() -> None:
    model = synthetic_model("llama")
    ids = model.to_tokens(PROMPT)[:10]
    cells = [c for c in _cells(model, ids)[1:] if first_written(c, len(ids)) < len(ids) - 1]
    args = (model.hf_model, model.admission, [ids] * len(cells), cells, [5, 9])
    right, _ = final_token_logits(*args)
    wrong, _ = final_token_logits(*args, start=lambda s, n: first_written(s, n) + 1)
    per_cell = (right - wrong).abs().amax(-1)
    assert bool((per_cell > 1e-4).all())  # every cell loses its patch


def test_first_written_and_bad_tokens() -> None:
    model = synthetic_model("llama")
    ids = model.to_tokens(PROMPT)[:10]
    row = torch.zeros(model.d_model)
    assert first_written(None, 10) == 9  # every request computes its last position
    assert first_written(steer_at("resid_pre.1", Patch(row, (4, 6))), 10) == 4
    assert first_written(steer_at("resid_pre.1", Patch(row)), 10) == 0  # every position
    two = [steer_at("resid_pre.1", Patch(row, (7,))), steer_at("mlp_out.2", Patch(row, (3,)))]
    assert first_written(two, 10) == 3
    with pytest.raises(BadPromptError, match="vocabulary"):
        final_token_logits(model.hf_model, model.admission, [ids], [None], [10**9])


def test_each_request_is_admitted_once_and_the_forward_read_once(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Admission runs once per request (before any forward) and the forward's signature is read
    once per call, however many prefix groups and batches the cells fall into."""
    model = synthetic_model("llama")
    ids = model.to_tokens(PROMPT)[:6]
    cells = _cells(model, ids)
    args = (model.hf_model, model.admission, [ids] * len(cells), cells, [5, 9])
    whole, _ = final_token_logits(*args)
    calls = {"admitted": 0, "signature": 0}
    row_writes, keeps_logits = EagerAdmission.row_writes, prefix_cells._keeps_logits

    def admitted(self: EagerAdmission, *a: Any) -> Any:
        calls["admitted"] += 1
        return row_writes(self, *a)

    def signature(hf_model: Any) -> bool:
        calls["signature"] += 1
        return keeps_logits(hf_model)

    monkeypatch.setattr(EagerAdmission, "row_writes", admitted)
    monkeypatch.setattr(prefix_cells, "_keeps_logits", signature)
    monkeypatch.setattr(prefix_cells, "BATCH_ROWS", 2)  # several batches per prefix group
    chunked, _ = final_token_logits(*args)
    assert calls == {"admitted": len(cells), "signature": 1}
    assert float((chunked - whole).abs().max()) <= TOL * max(1.0, float(whole.abs().max()))
