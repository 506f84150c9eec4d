"""Payload codec: many tensors become one byte buffer with a single device-to-host copy.

The wire form is plain data (a manifest list and one `bytes`), which vLLM's msgpack RPC carries
without insecure serialization.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch

from ie_vllm.worker.transfer import Landing, to_device, to_host

_DTYPES: dict[str, torch.dtype] = {
    str(d).removeprefix("torch."): d
    for d in (torch.float32, torch.float16, torch.bfloat16, torch.float64, torch.int64,
              torch.int32, torch.bool, torch.uint8)
}  # fmt: skip


_ALIGN = 8


def encode(tensors: Mapping[str, torch.Tensor]) -> dict[str, Any]:
    """`{"manifest": [[name, dtype, shape, offset, nbytes], ...], "data": bytes}`."""
    manifest: list[list[Any]] = []
    parts: list[torch.Tensor] = []
    offset = 0
    for name, t in tensors.items():
        flat = t.detach().contiguous().reshape(-1).view(torch.uint8)
        manifest.append(
            [name, str(t.dtype).removeprefix("torch."), list(t.shape), offset, flat.numel()]
        )
        parts.append(flat)
        pad = -flat.numel() % _ALIGN  # keep every entry aligned for a zero-copy view on decode
        if pad:
            parts.append(torch.zeros(pad, dtype=torch.uint8, device=flat.device))
        offset += flat.numel() + pad
    if not parts:
        return {"manifest": [], "data": b""}
    on_device = [p for p in parts if p.is_cuda]
    if on_device and len(on_device) < len(parts):
        # Some rows were moved to the host past the device limit (`row_budget`): land the rest
        # beside them instead of copying those back onto the device.
        parts = [to_host(p) if p.is_cuda else p for p in parts]
        landing = Landing()
        landing.record(on_device[0].device)
        landing.wait()
    # Concatenated where the rows are (a device's, if any part is on one: a drain's rows are).
    device = next((p.device for p in parts if p.is_cuda), parts[0].device)
    buf = torch.cat([to_device(p, device) for p in parts]) if len(parts) > 1 else parts[0]
    if buf.is_cuda:
        # One non-blocking copy into pinned memory, then one wait: the payload's only sync.
        host, landing = to_host(buf), Landing()
        landing.record(buf.device)
        landing.wait()
        buf = host
    return {"manifest": manifest, "data": buf.cpu().numpy().tobytes()}


def decode(payload: Mapping[str, Any]) -> dict[str, torch.Tensor]:
    data = bytearray(payload["data"])
    out: dict[str, torch.Tensor] = {}
    whole = torch.frombuffer(data, dtype=torch.uint8) if data else torch.empty(0, dtype=torch.uint8)
    for name, dtype, shape, offset, nbytes in payload["manifest"]:
        raw = whole[offset : offset + nbytes]
        out[name] = raw.view(_DTYPES[dtype]).reshape(shape)
    return out
