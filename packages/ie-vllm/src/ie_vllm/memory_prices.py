"""What a vLLM engine holds beyond its weights, priced from the config for `ie fit`
(`BackendPlugin.memory`): the KV cache floor, the CUDA-graph pool and, on the hooked backend,
the captured rows a worker holds until the host drains them (`row_budget.capture_bytes`).

The floor is what vLLM refuses to start without: `streams` sequences of `max_model_len` tokens,
2 (K and V) x kv heads x head dim x dtype bytes per token and layer (grouped- and multi-query
attention store only the kv heads), a sliding-window layer at most its window. On a GPU vLLM
then fills what `gpu_memory_utilization` leaves with more blocks; on the CPU it takes
`VLLM_CPU_KVCACHE_SPACE` GiB when that is set.
"""

from __future__ import annotations

import os
from typing import Any

__all__ = ["graph_pool_item", "kv_bytes_per_token", "kv_item", "rows_item", "vllm_memory"]

KV_SPACE_ENV = "VLLM_CPU_KVCACHE_SPACE"


def kv_bytes_per_token(shape: Any, element_bytes: int, tokens: int) -> float:
    """KV bytes per token of a `tokens`-long sequence, over all layers (sliding layers hold at
    most their window)."""
    per_layer = 2 * shape.n_kv_heads * shape.head_dim * element_bytes
    full = shape.n_layers - shape.sliding_layers
    held = full * tokens + shape.sliding_layers * min(tokens, shape.sliding_window or tokens)
    return per_layer * held / tokens


def kv_item(shape: Any, work: Any) -> Any:
    from ie_core.fit import Item

    floor = int(kv_bytes_per_token(shape, work.element_bytes, work.tokens) * work.tokens)
    floor *= work.streams
    how = (
        f"{work.streams} x {work.tokens:,} tokens x 2 x {shape.n_kv_heads} kv heads x "
        f"{shape.head_dim} x {work.element_bytes} B x {shape.n_layers} layers"
    )
    if shape.sliding_layers:
        how += f" ({shape.sliding_layers} layers within a {shape.sliding_window:,}-token window)"
    remedy = "lower --max-model-len or --streams"
    space = os.environ.get(KV_SPACE_ENV, "").strip()
    if work.device == "cpu" and space:
        held = max(floor, int(float(space) * 2**30))
        note = f"{KV_SPACE_ENV}={space} GiB (the floor: {floor:,} B = {how})"
        return Item("KV cache", held, note, f"lower {KV_SPACE_ENV}; " + remedy)
    return Item("KV cache floor", floor, how, remedy)


def graph_pool_item(work: Any) -> Any:
    from ie_core.fit import Item

    if work.device == "cpu":
        return Item("CUDA graph pool", 0, "none: vLLM captures CUDA graphs on GPUs only")
    return Item(
        "CUDA graph pool", 0,
        "not priced: vLLM measures its graph pool when it starts; enforce_eager=True has none",
    )  # fmt: skip


def rows_item(shape: Any, work: Any) -> Any:
    """The hooked worker's captured rows for every position of every stream, held until a drain."""
    from ie_core.fit import Item
    from ie_core.grammar import Width, get_point, to_address

    if not work.addresses:  # nothing captured: no torch import for a plain price
        return Item("rows held until a drain", 0, "no captures asked (--points)")
    from ie_vllm.row_budget import capture_bytes

    widths = {a: shape.width(get_point(to_address(a).name).width) for a in work.addresses}
    rows = work.tokens * work.streams
    need = capture_bytes(widths, shape.d_model, work.addresses, rows, work.element_bytes)
    unpriced = [
        a for a in work.addresses
        if not widths[a] and get_point(to_address(a).name).width is not Width.HQK
    ]  # fmt: skip
    note = f"{len(work.addresses)} addresses x {rows:,} rows x {work.element_bytes} B"
    if unpriced:
        note += f" ({len(unpriced)} with no width in the config, e.g. {unpriced[0]}: not counted)"
    return Item("rows held until a drain", need, note, "capture fewer points or positions")


def vllm_memory(shape: Any, work: Any) -> tuple[Any, ...]:
    """The hooked backend's items."""
    return kv_item(shape, work), graph_pool_item(work), rows_item(shape, work)
