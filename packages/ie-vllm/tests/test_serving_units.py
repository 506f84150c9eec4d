"""#42: each backend's plugin declares how it serves every point (`BackendPlugin.serving`); the
committed capability files record those declarations for readers without the backend (the
dashboard), and must say what the installed plugins say, point by point."""

from __future__ import annotations

import pytest
from ie_core.backend_plugin import backend_plugin, point_serving
from ie_core.capabilities import BACKENDS, declared_serving
from ie_core.grammar import POINTS, Service, get_point

PLUGINS = ("eager", "vllm", "vllm-static", "vllm-generate")


@pytest.mark.parametrize("backend", PLUGINS)
def test_the_committed_declarations_equal_the_plugins(backend: str) -> None:
    """A plugin change without `ie points --sweep` (which records the declarations) fails here."""
    plugin = backend_plugin(backend)
    assert plugin is not None and plugin.serving is not None
    if backend not in BACKENDS:
        pytest.skip(f"{backend} has no committed capability file")
    differ = [
        p.name for p in POINTS if point_serving(backend, p) != declared_serving(backend, p.name)
    ]
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
