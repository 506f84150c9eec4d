"""Host <-> device copies that do not stall the stream (issue 44).

On CUDA a copy from pageable host memory (`.to(device)`, `torch.tensor(list, device=...)`) and a
copy to the host (`.cpu()`, `.item()`) wait for the stream: the host stops until the GPU has run
everything queued before it, which defeats vLLM's async scheduling. `to_device` stages host data
in pinned memory and copies it without blocking; `to_host` copies device rows into pinned memory
without blocking, and a `Landing` holds the event after such copies, waited on once where the host
reads them (a drain). Elsewhere (the CPU) each is the plain copy it replaces, so nothing changes
there.
"""

from __future__ import annotations

from typing import Any

import torch
from ie_core.ops.vectors import to_device  # the ops' own copy to the device, shared

__all__ = ["Landing", "to_device", "to_host"]


def to_host(t: torch.Tensor, copy: bool = True) -> torch.Tensor:
    """`t` on the host. From CUDA: a pinned tensor filled by a non-blocking copy, which holds the
    rows only once the stream reaches it (read it after `Landing.wait`). Elsewhere
    `t.to("cpu", copy=copy)`."""
    if t.device.type != "cuda":
        return t.to("cpu", copy=copy)
    out = torch.empty(t.shape, dtype=t.dtype, pin_memory=True)
    out.copy_(t, non_blocking=True)
    return out


class Landing:
    """The point after which every `to_host` copy issued so far has landed: `record` after a
    step's copies, `wait` once before the host reads them (nothing to wait for off CUDA)."""

    def __init__(self) -> None:
        self.event: Any = None

    def record(self, device: Any) -> None:
        if torch.device(device).type != "cuda":
            return
        event = torch.cuda.Event()
        event.record(torch.cuda.current_stream(device))
        self.event = event

    def wait(self) -> None:
        event, self.event = self.event, None
        if event is not None:
            event.synchronize()
