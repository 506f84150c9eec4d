"""`ie fit`'s prices for vllm-static (`BackendPlugin.memory`): vLLM's KV floor and graph pool,
and the tap buffers and write tables `plan_launch` would allocate with its defaults."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

from ie_core.fit import Item
from ie_core.grammar import family_for_architecture, to_address
from ie_vllm import graph_pool_item, kv_item

from ie_static.config import StaticConfig
from ie_static.declared import declared_sets
from ie_static.launch import DEFAULT_BUFFER_GIB, DEFAULT_ROWS_CPU, DEFAULT_ROWS_GPU
from ie_static.memory import (
    GIB,
    MIN_ROWS,
    BufferBudgetError,
    estimated_width,
    plan_buffers,
)
from ie_static.tables import TableShape

__all__ = ["static_memory"]


def static_memory(shape: Any, work: Any) -> tuple[Any, ...]:
    """`ie fit`'s items for vllm-static (`BackendPlugin.memory`): vLLM's KV floor and graph pool,
    and the tap buffers and write tables `plan_launch` would allocate with its defaults."""
    config = SimpleNamespace(
        hidden_size=shape.d_model, num_attention_heads=shape.n_heads, head_dim=shape.head_dim,
        num_key_value_heads=shape.n_kv_heads, intermediate_size=shape.d_mlp,
        num_local_experts=shape.n_experts,
    )  # fmt: skip
    family = family_for_architecture(shape.architecture)
    declared = declared_sets(
        list(work.addresses) or "auto", list(work.static_writes) or "auto", shape.n_layers, family
    )
    defaults = StaticConfig(declared.reads, declared.writes)
    table = TableShape(
        defaults.slots, defaults.ops, defaults.masks, work.tokens, defaults.patch_rows
    )
    default_rows = DEFAULT_ROWS_CPU if work.device == "cpu" else DEFAULT_ROWS_GPU
    widths = [estimated_width(to_address(a).name, config) for a in declared.reads]
    writes = [estimated_width(to_address(a).name, config) for a in declared.writes]
    try:
        plan = plan_buffers(
            read_widths=widths, write_widths=writes, dtype_bytes=work.element_bytes,
            shape=table, budget_bytes=int(DEFAULT_BUFFER_GIB * GIB), requested_rows=None,
            default_rows=default_rows,
        )  # fmt: skip
        nbytes, note = plan.total, f"{plan.rows:,} rows per step"
    except BufferBudgetError as exc:
        plan = plan_buffers(
            read_widths=widths, write_widths=writes, dtype_bytes=work.element_bytes,
            shape=table, budget_bytes=2**62, requested_rows=MIN_ROWS, default_rows=MIN_ROWS,
        )  # fmt: skip
        nbytes, note = plan.total, f"at the {MIN_ROWS}-row minimum; at start: {exc}"
    note = f"{len(declared.reads)} read / {len(declared.writes)} write sites, {note}"
    return (
        kv_item(shape, work),
        graph_pool_item(work),
        Item("tap buffers and write tables", nbytes, note,
             "declare fewer static points or writes, or lower max_num_batched_tokens"),
    )  # fmt: skip
