"""What `ie fit` prices: one `Item` per memory consumer, and the `Workload` a backend prices.

A backend prices its own consumers (`BackendPlugin.memory`: eager's logits and attention, vLLM's
KV cache and graph pool, vllm-static's tap buffers); ie-core prices what every backend holds (the
weights, an attribution graph). Torch-free.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["GIB", "Item", "Workload"]

GIB = 2**30


@dataclass(frozen=True)
class Item:
    """`nbytes` of memory held for `name`; `note` says how it was priced (or why it is 0)."""

    name: str
    nbytes: int
    note: str
    remedy: str = ""  # what lowers it, for the advice when the total does not fit


@dataclass(frozen=True)
class Workload:
    """What the model is asked to hold: `addresses` captured (hooked vLLM, eager) or tapped
    (vllm-static reads), `static_writes` (vllm-static), sequences of `tokens` tokens, `streams` of
    them at once, activations and loaded weights of `element_bytes` each, on `device` ("cpu" or
    "cuda")."""

    backend: str
    addresses: tuple[str, ...]
    static_writes: tuple[str, ...]
    tokens: int
    streams: int
    element_bytes: int
    device: str
