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


def test_small_noise_passes_raw_tier_large_noise_fails() -> None:
    assert score(REF, REF + 1e-5, Tier.RAW_HF).status is Status.PASS
    noisy = score(REF, REF + RNG.normal(scale=1e-2, size=REF.shape), Tier.RAW_HF)
    assert noisy.status is Status.FAIL and "raw-HF gate" in noisy.reason


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
    assert score(REF, 1.2 * REF, Tier.FUSED).status is Status.PASS  # rel 0.2 is inside the gate


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
    other[0, 4] += 5e-4
    s = score(REF, other, Tier.RAW_HF)
    assert s.status is Status.PASS
    assert s.worst_token == 4
    assert s.worst_token_max_abs_diff == pytest.approx(5e-4)


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
