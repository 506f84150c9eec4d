"""What eager holds beyond its weights, priced from the config for `ie fit`
(`BackendPlugin.memory`): the captured rows, the logits HF computes at every position, and one
attention layer's scores and probabilities (eager attention materialises heads x T x T; each
layer frees its own before the next). Runs with `use_cache=False` (a capture keeps no KV cache).
Torch-free.
"""

from __future__ import annotations

from typing import Any

__all__ = ["eager_memory"]


def _captured(shape: Any, work: Any) -> Any:
    from ie_core.fit import Item
    from ie_core.grammar import Width, get_point, to_address

    t, s, eb = work.tokens, work.streams, work.element_bytes
    total = 0
    for address in work.addresses:
        width = get_point(to_address(address).name).width
        per_token = shape.n_heads * t if width is Width.HQK else shape.width(width)
        total += per_token * t * s * eb
    note = f"{len(work.addresses)} addresses x {s} x {t:,} tokens x {eb} B (maps: heads x T^2)"
    return Item("captured rows", total, note, "capture fewer points, or a shorter prompt")


def eager_memory(shape: Any, work: Any) -> tuple[Any, ...]:
    from ie_core.fit import Item

    t, s, eb = work.tokens, work.streams, work.element_bytes
    logits = shape.vocab * t * s * eb
    attention = (2 * shape.n_heads + 1) * t * t * s * eb
    return (
        _captured(shape, work),
        Item("eager logits", logits, f"vocab {shape.vocab:,} x {s} x {t:,} tokens x {eb} B",
             "a shorter prompt"),
        Item("eager attention", attention,
             f"one layer's scores and probabilities (2 x {shape.n_heads} heads) and the causal "
             f"mask: {s} x {t:,}^2 x {eb} B each", "a shorter prompt"),
    )  # fmt: skip
