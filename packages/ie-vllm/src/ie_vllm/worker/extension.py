"""The worker extension: mixed into vLLM's worker through `worker_extension_cls`.

The host calls these methods by name with `collective_rpc("ie_...", args=...)`; they run in the
worker process between forwards. `ie_setup` wraps the model runner's `_model_forward` so the batch
layout is recorded just before each forward, and a request new to the worker registers the spec it
carries in its extra_args there (no RPC). Registration, refusal, collect, drain and release are
`lifecycle.Lifecycle`'s, shared with ie-static's worker; `Hooks` is what this worker does there
(forward hooks on modules). `runner_adapter` (shared too) is the only code that reads vLLM's
runner. Hooks read the layout to slice rows per request.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

import torch
from ie_core.ops import SteeringOp
from ie_core.ops.apply import apply_ops
from ie_core.ops.conditional import judge, with_judged
from ie_core.reduce import LensTopK
from ie_core.steer_scope import scoped

from ie_vllm import payload
from ie_vllm.row_budget import device_budget
from ie_vllm.specs import ReducerSpec, RequestSpec
from ie_vllm.worker import reducers, weights
from ie_vllm.worker.captures import capture_sites, gather_captures
from ie_vllm.worker.conditions import Held, held_for, judges_of
from ie_vllm.worker.held_memory import held_memory
from ie_vllm.worker.layout import BatchLayout, RequestRows
from ie_vllm.worker.lens_worker import LensWorkerMixin
from ie_vllm.worker.lifecycle import Lifecycle
from ie_vllm.worker.point_table import PointTable, SiteDef
from ie_vllm.worker.registry import Entry, Judge, Registry
from ie_vllm.worker.runner_adapter import (
    ensure_stage_buffer,
    loaded_model,
    model_device,
    parallel_sizes,
    runner_name,
    tp_rank,
    wrap_model_forward,
)
from ie_vllm.worker.stage import layer_range, stage_of
from ie_vllm.worker.transfer import to_device


@dataclass(frozen=True)
class PlanItem:
    """What one site does for one request in the current forward."""

    rows: RequestRows
    entry: Entry
    steps: tuple[tuple[tuple[SteeringOp, ...], frozenset[int]], ...]  # (ops, masked), in order
    capture: bool
    reducers: tuple[ReducerSpec, ...] = ()
    judges: tuple[Judge, ...] = ()


@dataclass
class WorkerState:
    table: PointTable
    registry: Registry = field(default_factory=Registry)
    counts: dict[str, int] = field(default_factory=dict)
    handles: dict[str, list[Any]] = field(default_factory=dict)
    layout: BatchLayout | None = None
    plan: dict[str, list[PlanItem]] | None = None
    capture_rank: bool = True  # only one tensor-parallel rank keeps copies
    forwards: int = 0
    # (key, site, step, op index) -> where a condition held, judged earlier in this forward.
    held: Held = field(default_factory=dict)


class IEWorkerExtension(LensWorkerMixin):
    """Methods vLLM mixes into its worker class; `self` is the worker (`self.model_runner`)."""

    _ie: WorkerState
    _ie_life: Lifecycle[Entry]

    # --- setup -----------------------------------------------------------------------------

    def ie_setup(self, hooked: bool = True) -> dict[str, Any]:
        """Resolve points on the loaded model and (hooked) wrap the runner's forward."""
        runner = self.model_runner  # type: ignore[attr-defined]
        if getattr(self, "_ie", None) is not None:  # a second front-end (API server) asks again
            return dict(self._ie_info)  # type: ignore[attr-defined]
        loaded = loaded_model(runner)  # ie-static's worker resolved it at load: the same table
        table, text_config = loaded.table, loaded.text_config
        stage = stage_of()  # `loaded_model` kept this stage's sites only
        ensure_stage_buffer(runner)
        budget = device_budget(model_device(runner))  # rows held on the device, bounded
        state = WorkerState(table, Registry(budget), capture_rank=tp_rank() == 0)
        life = Lifecycle(Hooks(state), state.registry, state.capture_rank)
        self._ie, self._ie_life = state, life
        if hooked:
            wrap_model_forward(
                runner, lambda original: _forward_with_layout(runner, state, life, original)
            )
        tp_size, pp_size = parallel_sizes(runner)
        info = table.info().with_fields(
            vocab_size=int(getattr(text_config, "vocab_size", 0) or 0),
            architecture=loaded.architecture,
            tp_size=tp_size,
            pp_size=pp_size,
            model_runner=runner_name(runner),
        )
        final = table.sites.get("final_norm")
        if final is not None:  # the last pipeline stage: terminal reducers run here
            reducers.use_lens(lambda h: _lens(runner, final, h))
        wire = info.to_wire()  # plain data: vLLM's RPC serializer takes no dataclass
        wire["stage"] = {"rank": stage.rank, "layers": layer_range(table)}  # for merge_infos
        self._ie_info = wire
        return dict(wire)

    # --- requests ----------------------------------------------------------------------------

    def ie_collect(
        self, key: str, start: int = 0, stop: int | None = None, release: bool = True
    ) -> dict[str, Any]:
        """Rows for positions [start, stop) of every captured address, as one payload."""
        return self._ie_life.collect(key, start, stop, release)

    def ie_drain(self, asks: list[list[Any]]) -> dict[str, Any]:
        """The host's collects of one step, coalesced (`Lifecycle.drain`)."""
        return self._ie_life.drain(asks)

    def ie_release(self, keys: list[str]) -> int:
        return self._ie_life.release(keys)

    def ie_put_dictionary(self, key: str, tensors: dict[str, Any], meta: dict[str, Any]) -> str:
        """Keep a dictionary (by content key) for requests whose reducers name it."""
        device = model_device(self.model_runner)  # type: ignore[attr-defined]
        reducers.put_dictionary(key, payload.decode(tensors), meta, device)
        return key

    def ie_row_limit(self) -> int | None:
        """Bytes of captured rows this worker holds on its device (`ie_vllm.row_budget`); None:
        unbounded."""
        budget = self._ie.registry.budget
        return budget.limit if budget is not None else None

    def ie_stats(self) -> dict[str, Any]:
        state = self._ie
        return {
            "registered": len(state.registry.entries),
            "keys": sorted(state.registry.entries),
            "hooks": {k: v for k, v in state.counts.items() if v},
            "forwards": state.forwards,
        }

    def ie_memory(self) -> dict[str, int]:
        """Weights and KV cache bytes as vLLM allocated them (`held_memory`)."""
        return held_memory(self.model_runner)  # type: ignore[attr-defined]

    def ie_weights(self, part: str) -> dict[str, Any]:
        """Raw weights of `part` on this rank (`ie_vllm.worker.weights`), tensors as a payload."""
        got = weights.weight_parts(loaded_model(self.model_runner).model, part)  # type: ignore[attr-defined]
        return {**got, "tensors": payload.encode(got["tensors"])}

    # --- lens --------------------------------------------------------------------------------

    def ie_lens_topk(self, rows: dict[str, Any], k: int) -> dict[str, Any]:
        """Final norm, compute_logits (scale, softcap), fp32 logsumexp, top-k: `[rows, k]` back."""
        logits = self._ie_logits(rows)
        if logits is None:
            return payload.encode({})
        return payload.encode(LensTopK(k).of_logits(logits))

    def ie_decode(self, rows: dict[str, Any]) -> dict[str, Any]:
        logits = self._ie_logits(rows)
        return payload.encode({} if logits is None else {"logits": logits})

    def _ie_rows(self, entry: Entry, start: int, stop: int | None) -> dict[str, torch.Tensor]:
        """Rows of `entry` for positions [start, stop) (the lens mixin reads through this)."""
        return self._ie_life.sites.gather(entry, start, stop)

    def _ie_logits(self, rows: dict[str, Any]) -> torch.Tensor | None:
        site = self._ie.table.sites.get("final_norm")
        if site is None:
            return None  # not the last pipeline stage
        return _lens(self.model_runner, site, payload.decode(rows)["rows"])  # type: ignore[attr-defined]


def _lens(runner: Any, site: SiteDef, h: torch.Tensor) -> torch.Tensor:
    """Logits of residual rows `h` through the final norm (`site`) and vLLM's `compute_logits`
    (the family's scale and softcap)."""
    model = loaded_model(runner).model
    param = next(model.parameters())
    with torch.inference_mode():
        normed = site.module(h.to(device=param.device, dtype=param.dtype))
        normed = normed[0] if isinstance(normed, tuple) else normed
        return model.compute_logits(normed)


# --- forward wrapper and plan ----------------------------------------------------------------


def _forward_with_layout(
    runner: Any, state: WorkerState, life: Lifecycle[Entry], original: Any
) -> Any:
    def forward_with_layout(*args: Any, **kwargs: Any) -> Any:
        layout = life.arrive(runner)
        if state.registry.entries:
            state.layout = layout
            state.plan = _plan(state, layout)
        try:
            return original(*args, **kwargs)
        finally:
            state.layout = None
            state.plan = None
            state.held.clear()
            state.forwards += 1

    return forward_with_layout


class Hooks:
    """Hooked vLLM's `lifecycle.Sites`: a request's sites are forward hooks on the model's
    modules, installed while some registered request needs them."""

    def __init__(self, state: WorkerState) -> None:
        self.state = state

    def install(self, spec: RequestSpec, req_id: str) -> Entry:
        """Resolve a spec's addresses to this worker's sites and install the hooks it needs."""
        table = self.state.table
        captured = frozenset(
            site
            for a in spec.captures
            for s in capture_sites(a)
            if (site := table.addresses.get(s, s)) in table.sites
        )
        steer: dict[str, tuple[tuple[tuple[SteeringOp, ...], frozenset[int]], ...]] = {}
        for s in spec.steering:
            site = table.addresses.get(s.address)
            if site is None:
                continue  # another pipeline stage owns it
            steer[site] = (*steer.get(site, ()), (s.ops, scoped(s.masked, s.until)))
        reduce: dict[str, tuple[ReducerSpec, ...]] = {}
        for r in spec.reducers:
            site = table.addresses.get(r.address)
            if site is not None:
                reduce[site] = (*reduce.get(site, ()), reducers.kept(r))
        entry = Entry(
            spec, captured, steer, reduce_sites=reduce, judge_sites=judges_of(table, spec)
        )
        _acquire(self.state, entry.sites())
        return entry

    def uninstall(self, entry: Entry) -> None:
        _release(self.state, entry.sites())

    def gather(self, entry: Entry, start: int, stop: int | None) -> dict[str, torch.Tensor]:
        table = self.state.table

        def sites_of(address: str) -> tuple[str, ...]:
            return tuple(table.addresses.get(s, s) for s in capture_sites(address))

        return gather_captures(entry.spec, entry.rows, sites_of, table.attn, start, stop)


def _plan(state: WorkerState, layout: BatchLayout) -> dict[str, list[PlanItem]]:
    plan: dict[str, list[PlanItem]] = {}
    for rows, entry in state.registry.in_batch(layout):
        for site in entry.sites():
            steps = entry.steer_sites.get(site, ())
            capture = state.capture_rank and site in entry.capture_sites
            reduce = entry.reduce_sites.get(site, ()) if state.capture_rank else ()
            judges = entry.judge_sites.get(site, ())
            plan.setdefault(site, []).append(PlanItem(rows, entry, steps, capture, reduce, judges))
    return plan


# --- hooks -------------------------------------------------------------------------------------


def _apply(state: WorkerState, site: SiteDef, h: torch.Tensor) -> torch.Tensor | None:
    """Steer then capture the rows of every planned request; returns the new tensor if steered."""
    items = state.plan.get(site.name) if state.plan else None
    if not items:
        return None
    new: torch.Tensor | None = None
    for it in items:
        if not it.steps:
            continue
        r = it.rows
        if new is None:
            new = h.clone()
        # Built on the device: a host tensor copied from pageable memory would wait for the stream.
        positions = torch.arange(r.first_pos, r.first_pos + r.n, device=h.device)
        for step, (ops, masked) in enumerate(it.steps):
            held = held_for(state.held, state.registry, it.entry, site.name, step)
            if held is None:
                break  # refused: nothing of this request is written at this site
            mask = _keep_mask(masked, r, h.device) if masked else None
            ops = with_judged(ops, held)
            new[r.start : r.end] = apply_ops(new[r.start : r.end], ops, mask, positions)
    src = h if new is None else new
    for it in items:
        for jd in it.judges:
            rows = src[it.rows.start : it.rows.end]
            state.held[(it.entry.spec.key, jd.site, jd.step, jd.op_index)] = judge(jd.op, rows)
    for it in items:
        if it.capture:
            r = it.rows
            state.registry.keep(it.entry, site.name, r.first_pos, src[r.start : r.end].clone())
    jobs = [
        (red, it, picked)
        for it in items
        for red in it.reducers
        if (picked := reducers.rows_for(red, it.rows, src)) is not None
    ]
    if jobs:
        got = reducers.run([(red, picked) for red, _, picked in jobs])
        for (red, it, (first, _)), out in zip(jobs, got, strict=True):
            state.registry.keep_reduced(it.entry, red.label, first, out)
    return new


def _keep_mask(masked: frozenset[int], r: RequestRows, device: torch.device) -> torch.Tensor | None:
    """Bool per row of `r`, False where its position is masked; None where no row is (every
    decode step past the prompt), which steers each row exactly as an all-True mask would. The
    mask is built on the host and copied without blocking (`transfer.to_device`)."""
    keep = [p not in masked for p in range(r.first_pos, r.first_pos + r.n)]
    if all(keep):
        return None
    return to_device(torch.tensor(keep, dtype=torch.bool), device)


def _make_hook(state: WorkerState, site: SiteDef) -> Any:
    # A site that writes runs before the read-only sites on its module (the attention maps'
    # q / k reads beside a k_rot write), whatever order requests acquired them in.
    first = site.write is not None
    if site.hook == "pre":

        def pre(_module: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
            if not state.plan or site.name not in state.plan:
                return None
            new = _apply(state, site, site.read(args, kwargs, None))
            if new is None or site.write is None:
                return None
            return site.write(args, kwargs, None, new)

        return site.module.register_forward_pre_hook(pre, with_kwargs=True, prepend=first)

    def post(_module: Any, args: tuple[Any, ...], kwargs: dict[str, Any], output: Any) -> Any:
        if not state.plan or site.name not in state.plan:
            return None
        new = _apply(state, site, site.read(args, kwargs, output))
        if new is None or site.write is None:
            return None
        return site.write(args, kwargs, output, new)

    return site.module.register_forward_hook(post, with_kwargs=True, prepend=first)


def _acquire(state: WorkerState, sites: Iterable[str]) -> None:
    for name in sites:
        state.counts[name] = state.counts.get(name, 0) + 1
        if state.counts[name] == 1:
            site = state.table.sites[name]
            companions = [m.register_forward_hook(hook) for m, hook in site.companions]
            state.handles[name] = [*companions, _make_hook(state, site)]


def _release(state: WorkerState, sites: Iterable[str]) -> None:
    for name in sites:
        state.counts[name] -= 1
        if state.counts[name] == 0:
            for handle in state.handles.pop(name, []):
                handle.remove()
