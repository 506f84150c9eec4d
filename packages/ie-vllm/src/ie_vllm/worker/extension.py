"""The worker extension: mixed into vLLM's worker through `worker_extension_cls`.

The host calls these methods by name with `collective_rpc("ie_...", args=...)`; they run in the
worker process between forwards. `ie_setup` wraps the model runner's `_model_forward` so the batch
layout is recorded just before each forward, and a request new to the worker registers the spec it
carries in its extra_args there (no RPC); `runner_adapter` (shared with ie-static's worker)
is the only code here that reads vLLM's runner. Hooks read the layout to slice rows per request.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

import torch
from ie_core.grammar import to_address
from ie_core.ops import SteeringOp
from ie_core.ops.apply import apply_ops
from ie_core.ops.conditional import judge, with_judged
from ie_core.reduce import LensTopK
from ie_core.steer_scope import scoped

from ie_vllm import payload
from ie_vllm.row_budget import device_budget
from ie_vllm.specs import ReducerSpec, RequestSpec
from ie_vllm.worker import reducers, weights
from ie_vllm.worker.conditions import Held, held_for, judges_of
from ie_vllm.worker.layout import BatchLayout, RequestRows
from ie_vllm.worker.lens_worker import LensWorkerMixin
from ie_vllm.worker.point_table import AttnGeom, PointTable, SiteDef
from ie_vllm.worker.registry import Entry, Judge, Registry, gather_reduced
from ie_vllm.worker.runner_adapter import (
    carried_arrivals,
    ensure_stage_buffer,
    loaded_model,
    model_device,
    parallel_sizes,
    record_layout,
    runner_name,
    tp_rank,
    wrap_model_forward,
)
from ie_vllm.worker.stage import layer_range, stage_of
from ie_vllm.worker.transfer import to_device

ATTN_POINTS = ("attn_scores", "attn_probs")


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


def capture_sites(address: str) -> tuple[str, ...]:
    """The hook sites an address needs (attention scores are recomputed from q and k)."""
    addr = to_address(address)
    if addr.name in ATTN_POINTS:
        return (f"attn_q.{addr.layer}", f"attn_k.{addr.layer}")
    return (address,)


def attention_rows(
    q: torch.Tensor, k: torch.Tensor, geom: AttnGeom, start: int, probs: bool
) -> torch.Tensor:
    """Scores (or probabilities) `[heads, q rows, k rows]` for queries at positions start.. of k.

    q: `[nq, heads*head_dim]` post-RoPE at positions start..start+nq-1; k: `[nk, kv*head_dim]`
    post-RoPE at positions 0..nk-1. Masked entries are the dtype's min, as in eager.
    """
    nq, nk = q.shape[0], k.shape[0]
    qh = q.reshape(nq, geom.heads, geom.head_dim).transpose(0, 1).float()
    kh = k.reshape(nk, geom.kv_heads, geom.head_dim).transpose(0, 1).float()
    kh = kh.repeat_interleave(geom.heads // geom.kv_heads, dim=0)
    scores = (qh @ kh.transpose(-1, -2)) * geom.scale
    if geom.softcap:
        scores = geom.softcap * torch.tanh(scores / geom.softcap)
    qpos = torch.arange(start, start + nq, device=q.device)[:, None]
    kpos = torch.arange(nk, device=q.device)[None, :]
    if geom.alibi:
        # BLOOM's scores carry slope * key position (HF's build_alibi_tensor).
        slopes = to_device(torch.tensor(geom.alibi, dtype=scores.dtype), q.device)
        scores = scores + slopes[:, None, None] * kpos.to(scores.dtype)
    visible = kpos <= qpos
    if geom.window:
        visible &= (qpos - kpos) < geom.window
    scores = scores.masked_fill(~visible, torch.finfo(scores.dtype).min)
    if probs and geom.sinks:
        # gpt-oss: each row's softmax includes the head's sink logit, which is then dropped
        # (rows need not sum to 1), as HF's eager_attention_forward does.
        sink = to_device(torch.tensor(geom.sinks, dtype=scores.dtype), q.device)
        sink = sink[:, None, None].expand(-1, nq, 1)
        return torch.softmax(torch.cat([scores, sink], dim=-1), dim=-1)[..., :-1].to(q.dtype)
    out = torch.softmax(scores, dim=-1) if probs else scores
    return out.to(q.dtype)


class IEWorkerExtension(LensWorkerMixin):
    """Methods vLLM mixes into its worker class; `self` is the worker (`self.model_runner`)."""

    _ie: WorkerState

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
        self._ie = state
        if hooked:
            wrap_model_forward(
                runner, lambda original: _forward_with_layout(runner, state, original)
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
        state = self._ie
        _check_refused(state, [key])
        entry = state.registry.get(key)
        if entry is None:
            return payload.encode({})
        out: dict[str, torch.Tensor] = {}
        if state.capture_rank:
            out = _gather(state, entry, start, stop)
        if release:
            _release_entry(state, key)
        return payload.encode(out)

    def ie_drain(self, asks: list[list[Any]]) -> dict[str, Any]:
        """Rows `[0, stop)` of each finished `[key, stop]` in one payload (`key/address` names,
        one copy to the host), each key released: the host's collects of one step, coalesced.
        `refused` names the keys whose carried spec this worker could not register, with why."""
        state = self._ie
        out: dict[str, torch.Tensor] = {}
        refused: dict[str, str] = {}
        for key, stop in asks:
            why = state.registry.refused.get(key)
            entry = state.registry.get(key)
            if why is not None:
                refused[key] = why
            elif entry is not None and state.capture_rank:
                got = _gather(state, entry, 0, int(stop))
                out.update((f"{key}/{name}", t) for name, t in got.items())
            _release_entry(state, key)
        return {"rows": payload.encode(out), "refused": refused}

    def ie_release(self, keys: list[str]) -> int:
        for key in keys:
            _release_entry(self._ie, key)
        return len(self._ie.registry.entries)

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
        return _gather(self._ie, entry, start, stop)

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


def _forward_with_layout(runner: Any, state: WorkerState, original: Any) -> Any:
    def forward_with_layout(*args: Any, **kwargs: Any) -> Any:
        layout = record_layout(runner)
        _register_carried(runner, state, layout)
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


def _register_carried(runner: Any, state: WorkerState, layout: BatchLayout) -> None:
    """Register the specs that requests new to this worker carry. A spec the worker cannot take
    is kept as refused (its collect raises with the reason); the forward goes on unhindered."""
    for key, _, text in carried_arrivals(runner, layout, state.registry.wants):
        try:
            _register(state, RequestSpec.from_json(text))
        except Exception as exc:  # raised in a forward, it would stop the engine
            state.registry.refused[key] = f"{type(exc).__name__}: {exc}"


def _register(state: WorkerState, spec: RequestSpec) -> None:
    """Resolve a spec's addresses to this worker's sites and install the hooks it needs."""
    captured = frozenset(
        site
        for a in spec.captures
        for s in capture_sites(a)
        if (site := state.table.addresses.get(s, s)) in state.table.sites
    )
    steer: dict[str, tuple[tuple[tuple[SteeringOp, ...], frozenset[int]], ...]] = {}
    for s in spec.steering:
        site = state.table.addresses.get(s.address)
        if site is None:
            continue  # another pipeline stage owns it
        steer[site] = (*steer.get(site, ()), (s.ops, scoped(s.masked, s.until)))
    reduce: dict[str, tuple[ReducerSpec, ...]] = {}
    for r in spec.reducers:
        site = state.table.addresses.get(r.address)
        if site is not None:
            reduce[site] = (*reduce.get(site, ()), reducers.kept(r))
    entry = Entry(
        spec, captured, steer, reduce_sites=reduce, judge_sites=judges_of(state.table, spec)
    )
    state.registry.add(entry)
    _acquire(state, entry.sites())


def _check_refused(state: WorkerState, keys: Iterable[str]) -> None:
    for key in keys:
        why = state.registry.refused.pop(key, None)
        if why is not None:
            state.registry.pop(key)
            raise RuntimeError(f"the worker could not register request {key}: {why}")


def _plan(state: WorkerState, layout: BatchLayout) -> dict[str, list[PlanItem]]:
    plan: dict[str, list[PlanItem]] = {}
    for rows in layout.keyed():
        entry = state.registry.get(rows.key)
        if entry is None:
            continue
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


def _release_entry(state: WorkerState, key: str) -> None:
    entry = state.registry.pop(key)
    if entry is not None:
        _release(state, entry.sites())


# --- collection ------------------------------------------------------------------------------


def _gather(
    state: WorkerState, entry: Entry, start: int, stop: int | None
) -> dict[str, torch.Tensor]:
    out: dict[str, torch.Tensor] = {}
    for address in entry.spec.captures:
        name, _, layer = address.partition(".")
        if name in ATTN_POINTS:
            geom = state.table.attn.get(int(layer))
            q_rows = entry.rows.get(f"attn_q.{layer}")
            k_rows = entry.rows.get(f"attn_k.{layer}")
            if geom is None or q_rows is None or k_rows is None:
                continue
            q = q_rows.gather(start, stop)
            k = k_rows.gather(0, stop)
            out[address] = attention_rows(q, k, geom, start, name == "attn_probs")
            continue
        site = state.table.addresses.get(address)
        rows = entry.rows.get(site) if site else None
        if rows is not None:
            out[address] = rows.gather(start, stop)
    out.update(gather_reduced(entry.rows, entry.spec.reducers, start, stop))
    return out
