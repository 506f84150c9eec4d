"""Addresses: `name[.LAYER][.stream-N]` and the `path.<module path>` escape hatch.

The grammar is purely syntactic; whether a name is one of the 38 points, and whether it takes a
layer, is checked by `ie_core.grammar.naming.to_address(..., check=True)` against the registry.
"""

from __future__ import annotations

import numbers
import re
from dataclasses import dataclass

from ie_core.errors import (
    AddressError,
    EmptyNameError,
    InvalidNameError,
    LayerOutOfRangeError,
    LegacySyntaxError,
    NegativeLayerError,
    UnknownCoordinateError,
)

_NAME = re.compile(r"[a-z][a-z0-9_]*")
# Explicit ASCII ranges: `\d` and `str.isdigit` also match `²`, `①`, `١`, `１`, which `int`
# either refuses or reads as a different spelling of an ASCII number.
_NUMBER = re.compile(r"0|[1-9][0-9]*")
_DIGITS = re.compile(r"[0-9]+")
_STREAM = re.compile(r"stream-([0-9]+)")
PATH_PREFIX = "path."


@dataclass(frozen=True, order=True)
class Address:
    """A point in the forward: `Address("resid_post", 10)` is `resid_post.10`."""

    name: str
    layer: int | None = None
    stream: int | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.name, str):
            raise InvalidNameError(
                f"point name must be a string, got {type(self.name).__name__}", self.name
            )
        if self.name.startswith(PATH_PREFIX):
            if len(self.name) == len(PATH_PREFIX):
                raise EmptyNameError("path address needs a module path after 'path.'", self.name)
            if self.layer is not None or self.stream is not None:
                raise UnknownCoordinateError("a path address takes no coordinates", self.name)
            return
        if not self.name:
            raise EmptyNameError("address has an empty point name", self.name)
        if not _NAME.fullmatch(self.name):
            raise InvalidNameError(
                f"point name {self.name!r} must match [a-z][a-z0-9_]*", self.name
            )
        for label, value in (("layer", self.layer), ("stream", self.stream)):
            if value is None:
                continue
            if isinstance(value, bool) or not isinstance(value, numbers.Integral):
                raise UnknownCoordinateError(f"{label} must be an int, got {value!r}", value)
            if value < 0:
                raise NegativeLayerError(f"{label} must be >= 0, got {value}", value)
            object.__setattr__(self, label, int(value))  # numpy ints become plain ints

    @property
    def is_path(self) -> bool:
        return self.name.startswith(PATH_PREFIX)

    @property
    def module_path(self) -> str:
        """The dotted module path of a `path.` address."""
        if not self.is_path:
            raise AddressError(f"{self} is not a path address", str(self))
        return self.name[len(PATH_PREFIX) :]

    def __str__(self) -> str:
        return format_address(self)


def format_address(address: Address) -> str:
    parts = [address.name]
    if address.layer is not None:
        parts.append(str(address.layer))
    if address.stream is not None:
        parts.append(f"stream-{address.stream}")
    return ".".join(parts)


def parse_address(text: str) -> Address:
    """Parse `resid_post.10`, `embeddings`, `resid_post.5.stream-2` or `path.model.layers.0.mlp`."""
    if not isinstance(text, str):
        raise AddressError(f"address must be a string, got {type(text).__name__}", text)
    if text.startswith(PATH_PREFIX):
        return Address(text)
    if ":" in text:
        raise LegacySyntaxError(
            f"{text!r} uses the legacy 'name:layer' form; write {text.replace(':', '.')!r}", text
        )
    name, *rest = text.split(".")
    if not name:
        raise EmptyNameError(f"address {text!r} has an empty point name", text)
    if not _NAME.fullmatch(name):
        raise InvalidNameError(f"point name {name!r} in {text!r} must match [a-z][a-z0-9_]*", text)
    layer: int | None = None
    stream: int | None = None
    for i, part in enumerate(rest):
        if part.startswith("-") and _DIGITS.fullmatch(part[1:]):
            raise NegativeLayerError(f"layer in {text!r} must be >= 0", text)
        if i == 0 and _DIGITS.fullmatch(part):
            layer = _number(part, "layer", text)
        elif (m := _STREAM.fullmatch(part)) and stream is None:
            stream = _number(m.group(1), "stream", text)
        else:
            raise UnknownCoordinateError(
                f"{part!r} in {text!r} is neither a layer nor 'stream-N' "
                "(numbers are ASCII digits 0-9)",
                text,
            )
    return Address(name, layer, stream)


def _number(digits: str, label: str, text: str) -> int:
    # Leading zeros would make two strings name one address; the grammar stays injective.
    if not _NUMBER.fullmatch(digits):
        raise UnknownCoordinateError(f"{label} {digits!r} in {text!r} has leading zeros", text)
    return int(digits)


AddressLike = Address | str | tuple[str, int] | tuple[str, int, int] | tuple[str, None]


def check_layer(address: Address, n_layers: int, label: str = "") -> None:
    """Refuse a layer at or beyond the model's `n_layers` (every backend, one message)."""
    if address.layer is not None and address.layer >= n_layers:
        raise LayerOutOfRangeError(
            f"{label}{': ' if label else ''}layer {address.layer} in {address} is out of range: "
            f"the model has {n_layers} layers (0..{n_layers - 1})",
            str(address),
        )
