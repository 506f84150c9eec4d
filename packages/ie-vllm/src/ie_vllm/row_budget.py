"""The bound on captured rows a hooked worker holds on its device, shared by host and worker.

Hooked vLLM keeps each request's captured rows where the forward ran until the host drains them.
On a GPU they live in what `gpu_memory_utilization` leaves (8% at 0.92), beside the activations
of every later forward. So a worker holds at most `limit` bytes of rows on the device: past it the
registry moves the oldest requests' rows to host memory (pinned; one blocking copy each time the
limit is crossed, no wait otherwise), and the host refuses up front a request whose rows alone
exceed it (`check_request`), with the number.

The limit: `ROW_LIMIT_ENV` (GiB) when set; else on CUDA `CUDA_FREE_SHARE` of the device memory
free when the worker sets up (vLLM has reserved its share by then); else (CPU) `CPU_LIMIT_BYTES`.
On the CPU the rows are in host memory already, so nothing moves; the limit is what admission
refuses at. vllm-static copies its rows to the host every step and holds none on the device.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

import torch
from ie_core.errors import UnsupportedOperationError
from ie_core.grammar import Width, get_point, to_address

__all__ = [
    "CPU_LIMIT_BYTES",
    "CUDA_FREE_SHARE",
    "ROW_LIMIT_ENV",
    "RowBudget",
    "capture_bytes",
    "check_request",
    "device_budget",
    "smallest_limit",
    "spill_copy",
]

ROW_LIMIT_ENV = "IE_DEVICE_ROWS_GIB"
GIB = 1 << 30
CUDA_FREE_SHARE = 0.5  # of the free device memory: the rest stays for activations and vLLM
CPU_LIMIT_BYTES = 16 * GIB


@dataclass(frozen=True)
class RowBudget:
    """At most `limit` bytes of rows held on the device; `spills`: move the excess to the host
    (False where the device is the host: nothing would be freed)."""

    limit: int
    spills: bool


def _env_limit() -> int | None:
    text = os.environ.get(ROW_LIMIT_ENV, "").strip()
    if not text:
        return None
    try:
        gib = float(text)
    except ValueError:
        raise UnsupportedOperationError(
            f"{ROW_LIMIT_ENV}={text!r} is not a number of GiB; set it to e.g. 4 or unset it"
        ) from None
    if gib <= 0:
        raise UnsupportedOperationError(f"{ROW_LIMIT_ENV}={text!r} must be positive")
    return int(gib * GIB)


def device_budget(device: torch.device) -> RowBudget:
    """The budget of a worker whose model is on `device` (see the module's docstring)."""
    cuda = device.type == "cuda"
    limit = _env_limit()
    if limit is None:
        limit = (
            int(CUDA_FREE_SHARE * torch.cuda.mem_get_info(device)[0]) if cuda else CPU_LIMIT_BYTES
        )
    return RowBudget(limit, spills=cuda)


def spill_copy(t: torch.Tensor) -> torch.Tensor:
    """`t` in host memory, pinned where CUDA is; a blocking copy, so the rows are there once
    this returns (a spill happens only when the limit is crossed)."""
    out = torch.empty(t.shape, dtype=t.dtype, pin_memory=t.device.type == "cuda")
    out.copy_(t)
    return out


def capture_bytes(
    widths: Mapping[str, int], d_model: int, captures: Iterable[str], rows: int, element_bytes: int
) -> int:
    """Bytes a worker holds for `rows` positions of each capture: the address's own rows; for an
    attention map (`[heads, q, k]` per layer), the q and k rows it is recomputed from, counted as
    2 x d_model wide (exact for multi-head attention, an upper bound with grouped k / v heads
    whose query width is d_model)."""
    total = 0
    for address in captures:
        per_layer = get_point(to_address(address).name).width is Width.HQK
        width = 2 * d_model if per_layer else widths.get(address, 0)
        total += rows * width * element_bytes
    return total


def check_request(
    widths: Mapping[str, int],
    d_model: int,
    captures: Iterable[str],
    rows: int,
    dtype: torch.dtype,
    limit: int,
    backend: str,
) -> None:
    """Refuse a request whose captured rows alone exceed the workers' device limit."""
    captures = tuple(captures)
    need = capture_bytes(widths, d_model, captures, rows, dtype.itemsize)
    if need <= limit:
        return
    raise UnsupportedOperationError(
        f"this request's captures would hold {need:,} bytes ({need / GIB:.2f} GiB) of rows on "
        "the device "
        f"({rows} positions x {len(captures)} addresses in {str(dtype).removeprefix('torch.')}), "
        f"more than the {limit:,} bytes ({limit / GIB:.2f} GiB) a {backend!r} worker holds "
        "before the drain; "
        f"capture fewer addresses or positions (fewer new tokens, a shorter prompt), split the "
        f"prompts, or raise {ROW_LIMIT_ENV} (GiB) where the device has the memory"
    )


def smallest_limit(answers: Iterable[Any]) -> int | None:
    """The smallest of the workers' limits (`ie_row_limit`, one per rank): every rank must hold
    the rows (None when none answered)."""
    limits = [int(a) for a in answers if a is not None]
    return min(limits) if limits else None
