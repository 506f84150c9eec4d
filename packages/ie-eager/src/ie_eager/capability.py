"""The eager backend's capability answer: every point tried at every layer on its own resolver."""

from __future__ import annotations

from ie_core.address import Address
from ie_core.capabilities import Capabilities, probe

from ie_eager.resolve import Resolved, Resolver

__all__ = ["capabilities"]


def _reason(address: Address, message: str) -> str:
    # The resolver prefixes every refusal with the point; the rest is the same on every layer.
    return message.removeprefix(f"{address.name} is not available on this model: ")


def capabilities(resolver: Resolver) -> Capabilities:
    """Per point: served layers, writability and the resolver's own refusal reasons."""

    def writable(_address: Address, resolved: Resolved) -> bool:
        return resolved.writable

    return probe(resolver.n_layers, resolver.resolve, writable, _reason)
