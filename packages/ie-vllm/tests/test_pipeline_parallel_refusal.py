"""pipeline_parallel_size > 1 is refused before an engine starts, with the measured reason."""

from __future__ import annotations

import psutil
import pytest
from ie_core import load_model
from ie_core.errors import UnsupportedOperationError
from ie_vllm.host.parallel_support import check_pipeline_parallel


def test_load_model_refuses_pp2_before_any_engine() -> None:
    with pytest.raises(UnsupportedOperationError, match="pipeline_parallel_size=2") as caught:
        load_model("ie-synthetic/llama", backend="vllm", pipeline_parallel_size=2)
    assert "tensor_parallel_size" in str(caught.value)  # says what to do instead
    # Refused before Engine.start: no engine process was left behind (or ever spawned).
    assert not [p for p in psutil.Process().children(recursive=True) if "VLLM" in p.name()]


def test_pp1_and_unset_are_let_through() -> None:
    check_pipeline_parallel({})
    check_pipeline_parallel({"pipeline_parallel_size": 1, "tensor_parallel_size": 2})


def test_vllm_static_refuses_pp2_before_any_engine() -> None:
    pytest.importorskip("ie_static")
    with pytest.raises(UnsupportedOperationError, match="pipeline_parallel_size=2"):
        load_model("ie-synthetic/llama", backend="vllm-static", pipeline_parallel_size=2)
    assert not [p for p in psutil.Process().children(recursive=True) if "VLLM" in p.name()]


@pytest.mark.parametrize("backend", ["vllm", "vllm-static"])
def test_ie_serve_refuses_pp2_before_vllm_starts(backend: str) -> None:
    from ie_vllm.server.serve_command import serve_argv

    for rest in (["--pipeline-parallel-size", "2"], ["-pp=2"]):
        with pytest.raises(SystemExit, match="ie serve: pipeline_parallel_size=2 is not served"):
            serve_argv("ie-synthetic/llama", backend, rest)
    assert "-pp" in serve_argv("ie-synthetic/llama", "vllm", ["-pp", "1"])
