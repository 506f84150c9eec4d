"""The scoring rules on hand-made arrays: gates, structural verdicts, negative controls."""

from __future__ import annotations

import numpy as np
import pytest
from ie_validator.scoring import Status, Tier, score, verdict

RNG = np.random.default_rng(0)
REF = RNG.normal(size=(1, 7, 16))


@pytest.mark.parametrize("tier", list(Tier))
def test_identical_passes_with_exact_metrics(tier: Tier) -> None:
    s = score(REF, REF.copy(), tier)
    assert s.status is Status.PASS
    assert s.cos == pytest.approx(1.0, abs=1e-12)
    assert s.max_abs_diff == 0.0 and s.rel_diff == 0.0


def test_gates_are_the_project_tolerances_per_tier() -> None:
    """fp32: rel <= 1e-5 on the raw-HF tier (the tests' same-engine tolerance), 1e-4 on the
    fused tier (eager vs vLLM); just past each gate fails (raw) or warns (fused)."""
    noise = RNG.normal(size=REF.shape)
    noise *= np.linalg.norm(REF) / np.linalg.norm(noise)  # rel(REF + e * noise) == e
    assert score(REF, REF + 0.9e-5 * noise, Tier.RAW_HF).status is Status.PASS
    raw = score(REF, REF + 1.1e-5 * noise, Tier.RAW_HF)
    assert raw.status is Status.FAIL and "raw_hf gate (float32)" in raw.reason
    assert score(REF, REF + 0.9e-4 * noise, Tier.FUSED).status is Status.PASS
    fused = score(REF, REF + 1.1e-4 * noise, Tier.FUSED)
    assert fused.status is Status.WARN and "rel <= 0.0001" in fused.reason


def test_the_old_loose_gates_no_longer_pass() -> None:
    # Negative control: 2e-3 absolute noise (the old raw gate) and rel 0.4 (the old fused gate
    # passed up to 0.5) are both far outside the project's tolerances.
    assert score(REF, REF + 2e-3, Tier.RAW_HF).status is Status.FAIL
    assert score(REF, REF + RNG.normal(scale=0.4, size=REF.shape), Tier.FUSED).status is not (
        Status.PASS
    )


def test_a_dtype_without_gates_is_refused() -> None:
    with pytest.raises(ValueError, match=r"no validator gates for bfloat16.*float32"):
        score(REF, REF.copy(), Tier.RAW_HF, dtype="bfloat16")


@pytest.mark.parametrize("tier", list(Tier))
def test_zero_capture_is_not_a_match(tier: Tier) -> None:
    s = score(REF, np.zeros_like(REF), tier)
    assert s.status is Status.FAIL
    assert "all zeros" in s.reason
    assert score(np.zeros_like(REF), REF, tier).status is Status.FAIL


def test_scale_error_fails_relative_gate() -> None:
    # cos is exactly 1 for a scaled copy: only the relative error can catch it.
    fused = score(REF, 2.0 * REF, Tier.FUSED)
    assert fused.cos == pytest.approx(1.0)
    assert fused.rel_diff == pytest.approx(1.0)
    assert fused.status is Status.WARN and "rel" in fused.reason
    assert score(REF, 2.0 * REF, Tier.RAW_HF).status is Status.FAIL
    # A 1.2x scale error (rel 0.2, cos 1) is a wrong tensor on every tier.
    assert score(REF, 1.2 * REF, Tier.FUSED).status is Status.WARN
    assert score(REF, 1.2 * REF, Tier.RAW_HF).status is Status.FAIL
    # A 1 + 1e-6 scale is rounding: it passes both.
    assert score(REF, (1 + 1e-6) * REF, Tier.RAW_HF).status is Status.PASS


@pytest.mark.parametrize("tier", list(Tier))
def test_shape_mismatch_fails(tier: Tier) -> None:
    s = score(REF, REF[:, :-1], tier)
    assert s.status is Status.FAIL and "shape mismatch" in s.reason
    assert s.cos is None


def test_unrelated_tensor_fails_even_on_fused_tier() -> None:
    s = score(REF, RNG.normal(size=REF.shape), Tier.FUSED)
    assert s.status is Status.FAIL and "not the same tensor" in s.reason


def test_mask_conventions_agree_but_different_masks_fail() -> None:
    scores = RNG.normal(size=(1, 2, 5, 5))
    causal = np.triu(np.ones((5, 5), dtype=bool), k=1)
    ours = np.where(causal, np.finfo(np.float32).min, scores)
    theirs = np.where(causal, -np.inf, scores)  # TransformerLens masks with -inf
    assert score(ours, theirs, Tier.FUSED, attention_map=True).status is Status.PASS
    shifted = np.where(np.triu(np.ones((5, 5), dtype=bool), k=2), -np.inf, scores)
    s = score(ours, shifted, Tier.FUSED, attention_map=True)
    assert s.status is Status.FAIL and "different mask" in s.reason


def test_worst_token_is_reported_not_gating() -> None:
    other = REF.copy()
    other[0, 4] += 5e-6
    s = score(REF, other, Tier.RAW_HF)
    assert s.status is Status.PASS
    assert s.worst_token == 4
    assert s.worst_token_max_abs_diff == pytest.approx(5e-6)


def test_nan_fails() -> None:
    other = REF.copy()
    other[0, 0, 0] = np.nan
    assert score(REF, other, Tier.FUSED).status is Status.FAIL


def test_verdict_is_the_worst_point() -> None:
    assert verdict([Status.PASS, Status.NA]) == "pass"
    assert verdict([Status.PASS, Status.WARN]) == "warn"
    assert verdict([Status.WARN, Status.FAIL, Status.PASS]) == "fail"
    assert verdict([Status.NA]) == "unsupported"
    assert verdict([]) == "unsupported"
