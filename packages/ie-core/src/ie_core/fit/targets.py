"""Where a model is to fit: a named GPU, a given number of GiB, or this machine's memory.

GPU capacities are the nominal memory each card reports (nvidia-smi's memory.total, MiB); the
driver and CUDA context take some of it, so give `--memory` for a measured figure. The vLLM
backends take `gpu_memory_utilization` (vLLM's default 0.9) of a GPU; eager the whole card.
Torch-free.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass

from ie_core.errors import UnsupportedOperationError
from ie_core.fit.items import GIB

__all__ = ["GPU_MIB", "VLLM_GPU_UTILIZATION", "Target", "target"]

GPU_MIB: Mapping[str, int] = {
    "H200": 143_771,
    "H100": 81_559,
    "A100-80GB": 81_920,
    "A100-40GB": 40_960,
    "L40S": 46_068,
    "A10G": 23_028,
    "L4": 23_034,
    "RTX4090": 24_564,
    "T4": 15_360,
}
VLLM_GPU_UTILIZATION = 0.9
VLLM_BACKENDS = frozenset({"vllm", "vllm-static"})


@dataclass(frozen=True)
class Target:
    """`device` ("cuda" or "cpu") with `budget` bytes for the backend's use of `total`."""

    name: str
    device: str
    total: int
    budget: int
    note: str


def _host_bytes() -> int:
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")


def target(backend: str, gpu: str | None, memory_gib: float | None) -> Target:
    """The target of `--gpu NAME` / `--memory GiB` (a GPU), or this machine's RAM (the CPU)."""
    if gpu is not None and memory_gib is not None:
        raise UnsupportedOperationError("give --gpu NAME or --memory GiB, not both")
    share = VLLM_GPU_UTILIZATION if backend in VLLM_BACKENDS else 1.0
    why = f"vLLM's gpu_memory_utilization {share:g}" if share < 1 else "the whole card"
    if gpu is not None:
        key = gpu.upper().replace(" ", "")
        if key not in GPU_MIB:
            raise UnsupportedOperationError(
                f"unknown GPU {gpu!r}; known: {', '.join(GPU_MIB)}; or give --memory GiB"
            )
        total = GPU_MIB[key] * 2**20
        return Target(key, "cuda", total, int(total * share), f"{key} nominal; {why}")
    if memory_gib is not None:
        if not memory_gib > 0:
            raise UnsupportedOperationError(f"--memory {memory_gib} must be a positive GiB figure")
        total = int(memory_gib * GIB)
        return Target(f"{memory_gib:g} GiB GPU", "cuda", total, int(total * share), why)
    total = _host_bytes()
    return Target("this machine (CPU)", "cpu", total, total, "physical RAM, shared with the OS")
