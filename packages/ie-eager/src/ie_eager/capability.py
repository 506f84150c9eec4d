"""The eager backend's capability answer: every point tried at every layer on its own resolver."""

from __future__ import annotations

from ie_core.capabilities import Capabilities, probe
from ie_core.grammar import Address

from ie_eager.resolve import Resolved, Resolver

__all__ = ["capabilities"]


def capabilities(resolver: Resolver) -> Capabilities:
    """Per point: served layers, writability and the resolver's own refusal reasons."""

    def writable(_address: Address, resolved: Resolved) -> bool:
        return resolved.writable

    return probe(resolver.n_layers, resolver.resolve, writable)
