"""eager vs TransformerLens vs nnsight on the synthetic Llama: the real sweep, in the suite."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

pytest.importorskip("transformer_lens")
pytest.importorskip("nnsight")
pytest.importorskip("ie_eager")

from ie_validator.results import result_path
from ie_validator.scoring import Status, Tier, score
from ie_validator.sweep import addresses_for, run_engine, tokenize, validate_model

MODEL = "ie-synthetic/llama"


@pytest.fixture(scope="module")
def results(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, list]:
    import torch

    torch.set_num_threads(2)
    root = tmp_path_factory.mktemp("results")
    return root, validate_model(MODEL, ["transformer-lens", "nnsight"], root=root)


def test_every_engine_passes_on_llama(results: tuple[Path, list]) -> None:
    root, out = results
    for result in out:
        assert result.reference == "eager"
        assert result.status == "ok", result.error
        assert result.verdict == "pass", [p for p in result.points if p.status != "pass"]
        on_disk = json.loads(result_path(MODEL, result.engine, root).read_text())
        assert on_disk["verdict"] == "pass" and on_disk["token_ids"] == result.token_ids


def test_points_and_layers_covered(results: tuple[Path, list]) -> None:
    _, out = results
    tl = next(r for r in out if r.engine == "transformer-lens")
    assert tl.layers == [0, 2, 3]
    compared = {p.address for p in tl.points if p.status == "pass"}
    for address in ("embeddings", "resid_post.3", "attn_probs.2", "mlp_act.0", "lm_head"):
        assert address in compared
    nn = next(r for r in out if r.engine == "nnsight")
    resid = next(p for p in nn.points if p.address == "resid_post.3")
    assert resid.max_abs_diff is not None and resid.max_abs_diff <= 1e-5  # same modules, fp32
    probs = next(p for p in nn.points if p.address == "attn_probs.2")
    assert probs.status == "n/a" and "attention function" in probs.reason


def test_wrong_layer_is_caught() -> None:
    # Negative control: the same engine's tensor from another layer must not pass.
    from ie_validator.models import model_spec

    model = model_spec(MODEL)
    ids = tokenize(model)
    wanted = [a for a in addresses_for(model) if a.name == "resid_post"]
    ref, _ = run_engine("eager", model, ids, wanted)
    other, _ = run_engine("nnsight", model, ids, wanted)
    assert score(ref["resid_post.0"], other["resid_post.0"], Tier.RAW_HF).status is Status.PASS
    assert score(ref["resid_post.0"], other["resid_post.3"], Tier.RAW_HF).status is Status.FAIL
