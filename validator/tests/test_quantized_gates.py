"""Quantized checkpoints: the scheme read from the checkpoint, its own measured gate, and the
explanation of the peer that cannot run compressed-tensors weights."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from ie_validator.explanations import explain
from ie_validator.layout import layout
from ie_validator.models import quant_scheme
from ie_validator.results import load_results
from ie_validator.scoring import GATES, QUANT_GATES, Status, Tier, gate, score

RNG = np.random.default_rng(0)
REF = RNG.normal(size=(1, 7, 16))


def _noise(rel: float) -> np.ndarray:
    noise = RNG.normal(size=REF.shape)
    return REF + rel * noise * np.linalg.norm(REF) / np.linalg.norm(noise)


@pytest.mark.parametrize("scheme", list(QUANT_GATES))
def test_a_quantized_checkpoint_is_gated_at_its_schemes_measured_gate(scheme: str) -> None:
    limit = gate("bfloat16", Tier.FUSED, scheme)
    assert (
        score(REF, _noise(0.9 * limit), Tier.FUSED, dtype="bfloat16", quantization=scheme).status
        is Status.PASS
    )
    past = score(REF, _noise(1.1 * limit), Tier.FUSED, dtype="bfloat16", quantization=scheme)
    assert past.status is Status.WARN and f"(bfloat16, {scheme})" in past.reason
    # Negative control: the same error on a full-precision checkpoint is far past its gate.
    assert limit > 100 * GATES["float32"][Tier.FUSED]
    assert score(REF, _noise(0.9 * limit), Tier.FUSED).status is Status.WARN
    # The raw-HF tier (nnsight runs the same dequantized HF modules) keeps float32's tolerance.
    assert gate("float32", Tier.RAW_HF, scheme) == GATES["float32"][Tier.RAW_HF]


def test_a_scheme_without_a_measured_gate_is_refused() -> None:
    with pytest.raises(ValueError, match=r"no validator gates for awq checkpoints.*w8a8"):
        score(REF, REF.copy(), Tier.FUSED, dtype="bfloat16", quantization="awq")


def _config(model_id: str) -> dict:
    from ie_eager.synthetic import source

    folder = source(model_id)
    assert folder is not None
    return json.loads((folder / "config.json").read_text())


@pytest.mark.parametrize("scheme", ["w8a8", "w4a16", "fp8"])
def test_the_scheme_is_read_from_the_built_checkpoints_config(scheme: str) -> None:
    assert quant_scheme(_config(f"ie-synthetic/llama-{scheme}")) == scheme
    assert quant_scheme(_config("ie-synthetic/llama")) == ""


def test_other_quantization_formats_are_named_by_their_method() -> None:
    assert quant_scheme({"quantization_config": {"quant_method": "awq", "bits": 4}}) == "awq"
    assert quant_scheme({}) == ""


def test_transformer_lens_on_compressed_weights_is_explained_only_there() -> None:
    failed = {
        "quantization": "w8a8",
        "error": "TransformerBridge forward failed: KeyError: 'weight'",
    }
    assert "compressed-tensors" in explain("transformer-lens", "llama", failed)
    # Negative controls: the same error on a full-precision model, or another engine, is unknown.
    assert explain("transformer-lens", "llama", {**failed, "quantization": ""}) == ""
    assert explain("nnsight", "llama", failed) == ""


def _committed_worst(scheme: str, engine: str) -> dict[str, float]:
    for r in load_results(layout(Path(__file__).resolve().parents[2]).results):
        if r["hf_id"] == f"ie-synthetic/llama-{scheme}" and r["engine"] == engine:
            worst: dict[str, float] = {}
            for p in r["points"]:
                if p["rel_diff"] is not None:
                    worst[p["point"]] = max(worst.get(p["point"], 0.0), p["rel_diff"])
            return worst
    raise AssertionError(f"no committed result for llama-{scheme} / {engine}")


@pytest.mark.parametrize("scheme", list(QUANT_GATES))
def test_the_gate_and_the_published_figures_are_the_committed_measurements(scheme: str) -> None:
    """Drift check: docs/SUPPORTED_POINTS.md's per-point figures (ie_core.quantization) are the
    committed validator results, and the gate sits above the worst of them by at most 2x."""
    from ie_core.quantization import QUANT_SCHEMES

    doc = next(s for s in QUANT_SCHEMES if s.suffix == scheme)
    worst_all = 0.0
    for backend in doc.backends:
        if backend.backend == "eager":
            continue
        committed = _committed_worst(scheme, backend.backend)
        assert dict(backend.measured) == {k: float(f"{v:.2g}") for k, v in committed.items()}
        worst_all = max(worst_all, *committed.values())
        assert backend.gate == f"{QUANT_GATES[scheme][Tier.FUSED]:g}"
    assert worst_all < QUANT_GATES[scheme][Tier.FUSED] <= 2 * worst_all
