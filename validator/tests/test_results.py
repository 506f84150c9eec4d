"""Gaps become N/A rows, results are written per (model, engine), rendering keeps other models."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
from ie_core.grammar import Address
from ie_validator.engines.base import Capture, ModelSpec, plan
from ie_validator.layout import layout
from ie_validator.mappings import Gap, Hook, lookup
from ie_validator.render import BEGIN, END, render_all
from ie_validator.results import (
    PointResult,
    ValidatorResult,
    load_results,
    result_path,
    write_result,
)
from ie_validator.scoring import Tier
from ie_validator.sweep import compare

# The committed results of this checkout, found from the test's own location.
CHECKOUT = layout(Path(__file__).resolve().parents[2])


def _spec(family: str) -> ModelSpec:
    return ModelSpec(f"ie-synthetic/{family}", Path("/nonexistent"), family, "X", 4)


def test_declared_gap_yields_na_with_reason() -> None:
    address = Address("value", 0)
    requests, gaps = plan("nnsight", _spec("phi3"), [address])
    assert requests == []
    gap = gaps["value.0"]
    assert isinstance(gap, Gap) and "fused" in gap.reason
    ref: Capture = {"value.0": np.ones((1, 3, 8))}
    (row,) = compare([address], ref, gaps, Tier.RAW_HF, {})
    assert row.status == "n/a" and row.reason == gap.reason and row.cos is None


def test_reference_refusal_yields_na_naming_the_reference() -> None:
    address = Address("resid_mid", 1)
    ref: Capture = {"resid_mid.1": Gap("parallel block: no resid_mid")}
    engine: Capture = {"resid_mid.1": np.ones((1, 3, 8))}
    (row,) = compare([address], ref, engine, Tier.FUSED, {})
    assert row.status == "n/a" and "reference cannot produce it" in row.reason


def test_engine_capture_failure_is_a_failed_cell_not_a_crash() -> None:
    from ie_validator.engines.base import CaptureFailure

    address = Address("attn_probs", 0)
    ref: Capture = {"attn_probs.0": np.ones((1, 2, 3, 3))}
    failed: Capture = {"attn_probs.0": CaptureFailure("nnsight: RuntimeError: no such module")}
    (row,) = compare([address], ref, failed, Tier.RAW_HF, {})
    assert row.status == "fail" and "no such module" in row.reason and row.cos is None
    # Negative control: the same tensor captured passes.
    same: Capture = {"attn_probs.0": np.ones((1, 2, 3, 3))}
    (row,) = compare([address], ref, same, Tier.RAW_HF, {})
    assert row.status == "pass"


def test_transformer_lens_sandwich_gap_is_data() -> None:
    # On sandwich-norm families TransformerLens' hook_attn_out is this project's attn_out_post.
    def name(family: str, point: str) -> str:
        hook = lookup("transformer-lens", family, point)
        assert isinstance(hook, Hook)
        return hook.name

    assert name("gemma2", "attn_out_post") == "blocks.{L}.hook_attn_out"
    assert name("gemma2", "attn_out") == "blocks.{L}.attn.hook_out"
    assert name("llama", "attn_out") == "blocks.{L}.hook_attn_out"


def _result(hf_id: str, engine: str, verdict: str = "pass") -> ValidatorResult:
    point = PointResult.model_validate(dict(
        point="resid_post", layer=0, tier="raw_hf", status=verdict, cos=1.0, max_abs_diff=0.0,
        rel_diff=0.0,
    ))  # fmt: skip
    return ValidatorResult.model_validate(dict(
        hf_id=hf_id, engine=engine, reference="eager", verdict=verdict, status="ok",
        captured_at="2026-01-01T00:00:00+00:00", dtype="float32", device="cpu", family="llama",
        architecture="LlamaForCausalLM", tier="raw_hf", prompt="p", token_ids=[1, 2], layers=[0],
        versions={}, summary={"pass": 1, "warn": 0, "fail": 0, "n/a": 0}, points=[point],
    ))  # fmt: skip


def test_rerunning_one_model_leaves_others_alone(tmp_path: Path) -> None:
    write_result(_result("ie-synthetic/a", "nnsight"), tmp_path)
    other = write_result(_result("ie-synthetic/b", "nnsight"), tmp_path)
    before = (other.read_bytes(), other.stat().st_mtime_ns)
    write_result(_result("ie-synthetic/a", "nnsight", "fail"), tmp_path)
    assert (other.read_bytes(), other.stat().st_mtime_ns) == before
    a = json.loads(result_path("ie-synthetic/a", "nnsight", tmp_path).read_text())
    assert a["verdict"] == "fail"
    assert [r["hf_id"] for r in load_results(tmp_path)] == ["ie-synthetic/a", "ie-synthetic/b"]


def test_render_writes_matrix_between_markers_and_pages(tmp_path: Path) -> None:
    results = tmp_path / "results"
    write_result(_result("ie-synthetic/a", "nnsight"), results)
    write_result(_result("ie-synthetic/b", "transformer-lens", "fail"), results)
    (tmp_path / "README.md").write_text(f"intro\n{BEGIN}\nold\n{END}\noutro\n")
    render_all(results, tmp_path)
    text = (tmp_path / "README.md").read_text()
    assert text.startswith("intro\n") and text.endswith("outro\n") and "old" not in text
    assert "| [ie-synthetic/a](models/ie-synthetic__a.md) | · | ✅ 1/1 · bit-exact |" in text
    assert "UNEXPLAINED" in text  # a failing cell with no recorded explanation is flagged
    assert (tmp_path / "models" / "ie-synthetic__b.md").exists()


def test_engine_hook_mappings_doc_is_current() -> None:
    from ie_validator.render import render_mappings

    doc = CHECKOUT.mappings_doc
    assert doc is not None and doc.read_text() == render_mappings(), (
        "run `ie validate mappings --write`"
    )


def test_declared_layout_is_transposed_not_reshaped() -> None:
    from ie_validator.engines.base import canonical

    bhsd = np.arange(2 * 5 * 4, dtype=np.float64).reshape(1, 2, 5, 4)  # [b, heads, seq, d]
    out = canonical("q_norm_out", bhsd, "bhsd")
    assert out.shape == (1, 5, 8)
    np.testing.assert_array_equal(out[0, 3], np.concatenate([bhsd[0, 0, 3], bhsd[0, 1, 3]]))
    assert not np.array_equal(canonical("q_norm_out", bhsd), out)  # a plain reshape would differ


def test_committed_results_every_non_pass_cell_is_explained() -> None:
    from ie_validator.explanations import explain

    unexplained = [
        f"{r['hf_id']} / {r['engine']}: {r['verdict']}"
        for r in load_results(CHECKOUT.results)
        if r["verdict"] != "pass" and not explain(r["engine"], r["family"], r)
    ]
    assert not unexplained, "add the reason to ie_validator/explanations.py"


def test_committed_readme_matrix_matches_results() -> None:
    from ie_validator.render import render_matrix

    assert render_matrix(load_results(CHECKOUT.results)) in CHECKOUT.matrix_md.read_text(), (
        "run `ie validate render`"
    )


def test_a_vllm_cpu_refusal_is_explained_and_other_errors_are_not() -> None:
    from ie_validator.explanations import explain

    refused = {
        "error": "load_model(backend='vllm') failed: UnsupportedModelError: vLLM 0.32.0 (CPU) "
        "cannot run Lfm2ForCausalLM from this checkpoint: its engine fails with AttributeError"
    }
    assert "CPU build cannot construct" in explain("vllm-static", "lfm2", refused)
    # Negative controls: a crash is not a known refusal, and other engines get no such pass.
    crash = {"error": "load_model(backend='vllm') failed: RuntimeError: engine core died"}
    assert explain("vllm", "lfm2", crash) == ""
    assert explain("nnsight", "lfm2", refused) == ""


def test_a_mixer_a_hybrid_layer_lacks_is_no_module_for_nnsight() -> None:
    """HF hybrid layers (Granite-4.0-H) set the mixer they lack to None: nnsight's accessor walk
    treats it as absent (an n/a row), not as a module to read from."""
    from types import SimpleNamespace

    import pytest
    from ie_validator.engines.nnsight_engine import _envoy

    layers = [SimpleNamespace(self_attn=None, mamba="m"), SimpleNamespace(self_attn="a")]
    root = SimpleNamespace(model=SimpleNamespace(layers=layers))
    assert _envoy(root, ["model", "layers", "1", "self_attn"]) == "a"
    assert _envoy(root, ["model", "layers", "0", "mamba"]) == "m"
    with pytest.raises(AttributeError):
        _envoy(root, ["model", "layers", "0", "self_attn"])


def test_committed_results_agree_with_the_current_gates() -> None:
    """Drift check: re-gating the stored metrics changes nothing (else `ie validate rescore`)."""
    from ie_validator.rescoring import rescore

    stale = [
        f"{r['hf_id']} / {r['engine']}" for r in load_results(CHECKOUT.results) if rescore(r) != r
    ]
    assert not stale, "run `uv run ie validate rescore`"


def _result_with(points: list[dict]) -> dict:
    summary = {"pass": len(points), "warn": 0, "fail": 0, "n/a": 0}
    return {"status": "ok", "dtype": "float32", "verdict": "pass", "summary": summary,
            "points": points}  # fmt: skip


def _point(tier: str, rel: float, max_abs: float) -> dict:
    return {"tier": tier, "status": "pass", "reason": "", "cos": 1.0, "rel_diff": rel,
            "max_abs_diff": max_abs}  # fmt: skip


def test_rescore_applies_the_gates_to_stored_metrics() -> None:
    from ie_validator.rescoring import rescore

    fine = _result_with([_point("fused", 5e-5, 1e-4), _point("raw_hf", 5e-6, 1e-5)])
    assert rescore(fine) == fine
    loose = _result_with([_point("fused", 2e-4, 1e-3), _point("raw_hf", 2e-5, 1e-4)])
    out = rescore(loose)
    assert [p["status"] for p in out["points"]] == ["warn", "fail"]
    assert out["summary"] == {"pass": 0, "warn": 1, "fail": 1, "n/a": 0}
    assert out["verdict"] == "fail"


def test_a_cell_shows_its_worst_and_bit_exact_only_at_zero() -> None:
    from ie_validator.render import _cell

    exact = _result_with([_point("raw_hf", 0.0, 0.0), _point("raw_hf", 0.0, 0.0)])
    assert _cell(exact).endswith("· bit-exact")
    # One point off by a rounding step is not bit-exact, however small.
    near = _result_with([_point("raw_hf", 0.0, 0.0), _point("raw_hf", 3e-8, 1e-7)])
    assert _cell(near).endswith("· rel ≤ 3.0e-08") and "bit-exact" not in _cell(near)
