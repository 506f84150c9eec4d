"""Ragged batches: prompts of different lengths captured together, right-padded, lengths kept.

Backends refuse a ragged `capture` (one `[batch, seq]` tensor has one seq). `capture_ragged`
groups the prompts by length, captures each group with the backend's own `capture` (the groups
run concurrently, so vLLM batches them), and right-pads the rows into one tensor per address.
Rows of a prompt are therefore exactly what a capture of that prompt alone returns; padding
never enters a forward. Importing this module imports torch.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping, Sequence
from typing import Any

import torch

from ie_core.active_steering import with_active
from ie_core.cache import ActivationCache
from ie_core.errors import BadPromptError
from ie_core.grammar import POINTS, AddressLike, Width, to_address
from ie_core.protocol import SteeringArg
from ie_core.runner import run
from ie_core.sync import unwrap

# Points whose rows are [batch, heads, q, k]: both q and k run over the sequence.
_QK_POINTS = frozenset(p.name for p in POINTS if p.width == Width.HQK)


class PaddedCache(ActivationCache):
    """An ActivationCache whose tensors are right-padded with zeros to the longest prompt.

    `lengths[i]` is prompt i's true length; `mask()` is `[batch, max_len]` True on real rows;
    `unpadded(address)` returns each prompt's own rows (the padding cut off)."""

    def __init__(self, tensors: Mapping[AddressLike, Any], lengths: Sequence[int]) -> None:
        super().__init__(tensors)
        self.lengths: tuple[int, ...] = tuple(int(n) for n in lengths)

    def mask(self) -> torch.Tensor:
        positions = torch.arange(max(self.lengths))
        return positions[None, :] < torch.tensor(self.lengths)[:, None]

    def unpadded(self, address: AddressLike) -> list[torch.Tensor]:
        tensor = self[address]
        dims = seq_dims(address)
        out = []
        for i, n in enumerate(self.lengths):
            row = tensor[i]
            for d in dims:
                row = row.narrow(d - 1, 0, n)
            out.append(row)
        return out

    def __repr__(self) -> str:
        return f"Padded{super().__repr__()[:-1]}, lengths={list(self.lengths)})"


def seq_dims(address: AddressLike) -> tuple[int, ...]:
    """The dimensions of a captured `[batch, ...]` tensor that run over the sequence."""
    return (2, 3) if to_address(address).name in _QK_POINTS else (1,)


def _ids(model: Any, prompt: Any) -> list[Any]:
    if isinstance(prompt, str):
        return list(model.to_tokens(prompt))
    if isinstance(prompt, Sequence) and not isinstance(prompt, bytes | bytearray):
        return list(prompt)  # the backend's capture checks the ids
    raise BadPromptError(
        f"capture_ragged takes a list of prompts (texts or token-id lists), got an item "
        f"{type(prompt).__name__} {prompt!r:.80}"
    )


def _pad(parts: list[torch.Tensor], dims: tuple[int, ...], longest: int) -> torch.Tensor:
    shape = list(parts[0].shape)
    for d in dims:
        shape[d - 1] = longest
    out = parts[0].new_zeros((len(parts), *shape))
    for i, part in enumerate(parts):
        out[(i, *(slice(0, n) for n in part.shape))] = part
    return out


async def capture_ragged_async(
    model: Any,
    prompts: Sequence[Any],
    addresses: Sequence[AddressLike],
    *,
    steering: SteeringArg = None,
) -> PaddedCache:
    """The async form of `capture_ragged`, for your own event loop."""
    model = unwrap(model)
    if isinstance(prompts, str) or not isinstance(prompts, Sequence) or not prompts:
        raise BadPromptError("capture_ragged takes a non-empty list of prompts")
    if isinstance(addresses, str):
        addresses = [addresses]
    rows = [_ids(model, p) for p in prompts]
    groups: dict[int, list[int]] = {}
    for i, ids in enumerate(rows):
        groups.setdefault(len(ids), []).append(i)
    order = list(groups.values())
    caches = await asyncio.gather(
        *(model.capture([rows[i] for i in g], addresses, steering=steering) for g in order)
    )
    lengths = [len(r) for r in rows]
    tensors: dict[AddressLike, torch.Tensor] = {}
    for address in addresses:
        parts: list[torch.Tensor] = [torch.empty(0)] * len(rows)
        for members, cache in zip(order, caches, strict=True):
            for j, i in enumerate(members):
                parts[i] = cache[address][j]
        tensors[address] = _pad(parts, seq_dims(address), max(lengths))
    return PaddedCache(tensors, lengths)


def capture_ragged(
    model: Any,
    prompts: Sequence[Any],
    addresses: Sequence[AddressLike],
    *,
    steering: SteeringArg = None,
) -> PaddedCache:
    """Capture prompts of different lengths: `[batch, max_len, ...]` right-padded with zeros
    (attention `[batch, heads, max_len, max_len]`), true lengths in `.lengths`."""
    steering = with_active(model, steering)  # `with steer(model, ...)` holds here too
    return run(capture_ragged_async(model, prompts, addresses, steering=steering))


__all__ = ["PaddedCache", "capture_ragged", "capture_ragged_async", "seq_dims"]
