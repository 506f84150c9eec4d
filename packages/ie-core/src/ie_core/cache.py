"""ActivationCache: captured tensors keyed by Address, indexable by any address form."""

from __future__ import annotations

import copy
from collections.abc import Iterator, Mapping
from typing import Any

from ie_core.errors import UnsupportedOperationError
from ie_core.grammar import Address, AddressLike, to_address

# Per-head points: index 0 splits by query heads, 1 by KV heads (see ActivationCache.heads).
_HEAD_SPLIT = {
    "z": 0, "q_norm_in": 0, "q_norm_out": 0, "attn_gate": 0,
    "value": 1, "k_norm_in": 1, "k_norm_out": 1,
}  # fmt: skip
_PER_HEAD_MAPS = frozenset({"attn_scores", "attn_probs"})


class ActivationCache(Mapping[str, Any]):
    """`cache["resid_post.3"]`, `cache[("resid_post", 3)]` and `cache[Address("resid_post", 3)]`
    all name the same tensor. Eager tensors are `[batch, seq, ...]`. Its keys (`list(cache)`,
    `cache.keys()`, `cache.items()`) are our names as strings, `"resid_post.3"`, as
    TransformerLens's cache lists its hook names; `addresses()` gives them parsed."""

    def __init__(
        self,
        tensors: Mapping[str, Any]
        | Mapping[Address, Any]
        | Mapping[AddressLike, Any]
        | None = None,
    ) -> None:
        self._data: dict[Address, Any] = {}
        self._heads: tuple[int | None, int | None] = (None, None)
        for key, value in (tensors or {}).items():
            self._data[to_address(key)] = value

    def __getitem__(self, key: AddressLike) -> Any:  # type: ignore[override]
        address = to_address(key)
        try:
            return self._data[address]
        except KeyError:
            have = ", ".join(str(a) for a in self._data) or "nothing"
            raise KeyError(f"{address} was not captured; this cache holds {have}") from None

    def __contains__(self, key: object) -> bool:
        try:
            return to_address(key) in self._data  # type: ignore[arg-type]
        except ValueError:
            return False

    def __iter__(self) -> Iterator[str]:
        return (str(a) for a in self._data)

    def addresses(self) -> list[Address]:
        """The keys as `Address` objects, in capture order."""
        return list(self._data)

    def __len__(self) -> int:
        return len(self._data)

    def __repr__(self) -> str:
        shapes = ", ".join(f"{a}: {tuple(getattr(t, 'shape', ()))}" for a, t in self._data.items())
        return f"ActivationCache({shapes})"

    def with_heads(self, n_heads: int | None, n_kv_heads: int | None) -> ActivationCache:
        """This cache, knowing the model's head counts so `heads()` needs no argument."""
        out = copy.copy(self)  # a subclass keeps its own fields (PaddedCache's lengths)
        out._data = dict(self._data)
        out._heads = (n_heads, n_kv_heads)
        return out

    def heads(self, key: AddressLike, n_heads: int | None = None) -> Any:
        """A per-head view, `[batch, seq, heads, d_head]`, of `z`, `value`, the q/k norm points or
        `attn_gate` (`value` and k split by KV heads); attention maps already are per head."""
        address = to_address(key)
        tensor = self[address]
        if address.name in _PER_HEAD_MAPS:
            return tensor
        if address.name not in _HEAD_SPLIT:
            raise UnsupportedOperationError(
                f"{address} is not a per-head point; heads() splits "
                f"{', '.join(sorted(_HEAD_SPLIT))} (attention maps are per head already)"
            )
        count = n_heads or self._heads[_HEAD_SPLIT[address.name]]
        if not count:
            raise UnsupportedOperationError(
                f"this cache does not know the model's head count; pass it: "
                f"cache.heads({str(address)!r}, n_heads=...) (SyncModel.run_with_cache knows it "
                "on eager)"
            )
        width = tensor.shape[-1]
        if width % count:
            raise UnsupportedOperationError(
                f"{address} is {width} wide, not a multiple of {count} heads"
            )
        return tensor.reshape(*tensor.shape[:-1], count, width // count)

    def to_dict(self) -> dict[str, Any]:
        """String keys, e.g. for saving with `torch.save` or `safetensors`."""
        return {str(a): t for a, t in self._data.items()}
