"""#42: each backend's plugin declares how it serves every point (`BackendPlugin.serving`), and
those declarations say what ie-core's point registry said per backend, point by point."""

from __future__ import annotations

import pytest
from ie_core.backend_plugin import backend_plugin, point_serving
from ie_core.grammar import POINTS, Service, get_point

BACKENDS = ("eager", "vllm", "vllm-static", "vllm-generate")


@pytest.mark.parametrize("backend", BACKENDS)
def test_plugin_serving_equals_the_registry_marks(backend: str) -> None:
    """Independent source: the per-backend columns of `ie_core.grammar.points` (Point.serving)."""
    plugin = backend_plugin(backend)
    assert plugin is not None and plugin.serving is not None
    differ = [p.name for p in POINTS if point_serving(backend, p) != p.serving(backend)]
    assert differ == []


def test_the_marks_that_matter_by_hand() -> None:
    mlp_pre, probs, streams = (
        get_point("mlp_pre"),
        get_point("attn_probs"),
        get_point("resid_streams"),
    )
    assert point_serving("vllm", mlp_pre).service is Service.NOT_SERVED
    assert "use backend='eager'" in point_serving("vllm", mlp_pre).reason
    assert point_serving("vllm", probs).service is Service.RECOMPUTE
    assert point_serving("vllm-static", get_point("resid_post")).service is Service.STATIC_TAP
    assert "multi-stream" in point_serving("vllm-static", streams).reason
    assert point_serving("vllm", streams).service is Service.HOOK
    assert point_serving("eager", mlp_pre).service is Service.HOOK
    assert not any(point_serving("vllm-generate", p).served for p in POINTS)


def test_a_backend_without_a_declaration_is_refused_by_name() -> None:
    with pytest.raises(ValueError, match="no-such-backend"):
        point_serving("no-such-backend", get_point("resid_post"))
