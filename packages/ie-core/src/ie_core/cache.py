"""ActivationCache: captured tensors keyed by Address, indexable by any address form."""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any

from ie_core.address import Address, AddressLike, to_address


class ActivationCache(Mapping[Address, Any]):
    """`cache["resid_post.3"]`, `cache[("resid_post", 3)]` and `cache[Address("resid_post", 3)]`
    all name the same tensor. Eager tensors are `[batch, seq, ...]`."""

    def __init__(self, tensors: Mapping[AddressLike, Any] | None = None) -> None:
        self._data: dict[Address, Any] = {}
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

    def __iter__(self) -> Iterator[Address]:
        return iter(self._data)

    def __len__(self) -> int:
        return len(self._data)

    def __repr__(self) -> str:
        shapes = ", ".join(f"{a}: {tuple(getattr(t, 'shape', ()))}" for a, t in self._data.items())
        return f"ActivationCache({shapes})"

    def to_dict(self) -> dict[str, Any]:
        """String keys, e.g. for saving with `torch.save` or `safetensors`."""
        return {str(a): t for a, t in self._data.items()}
