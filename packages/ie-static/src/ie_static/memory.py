"""The tap buffers' size, computed before the engine starts, and the batch size that fits a budget."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from ie_core.grammar import Width, get_point

from ie_static.tables import TableShape, table_bytes

MIN_ROWS = 256  # below this a step cannot hold a useful batch; refuse instead
GIB = 2**30


@dataclass(frozen=True)
class BufferPlan:
    """Rows per buffer and the bytes they take: reads `rows x width x dtype`, writes fixed tables."""

    rows: int
    read_bytes: int
    table_bytes: int

    @property
    def total(self) -> int:
        return self.read_bytes + self.table_bytes


class BufferBudgetError(MemoryError):
    """The declared taps do not fit the memory budget; the message has the numbers."""


def _mib(n: float) -> str:
    return f"{n / 2**20:.1f} MiB"


def _cfg(config: Any, *names: str) -> int:
    for name in names:
        value = getattr(config, name, None)
        if value:
            return int(value)
    return 0


def estimated_width(name: str, config: Any) -> int:
    """Row width of a point's read buffers on this HF text config, before the model loads.

    Attention maps are recomputed from tapped q and k, so they need both of those buffers.
    """
    d = _cfg(config, "hidden_size", "n_embd")
    heads = _cfg(config, "num_attention_heads", "n_head") or 1
    head_dim = _cfg(config, "head_dim") or d // heads
    kv = (_cfg(config, "num_key_value_heads") or heads) * head_dim
    widths = {
        Width.D: d,
        Width.H: heads * head_dim,
        Width.KV: kv,
        Width.N: _cfg(config, "intermediate_size", "n_inner") or 4 * d,
        Width.E: _cfg(config, "num_local_experts", "num_experts", "n_routed_experts"),
        Width.HQK: heads * head_dim + kv,
    }
    return widths.get(get_point(name).width, d)


def plan_buffers(
    *,
    read_widths: Sequence[int],
    write_widths: Sequence[int],
    dtype_bytes: int,
    shape: TableShape,
    budget_bytes: int,
    requested_rows: int | None,
    default_rows: int,
) -> BufferPlan:
    """Fit `max_num_batched_tokens` to the budget, or refuse with the numbers.

    A requested row count is kept or refused; otherwise the default shrinks to what fits.
    """
    n_reads = len(read_widths)
    per_row = sum(read_widths) * dtype_bytes
    tables = sum(table_bytes(shape, w) for w in write_widths)
    tables += shape.slots * shape.masks * shape.positions
    room = budget_bytes - tables
    fit = room // per_row if per_row else default_rows
    if requested_rows is not None:
        need = tables + requested_rows * per_row
        if need > budget_bytes:
            raise BufferBudgetError(
                f"vllm-static buffers need {_mib(need)} ({n_reads} read sites x {requested_rows} "
                f"rows, {_mib(per_row)} per row, + {_mib(tables)} of steering tables) but the "
                f"budget is {_mib(budget_bytes)}; lower max_num_batched_tokens to {max(fit, 0)} "
                "or less, declare fewer static_points, or raise static_buffer_gib"
            )
        rows = requested_rows
    else:
        rows = min(default_rows, fit)
        if rows < MIN_ROWS:
            raise BufferBudgetError(
                f"vllm-static buffers for {n_reads} read sites fit only {max(fit, 0)} "
                f"rows in {_mib(budget_bytes)} ({_mib(per_row)} per row, {_mib(tables)} of tables), "
                f"fewer than the {MIN_ROWS} a step needs; declare fewer static_points or raise "
                "static_buffer_gib"
            )
    return BufferPlan(rows=rows, read_bytes=rows * per_row, table_bytes=tables)


def static_memory(shape: Any, work: Any) -> tuple[Any, ...]:
    """`ie fit`'s items for vllm-static (`BackendPlugin.memory`): vLLM's KV floor and graph pool,
    and the tap buffers and write tables `plan_launch` would allocate with its defaults."""
    from types import SimpleNamespace

    from ie_core.fit import Item
    from ie_core.grammar import family_for_architecture, to_address
    from ie_vllm.memory_prices import graph_pool_item, kv_item

    from ie_static.config import StaticConfig
    from ie_static.declared import declared_sets
    from ie_static.launch import DEFAULT_BUFFER_GIB, DEFAULT_ROWS_CPU, DEFAULT_ROWS_GPU
    from ie_static.tables import TableShape

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
