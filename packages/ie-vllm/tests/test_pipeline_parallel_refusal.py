"""pipeline_parallel_size > 1 is refused where it is not served (vllm-static, vllm-generate),
before an engine starts, with the reason; hooked vLLM serves it (test_vllm_pipeline_parallel.py)."""

from __future__ import annotations

import psutil
import pytest
from ie_core import load_model
from ie_core.errors import UnsupportedOperationError
from ie_vllm.host.parallel_support import check_pipeline_parallel, cpu_thread_binding


def test_pp1_and_unset_are_let_through() -> None:
    check_pipeline_parallel({})
    check_pipeline_parallel({"pipeline_parallel_size": 1, "tensor_parallel_size": 2})


@pytest.mark.parametrize("backend", ["vllm-static", "vllm-generate"])
def test_refusal_names_the_backend_and_what_to_do(backend: str) -> None:
    with pytest.raises(UnsupportedOperationError, match="pipeline_parallel_size=2") as caught:
        check_pipeline_parallel({"pipeline_parallel_size": 2}, backend)
    assert f"{backend!r}" in str(caught.value) and "backend='vllm'" in str(caught.value)
    check_pipeline_parallel({"pipeline_parallel_size": 2}, "vllm")  # served


def test_vllm_generate_refuses_pp2_before_any_engine() -> None:
    with pytest.raises(UnsupportedOperationError, match="'vllm-generate'"):
        load_model("ie-synthetic/llama", backend="vllm-generate", pipeline_parallel_size=2)
    assert not [p for p in psutil.Process().children(recursive=True) if "VLLM" in p.name()]


def test_vllm_static_refuses_pp2_before_any_engine() -> None:
    pytest.importorskip("ie_static")
    with pytest.raises(UnsupportedOperationError, match="pipeline_parallel_size=2"):
        load_model("ie-synthetic/llama", backend="vllm-static", pipeline_parallel_size=2)
    assert not [p for p in psutil.Process().children(recursive=True) if "VLLM" in p.name()]


@pytest.mark.parametrize("backend", ["vllm-static", "vllm-generate"])
def test_ie_serve_refuses_pp2_except_on_hooked_vllm(backend: str) -> None:
    if backend == "vllm-static":
        pytest.importorskip("ie_static")
    from ie_vllm.server.serve_command import serve_argv

    for rest in (["--pipeline-parallel-size", "2"], ["-pp=2"]):
        with pytest.raises(SystemExit, match="ie serve: pipeline_parallel_size=2 is not served"):
            serve_argv("ie-synthetic/llama", backend, rest)
        assert rest[-1] in serve_argv("ie-synthetic/llama", "vllm", rest)
    assert "-pp" in serve_argv("ie-synthetic/llama", "vllm", ["-pp", "1"])


def test_cpu_binding_gives_each_rank_its_share() -> None:
    assert cpu_thread_binding(1, [0, 1]) is None
    assert cpu_thread_binding(2, [0, 1]) == "0|1"
    assert cpu_thread_binding(4, [0, 1, 2, 3, 4, 5, 6, 7]) == "0,1|2,3|4,5|6,7"
    assert cpu_thread_binding(4, [0, 1]) == "nobind"
