"""Points measured wrong on vllm-static are refused with the measurement, before and after load."""

from __future__ import annotations

import pytest
from ie_core.errors import PointUnavailableError
from ie_static.config import StaticConfig
from ie_static.exclusions import MEASURED_WRONG, measured_wrong
from ie_static.policy import StaticPolicy


def test_a_measured_wrong_point_is_refused_with_its_measurement() -> None:
    reason = measured_wrong("Olmo2ForCausalLM", "mlp_out.1")
    assert reason is not None and "mlp_out" in reason and "backend='vllm'" in reason
    assert "4.4" in reason
    # Negative controls: another point on the family, the same point on another family.
    assert measured_wrong("Olmo2ForCausalLM", "resid_post.1") is None
    assert measured_wrong("LlamaForCausalLM", "mlp_out.1") is None


def test_every_listed_point_is_one_vllm_static_otherwise_taps() -> None:
    from ie_static.declared import TAPPABLE

    for points in MEASURED_WRONG.values():
        assert set(points) <= set(TAPPABLE)


def test_the_policy_gives_the_workers_reason_not_a_reload_hint() -> None:
    config = StaticConfig(("resid_post.0",), ())
    reason = measured_wrong("Olmo2ForCausalLM", "attn_in.0")
    assert reason is not None
    policy = StaticPolicy(("resid_post.0",), (), config, {"attn_in.0": reason})
    with pytest.raises(PointUnavailableError, match="measured to differ"):
        policy.check_read("attn_in.0")
    # Without the worker's reason, an undeclared site gets the reload hint.
    with pytest.raises(PointUnavailableError, match=r"not a declared site.*static_points"):
        StaticPolicy(("resid_post.0",), (), config).check_read("attn_in.0")


def test_a_read_site_whose_write_was_refused_is_still_read() -> None:
    """The worker's refusals also hold refused writes: they must not hide a declared read."""
    config = StaticConfig(("resid_mid.0",), ())
    policy = StaticPolicy(("resid_mid.0",), (), config, {"resid_mid.0": "read only here"})
    policy.check_read("resid_mid.0")  # no raise
    assert not policy.can_write("resid_mid.0")
