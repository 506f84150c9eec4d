"""Vectors as the ops' maths needs them, built with tensor methods from a template tensor (`like`:
fp32, on the rows' device), so the op modules never import torch themselves."""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from ie_core.ops.values import VectorLike

if TYPE_CHECKING:
    from torch import Tensor

# The attribute under which an op keeps its device tensors (`cached`); `Op.__getstate__` drops
# it, so a pickled or copied op carries only its spec.
CACHE_ATTR = "_ie_device_tensors"


def to_device(host: Tensor, device: Any) -> Tensor:
    """A host tensor on `device`. To CUDA it is staged in pinned memory and copied without
    blocking: a copy from pageable memory waits for the stream (everything queued before it); the
    pinned block is not reused before the copy is done (torch's host allocator records its event)."""
    import torch  # the rows are tensors already: this imports nothing new

    device = torch.device(device)
    if device.type != "cuda" or host.device.type != "cpu":
        return host.to(device)
    return host.pin_memory().to(device, non_blocking=True)


def on_device(values: Any, like: Tensor, dtype: Any = None) -> Tensor:
    """`values` (numbers, nested sequences) as a tensor of `dtype` (`like`'s when None) on
    `like`'s device: `like.new_tensor(values)`, with a CUDA copy that does not block."""
    dtype = like.dtype if dtype is None else dtype
    if like.device.type != "cuda":
        return like.new_tensor(values, dtype=dtype)
    return to_device(like.new_tensor(values, dtype=dtype, device="cpu"), like.device)


def cached(owner: object, name: str, like: Tensor, build: Callable[[], Tensor]) -> Tensor:
    """`build()` once per `owner` (an op), `name`, and `like`'s device and dtype, then reused:
    an op's vectors reach the device once, not at every forward of every step. A tensor built in
    inference mode serves only inference mode (such a tensor cannot join an autograd graph)."""
    import torch  # the rows are tensors already: this imports nothing new

    store = _store(owner)
    key = (name, like.device, like.dtype, torch.is_inference_mode_enabled())
    got = store.get(key)
    if got is None:
        got = store[key] = build()
    return got


def _store(owner: object) -> dict[Any, Tensor]:
    """`owner`'s device tensors by (name, device, dtype, inference mode), made on first use."""
    store = owner.__dict__.get(CACHE_ATTR)
    if store is None:
        store = {}
        object.__setattr__(owner, CACHE_ATTR, store)
    return store


def share_cache(source: object, target: object) -> None:
    """Let `target` (an op built for one forward from `source`) use `source`'s device tensors."""
    object.__setattr__(target, CACHE_ATTR, _store(source))


def without_cache(owner: object) -> dict[str, Any]:
    """`owner`'s attributes without the device tensors it keeps: its `__getstate__`, so a pickled
    or copied op or probe carries only its spec."""
    state = dict(owner.__dict__)
    state.pop(CACHE_ATTR, None)
    return state


def unit(values: VectorLike, like: Tensor) -> Tensor:
    """values / |values| in fp32 on `like`'s device (finite, non-zero in fp32, as specs are).

    The vector is first scaled by a power of two that brings its largest entry near 1: exact in
    binary floating point, so normal-range vectors give bit for bit `v / v.norm()`, while tiny or
    huge ones no longer under- or overflow in the squares of the norm (which gave NaN or zero).
    The scaling runs on the host (it is exact, so the device would compute the same), so reading
    the peak never waits for a GPU; the norm and the division run on `like`'s device."""
    v = like.new_tensor(values, device="cpu").float()
    peak = float(v.abs().max())
    if peak > 0:
        # In float64, since 2**-exponent of a subnormal fp32 peak is beyond fp32's range.
        v = (v.double() * 2.0 ** -math.frexp(peak)[1]).float()
    v = to_device(v, like.device)
    return v / v.norm()


def vector(values: VectorLike, like: Tensor) -> Tensor:
    """`values` as an fp32 tensor on `like`'s device."""
    return on_device(values, like).float()


def cached_vector(owner: object, name: str, values: VectorLike, like: Tensor) -> Tensor:
    """`vector(values, like)`, built once per op (`cached`)."""
    return cached(owner, name, like, lambda: vector(values, like))


def cached_unit(owner: object, name: str, values: VectorLike, like: Tensor) -> Tensor:
    """`unit(values, like)`, built once per op (`cached`)."""
    return cached(owner, name, like, lambda: unit(values, like))


def row_norm(h: Tensor) -> Tensor:
    """|h| per row ([..., 1]), scaled by a power of two per row like `unit`, so a row whose
    entries are finite but near fp32's top (1.8e19 squared overflows) gets a finite norm."""
    _, exponent = h.abs().amax(dim=-1, keepdim=True).frexp()
    return h.ldexp(-exponent).norm(dim=-1, keepdim=True).ldexp(exponent)


def position_hits(
    wanted: tuple[int, ...],
    positions: Tensor | None,
    like: Tensor,
    what: str,
    owner: object | None = None,
) -> Tensor:
    """Bool `[..., len(wanted)]`: which of the absolute positions `wanted` each row is at, given
    the rows' positions `[...]`; `what` names the op that needs them. With `owner` (the op) the
    tensor of `wanted` is built once and kept there (`cached`)."""
    if positions is None:
        raise RuntimeError(f"{what} at given positions needs the rows' positions")
    if owner is None:
        want = positions.new_tensor(wanted).long()
    else:
        want = cached(owner, "positions", positions, lambda: on_device(wanted, positions).long())
    return positions.to(like.device).long().unsqueeze(-1) == want.to(like.device)


def head_columns(
    heads: tuple[int, ...], head_dim: int | None, width: int, like: Tensor
) -> Tensor | None:
    """Bool `[width]`: the columns of `heads` (None when the op targets every column)."""
    if not heads or head_dim is None:
        return None
    cols = like.new_zeros(width).bool()
    for h in heads:
        cols[h * head_dim : (h + 1) * head_dim] = True
    return cols


__all__ = [
    "CACHE_ATTR",
    "cached",
    "cached_unit",
    "cached_vector",
    "head_columns",
    "on_device",
    "position_hits",
    "row_norm",
    "share_cache",
    "to_device",
    "unit",
    "vector",
    "without_cache",
]
