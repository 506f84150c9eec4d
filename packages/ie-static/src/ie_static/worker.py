"""Worker side of vllm-static: install taps right after the weights load, then per step fill the
row table before the forward and harvest the read buffers after it.

`StaticWorkerMixin` goes in front of vLLM's worker class (`worker_cpu` / `worker_gpu` build the
concrete classes named by `worker_cls`), so its `load_model` runs before vLLM compiles the model
or captures graphs. ie-vllm's worker extension is mixed in as usual for `ie_setup` and the lens.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, TypeVar

import numpy as np
import torch
from ie_core.grammar import to_address
from ie_core.ops import SteeringOp
from ie_core.wire import SLOT_XARG
from ie_vllm import (
    BatchLayout,
    Keys,
    Landing,
    Lifecycle,
    PointTable,
    ReducerSpec,
    RequestSpec,
    Rows,
    buffer_rows,
    carried,
    gather_captures,
    layer_range,
    loaded_model,
    positions_buffer,
    reducers,
    stage_of,
    store_reduced,
    to_device,
    to_host,
    tp_rank,
    wrap_model_forward,
)

from ie_static import ops
from ie_static.config import CONFIG_KEY, StaticConfig
from ie_static.sites import SitePlan, plan_sites
from ie_static.tables import TableShape, WriteTable
from ie_static.taps import ModelTaps, Site, StepInputs, install

T = TypeVar("T")


@dataclass
class StaticEntry:
    """A registered request: its slot (-1 = unsteered), what it captures, its rows per site."""

    spec: RequestSpec
    slot: int
    captures: tuple[str, ...]  # addresses
    sites: frozenset[str]  # the read sites those addresses need
    write_sites: tuple[str, ...]
    rows: dict[str, Rows] = field(default_factory=dict)  # site name -> rows
    # Per read site, the reducers reading it (run on the tap buffer, results kept in `rows`).
    reduce_sites: dict[str, tuple[ReducerSpec, ...]] = field(default_factory=dict)


@dataclass
class StaticState:
    config: StaticConfig
    taps: ModelTaps
    shape: TableShape
    rows: int
    table: PointTable
    plan: SitePlan
    keys: Keys[StaticEntry] = field(default_factory=Keys)
    steered_last_step: bool = False
    forwards: int = 0
    capture_rank: bool = True
    held: Callable[[str], bool] = lambda address: True  # this pipeline stage's addresses
    # After the harvest's non-blocking copies to the host (CUDA): waited on once per collect.
    landing: Landing = field(default_factory=Landing)
    # Cumulative host seconds per part of a step (see `ie_static_stats`): the profile's source.
    seconds: dict[str, float] = field(
        default_factory=lambda: dict.fromkeys(("set_rows", "forward", "harvest", "collect"), 0.0)
    )
    life: Lifecycle[StaticEntry] = field(init=False)  # over `keys` and this state's `Slots`


class StaticWorkerMixin:
    """Put before vLLM's worker class; `self` is the worker."""

    _ie_static: StaticState

    def load_model(self, *args: Any, **kwargs: Any) -> None:
        super().load_model(*args, **kwargs)  # type: ignore[misc]
        config = StaticConfig.from_dict(self.vllm_config.additional_config[CONFIG_KEY])  # type: ignore[attr-defined]
        self._ie_static = _install(self.model_runner, self.vllm_config, config)  # type: ignore[attr-defined]

    # --- rpc (called by name from the host) -------------------------------------------------

    def ie_static_setup(self) -> dict[str, Any]:
        state = self._ie_static
        reads = state.taps.read_sites()
        writes = state.taps.write_sites()
        buf_bytes = sum(s.buf.numel() * s.buf.element_size() for s in reads.values())  # type: ignore[union-attr]
        table_bytes = sum(s.table.nbytes() for s in writes.values())  # type: ignore[union-attr]
        step = state.taps.step
        return {  # TapInfo's wire form (plain data crosses vLLM's RPC)
            "reads": list(state.plan.reads),
            "writes": list(state.plan.writes),
            "refused": dict(state.plan.refused),
            "read_sites": len(reads),
            "rows": state.rows,
            "buffer_bytes": buf_bytes,
            "table_bytes": table_bytes + step.masks.numel() + step.row_slot.numel() * 4,
            "slots": state.shape.slots,
            "ops": state.shape.ops,
            "masks": state.shape.masks,
            "positions": state.shape.positions,
            "device": str(step.row_slot.device),
            "stage": stage_of().rank,  # for merge_taps: tensor ranks repeat their stage's report
        }

    def ie_static_collect(
        self, key: str, start: int = 0, stop: int | None = None, release: bool = True
    ) -> dict[str, Any]:
        state = self._ie_static
        return _landed(state, lambda: state.life.collect(key, start, stop, release))

    def ie_static_drain(self, asks: list[list[Any]]) -> dict[str, Any]:
        """The host's collects of one step, coalesced (`Lifecycle.drain`)."""
        state = self._ie_static
        return _landed(state, lambda: state.life.drain(asks))

    def ie_static_release(self, keys: list[str]) -> int:
        return self._ie_static.life.release(keys)

    def ie_static_stats(self) -> dict[str, Any]:
        state = self._ie_static
        return {"registered": len(state.keys.entries), "forwards": state.forwards, **state.seconds}


# --- install -----------------------------------------------------------------------------------


def _install(runner: Any, vllm_config: Any, config: StaticConfig) -> StaticState:
    loaded = loaded_model(runner)  # resolved once: the extension's `ie_setup` reuses it
    table, architecture = loaded.table, loaded.architecture
    param = next(loaded.model.parameters())
    device, dtype = param.device, param.dtype
    rows = buffer_rows(vllm_config)
    shape = TableShape(
        slots=config.slots,
        ops=config.ops,
        masks=config.masks,
        positions=int(vllm_config.model_config.max_model_len),
        patch_rows=config.patch_rows,
    )
    step = StepInputs(
        positions=positions_buffer(runner),
        row_slot=torch.full((rows,), -1, dtype=torch.int32, device=device),
        masks=torch.zeros(
            shape.slots, shape.masks, shape.positions, dtype=torch.bool, device=device
        ),
    )
    held = on_this_stage(table)
    plan = plan_sites(
        table,
        [a for a in config.reads if held(a)],
        [a for a in config.writes if held(a)],
        architecture,
    )
    read_names, write_names = set(plan.read_site_names()), set(plan.write_site_names())
    sites = []
    for name in dict.fromkeys((*plan.read_site_names(), *plan.write_site_names())):
        where = table.sites[name]
        buf = None
        if name in read_names:
            buf = torch.zeros(rows, where.width, dtype=dtype, device=device)
        wt = WriteTable.empty(shape, where.width, device) if name in write_names else None
        sites.append(Site(name, where, step, buf, wt))
    taps = install(sites, step)
    state = StaticState(
        config, taps, shape, rows, table, plan, capture_rank=tp_rank() == 0, held=held
    )
    state.life = Lifecycle(Slots(runner, state), state.keys, state.capture_rank)
    wrap_model_forward(runner, lambda original: _forward_with_taps(runner, state, original))
    return state


# --- registration ------------------------------------------------------------------------------


def on_this_stage(table: PointTable) -> Callable[[str], bool]:
    """Whether an address is this pipeline stage's to plan: its layer is one this stage holds
    (a layerless one, embeddings or final norm, every stage plans; where it does not run it is
    refused and `merge_taps` keeps the stage that tapped it). Always true without stages."""
    span = layer_range(table)
    if stage_of().size == 1 or span is None:
        return lambda address: True
    lo, hi = span

    def held(address: str) -> bool:
        layer = to_address(address).layer
        return layer is None or lo <= layer < hi

    return held


class Slots:
    """vllm-static's `Sites` (`ie_vllm.Lifecycle`): a steered request fills a slot of the compiled
    write tables (its slot number carried beside its spec); its reads are the taps' buffers,
    harvested after each step."""

    def __init__(self, runner: Any, state: StaticState) -> None:
        self.runner, self.state = runner, state

    def install(self, spec: RequestSpec, req_id: str) -> StaticEntry:
        """Fill the request's slot (steered) and note the read sites and reducers it needs."""
        state = self.state
        slot = int(carried(self.runner, req_id, SLOT_XARG) or -1)
        writes = _fill_slot(state, spec, slot) if spec.steering else ()
        sites = frozenset(s for a in spec.captures for s in state.plan.reads.get(a, ()))
        entry = StaticEntry(spec, slot, spec.captures, sites, writes)
        for r in spec.reducers:
            for name in state.plan.reads.get(r.address, ())[:1]:
                entry.reduce_sites[name] = (*entry.reduce_sites.get(name, ()), reducers.kept(r))
        return entry

    def uninstall(self, entry: StaticEntry) -> None:
        if entry.slot < 0:
            return
        sites = self.state.taps.write_sites()
        for address in entry.write_sites:
            sites[address].table.clear(entry.slot)  # type: ignore[union-attr]
        self.state.taps.step.masks[entry.slot] = False

    def gather(self, entry: StaticEntry, start: int, stop: int | None) -> dict[str, torch.Tensor]:
        """Rows of each captured address; attention maps recomputed from the tapped q and k."""
        reads = self.state.plan.reads

        def sites_of(address: str) -> tuple[str, ...]:
            return tuple(reads.get(address, ()))

        return gather_captures(entry.spec, entry.rows, sites_of, self.state.table.attn, start, stop)


def _fill_slot(state: StaticState, spec: RequestSpec, slot: int) -> tuple[str, ...]:
    """Write the request's ops into its slot at every write site, masks into its mask rows.
    Under pipeline parallelism each stage fills the sites it holds (another's are skipped)."""
    if not 0 <= slot < state.shape.slots:
        raise ValueError(f"slot {slot} is outside 0..{state.shape.slots - 1}")
    masks: list[frozenset[int]] = []
    per_site: dict[str, list[tuple[SteeringOp, int]]] = {}
    for s in spec.steering:
        masked = frozenset(p for p in s.masked if p < spec.prompt_len)
        mask_index = -1
        if masked:
            if masked not in masks:
                masks.append(masked)
            mask_index = masks.index(masked)
        site = state.plan.writes.get(s.address)
        if site is None and not state.held(s.address):
            continue
        if site is None:
            raise ValueError(f"{s.address} is not a write site of this engine")
        per_site.setdefault(site, []).extend((op, mask_index) for op in s.ops)
    if len(masks) > state.shape.masks:
        raise ValueError(
            f"{len(masks)} distinct position masks exceed the engine's {state.shape.masks}"
        )
    step = state.taps.step
    step.masks[slot] = False
    for q, masked in enumerate(masks):
        positions = [p for p in masked if p < state.shape.positions]
        index = to_device(torch.tensor(positions, dtype=torch.long), step.masks.device)
        step.masks[slot, q, index] = True
    sites = state.taps.write_sites()
    for address, ops_here in per_site.items():
        sites[address].table.fill(slot, ops_here)  # type: ignore[union-attr]
    return tuple(per_site)


# --- per step ----------------------------------------------------------------------------------


def _forward_with_taps(runner: Any, state: StaticState, original: Any) -> Any:
    def forward_with_taps(*args: Any, **kwargs: Any) -> Any:
        seconds = state.seconds
        t0 = time.perf_counter()
        layout = state.life.arrive(runner)
        if not state.keys.entries:
            layout = None
        _set_rows(state, layout)
        t1 = time.perf_counter()
        out = original(*args, **kwargs)
        t2 = time.perf_counter()
        state.forwards += 1
        if layout is not None:
            _harvest(state, layout)
        seconds["set_rows"] += t1 - t0
        seconds["forward"] += t2 - t1
        seconds["harvest"] += time.perf_counter() - t2
        return out

    return forward_with_taps


def _set_rows(state: StaticState, layout: BatchLayout | None) -> None:
    """Fill the row -> slot table for this step (left alone while nothing is steered), and tell
    the read taps whether any row of this step is captured (they skip their copy when none is)."""
    steered = []
    captured = False
    if layout is not None:
        for r, entry in state.keys.in_batch(layout):
            captured = captured or bool(entry.sites) or bool(entry.reduce_sites)
            if entry.slot >= 0:
                steered.append((r.start, r.end, entry.slot))
    ops.STEP.any_steered = bool(steered)
    ops.STEP.any_captured = captured
    if not steered and not state.steered_last_step:
        return
    row_slot = state.taps.step.row_slot
    host = np.full(row_slot.shape[0], -1, dtype=np.int32)
    for start, end, slot in steered:
        host[start:end] = slot
    if row_slot.is_cuda:  # from pinned memory, without waiting for the stream
        row_slot.copy_(torch.from_numpy(host).pin_memory(), non_blocking=True)
    else:
        row_slot.copy_(torch.from_numpy(host))
    state.steered_last_step = bool(steered)


def _harvest(state: StaticState, layout: BatchLayout) -> None:
    """Copy each needed buffer's rows once, then hand each request its slice. On CUDA the copies
    go to pinned memory without blocking; `state.landing` marks where they have all landed."""
    if not state.capture_rank:
        return
    wanted: dict[str, list[tuple[Any, StaticEntry]]] = {}
    jobs: dict[str, list[tuple[Any, StaticEntry, ReducerSpec]]] = {}
    for r, entry in state.keys.in_batch(layout):
        for name in entry.sites:
            wanted.setdefault(name, []).append((r, entry))
        for name, specs in entry.reduce_sites.items():
            jobs.setdefault(name, []).extend((r, entry, spec) for spec in specs)
    reads = state.taps.read_sites()
    n = layout.num_tokens
    for name, items in jobs.items():
        _reduce_site(reads[name].buf, items)  # type: ignore[arg-type]
    for name, items in wanted.items():
        buf = reads[name].buf
        host = to_host(buf[:n])  # type: ignore[index]
        for r, entry in items:
            entry.rows.setdefault(name, Rows()).add(r.first_pos, host[r.start : r.end])
    if jobs or wanted:
        state.landing.record(state.taps.step.row_slot.device)


def _reduce_site(buf: torch.Tensor, items: list[tuple[Any, StaticEntry, ReducerSpec]]) -> None:
    """Run the reducers on the tap buffer where it lives; only their results move to the host."""
    jobs = [
        (entry, spec, picked)
        for r, entry, spec in items
        if (picked := reducers.rows_for(spec, r, buf)) is not None
    ]
    got = reducers.run([(spec, picked) for _, spec, picked in jobs])
    for (entry, spec, (first, _)), out in zip(jobs, got, strict=True):
        host = {k: to_host(v, copy=False) for k, v in out.items()}
        store_reduced(entry.rows, spec.label, first, host)


def _landed(state: StaticState, call: Callable[[], T]) -> T:
    """`call`'s answer once the harvest's copies have landed on the host (one wait), its time
    counted as the collect's (`ie_static_stats`)."""
    t0 = time.perf_counter()
    state.landing.wait()
    try:
        return call()
    finally:
        state.seconds["collect"] += time.perf_counter() - t0
