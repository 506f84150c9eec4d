"""Device and dtype choice for the eager backend: explicit, and an absent GPU is an error."""

from __future__ import annotations

from typing import Any

import torch
from ie_core.errors import InterpError


class DeviceUnavailableError(InterpError, RuntimeError):
    """The requested device does not exist on this machine."""


_DTYPES = {
    "float32": torch.float32,
    "fp32": torch.float32,
    "float": torch.float32,
    "bfloat16": torch.bfloat16,
    "bf16": torch.bfloat16,
    "float16": torch.float16,
    "fp16": torch.float16,
    "half": torch.float16,
}


def resolve_device(device: str | torch.device | None) -> torch.device:
    """`None` means CUDA when present, else CPU; an explicit GPU that is absent is an error."""
    if device is None:
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    dev = torch.device(device)
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise DeviceUnavailableError(
            f"device {str(device)!r} was requested but no CUDA GPU is visible to torch; "
            "pass device='cpu' to run on the CPU"
        )
    if dev.type == "cuda" and dev.index is not None and dev.index >= torch.cuda.device_count():
        raise DeviceUnavailableError(
            f"device {str(device)!r} was requested but only {torch.cuda.device_count()} GPU(s) exist"
        )
    return dev


def resolve_dtype(
    dtype: str | torch.dtype | None, device: torch.device, config: Any
) -> torch.dtype:
    """`None`: float32 on CPU; on a GPU the checkpoint's own dtype (float32 stays float32)."""
    if isinstance(dtype, torch.dtype):
        return dtype
    if dtype is None or dtype == "auto":
        if device.type == "cpu":
            return torch.float32
        saved = getattr(config, "dtype", None) or getattr(config, "torch_dtype", None)
        if isinstance(saved, str):
            saved = _DTYPES.get(saved)
        return saved if isinstance(saved, torch.dtype) else torch.float32
    try:
        return _DTYPES[str(dtype).lower()]
    except KeyError:
        raise ValueError(f"unknown dtype {dtype!r}; use one of {', '.join(_DTYPES)}") from None
