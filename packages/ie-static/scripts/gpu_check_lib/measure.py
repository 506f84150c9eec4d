"""The priced half: one engine at a time, every column once per round, medians and spreads.

Engines are never held together: a vLLM engine reserves its `gpu_memory_utilization` share of the
device when it starts, so a second one beside it would fail or run on a starved KV cache.
"""

from __future__ import annotations

import asyncio
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from gpu_check_lib.facts import NotOnCuda, engine_device
from gpu_check_lib.parity import PROMPTS
from gpu_check_lib.plan import STREAMED, Column, Plan, Step, schedule

CLEAN = "The Eiffel Tower is in the city of"
CORRUPT = "The Colosseum is in the city of"
SAE_K = 32
SAE_ROWS = 8
SAE_ROW_TOKENS = 128
SAE_EXPANSION = 8
RELEASE_WAIT_S = 60.0


@dataclass(frozen=True)
class Context:
    """What the columns share: sizes, addresses, the steering spec and the dictionary."""

    new_tokens: int
    mid: int
    every_layer: tuple[str, ...]
    steering: Any
    sae: Any
    sae_source: str


class EngineSlot:
    """Loads engines one at a time: starting one while another is loaded raises."""

    def __init__(self, folder: str, mem: float, max_model_len: int, device: str = "cuda") -> None:
        self.folder = folder
        self.mem = mem
        self.max_model_len = max_model_len
        self.device = device  # eager's; "cpu" only in smoke tests (engine_device still refuses)
        self.current: Any = None
        self.starts: list[dict[str, Any]] = []
        self.baseline_free = free_bytes()

    def start(self, backend: str, **kwargs: Any) -> Any:
        from ie_core.loading import load_model

        if self.current is not None:
            raise RuntimeError("an engine is still loaded; stop it before starting another")
        common: dict[str, Any] = {"device": self.device}
        if backend != "eager":
            common = {
                "gpu_memory_utilization": self.mem,
                "max_model_len": self.max_model_len,
                # Every round repeats the prompts: a prefix cache would turn prefill into hits.
                "enable_prefix_caching": False,
            }
        t0 = time.perf_counter()
        self.current = load_model(self.folder, backend=backend, **common, **kwargs)
        seconds = time.perf_counter() - t0
        try:
            where = engine_device(self.current)
        except NotOnCuda:
            self.stop(self.current)
            raise
        self.starts.append(
            {
                "backend": backend,
                "kwargs": {k: str(v) for k, v in kwargs.items()},
                "start_s": seconds,
                "device": where.device,
                "device_source": where.source,
                "model_runner": where.runner,  # "" = unknown (eager, or an older ie-vllm)
            }
        )
        return self.current

    def stop(self, model: Any) -> None:
        from ie_core.runner import run

        try:
            run(model.shutdown())
        finally:
            self.current = None
            release(self.baseline_free)


def free_bytes() -> int:
    import torch

    return int(torch.cuda.mem_get_info()[0])


def release(baseline_free: int, max_wait_s: float = RELEASE_WAIT_S) -> None:
    """Empty torch's cache and wait until the engine's workers gave the device memory back."""
    import gc

    import torch

    deadline = time.monotonic() + max_wait_s
    while True:
        gc.collect()
        torch.cuda.empty_cache()
        if free_bytes() >= 0.95 * baseline_free or time.monotonic() >= deadline:
            return
        time.sleep(0.5)


def build_context(width: int, n_layers: int, new_tokens: int, sae_source: str | None) -> Context:
    import torch
    from ie_core.experiments.saes import from_tensors, load_sae
    from ie_core.ops import Additive, steer_at

    mid = n_layers // 2
    site = f"resid_post.{mid}"
    g = torch.Generator().manual_seed(0)
    steering = steer_at(site, Additive(torch.randn(width, generator=g), 4.0))
    if sae_source:
        sae = load_sae(sae_source, address=site)
    else:
        # No published SmolLM2 dictionary is reachable offline; the read-out's cost depends on
        # the shapes and k, not on what the features mean.
        d_sae = SAE_EXPANSION * width
        weights = {
            "W_enc": torch.randn(width, d_sae, generator=g) / width**0.5,
            "b_enc": torch.zeros(d_sae),
            "W_dec": torch.randn(d_sae, width, generator=g) / d_sae**0.5,
            "b_dec": torch.zeros(width),
        }
        sae = from_tensors(weights, address=site, name="random-8x")
    every = tuple(f"resid_post.{i}" for i in range(n_layers))
    source = sae_source or f"random weights (seed 0), {SAE_EXPANSION} x {width} features"
    return Context(new_tokens, mid, every, steering, sae, source)


async def _streamed(model: Any, ctx: Context, workload: str, streams: int) -> dict[str, float]:
    from ie_core.protocol import SamplingParams

    sp = SamplingParams(max_new_tokens=ctx.new_tokens, stop_at_eos=False)

    def job(prompt: str) -> Any:
        if workload == "capture_all":
            return model.capture_generation(prompt, list(ctx.every_layer), sp)
        if workload == "steer":
            return model.generate(prompt, sp, steering=ctx.steering)
        return model.generate(prompt, sp)

    prompts = [PROMPTS[i % len(PROMPTS)] for i in range(streams)]
    t0 = time.perf_counter()
    results = await asyncio.gather(*(job(p) for p in prompts))
    wall = time.perf_counter() - t0
    tokens = sum(len(getattr(r, "generation", r).token_ids) for r in results)
    return {"tok_s": tokens / wall, "wall_s": wall, "tokens": float(tokens)}


def _patch_sweep(model: Any, ctx: Context) -> dict[str, float]:
    from ie_core.experiments.patching import logit_diff, patch_sweep

    clean, corrupt = model.to_tokens(CLEAN), model.to_tokens(CORRUPT)
    # Patching pairs positions; a tokenizer that splits the two subjects differently keeps the
    # common tail (SmolLM2's are equal, so nothing is cut there).
    n = min(len(clean), len(corrupt))
    # The answers' first token ids: one token each on SmolLM2, the same metric anywhere else.
    paris, rome = (model.to_tokens(w, prepend_bos=False)[0] for w in (" Paris", " Rome"))
    t0 = time.perf_counter()
    result = patch_sweep(
        model, clean[-n:], corrupt[-n:], metric=logit_diff(paris, rome), point="resid_post",
        layers=[ctx.mid],
    )  # fmt: skip
    wall = time.perf_counter() - t0
    cells = int(result.values.numel())
    return {"cells_s": cells / wall, "wall_s": wall, "cells": float(cells)}


def sae_rows(model: Any) -> list[list[int]]:
    """SAE_ROWS rows of SAE_ROW_TOKENS tokens cut from the prompts, staggered: equal lengths,
    since a backend that does not pad (eager) refuses a ragged batch."""
    ids = model.to_tokens(" ".join(PROMPTS) * 8)
    step = (len(ids) - SAE_ROW_TOKENS) // SAE_ROWS
    return [ids[i * step : i * step + SAE_ROW_TOKENS] for i in range(SAE_ROWS)]


def _sae(model: Any, ctx: Context) -> dict[str, float]:
    from ie_core.experiments.features import feature_activations

    ids = sae_rows(model)
    t0 = time.perf_counter()
    feature_activations(model, ids, ctx.sae, k=SAE_K)
    wall = time.perf_counter() - t0
    rows = sum(len(i) for i in ids)
    return {"rows_s": rows / wall, "wall_s": wall, "rows": float(rows)}


def measure(model: Any, ctx: Context, column: Column) -> dict[str, float]:
    """One timed call of `column` on the loaded engine."""
    from ie_core.runner import run

    if column.workload in STREAMED:
        return run(_streamed(model, ctx, column.workload, column.streams or 1))
    if column.workload == "patch_sweep":
        return _patch_sweep(model, ctx)
    return _sae(model, ctx)


def spread(values: list[float]) -> dict[str, float]:
    """Median and spread of a column's rounds (quartiles need two samples; one gives its value)."""
    q1, _, q3 = statistics.quantiles(values, n=4) if len(values) > 1 else (values[0],) * 3
    return {
        "median": statistics.median(values),
        "min": min(values),
        "max": max(values),
        "q1": q1,
        "q3": q3,
    }


class Tally:
    """Every round's sample of one column, and the errors it met."""

    def __init__(self) -> None:
        self.samples: dict[str, list[float]] = {}
        self.errors: list[str] = []

    def add(self, figures: dict[str, float]) -> None:
        for k, v in figures.items():
            self.samples.setdefault(k, []).append(v)

    def summary(self) -> dict[str, Any]:
        status = "error" if self.errors and not self.samples else "ok"
        stats = {k: spread(v) for k, v in self.samples.items() if v}
        return {"status": status, "samples": self.samples, "stats": stats, "errors": self.errors}


def _warm(model: Any, ctx: Context, columns: list[Column]) -> None:
    """One untimed call per workload at its fewest streams: compile, graphs, allocator."""
    seen: set[str] = set()
    for col in columns:
        if col.workload not in seen:
            seen.add(col.workload)
            try:
                measure(model, ctx, col)
            except Exception:  # the timed call records it
                continue


def run_price(
    plan: Plan, slot: EngineSlot, ctx: Context, engine_kwargs: Callable[[str], dict[str, Any]]
) -> dict[str, Any]:
    """Run the schedule: round r starts each engine in turn, runs its columns, stops it."""
    by_key = {e.key: e for e in plan.engines}
    tallies = {c.key: Tally() for c in plan.all_columns()}
    model: Any = None
    try:
        for step in schedule(plan):
            model = _do(step, model, plan, slot, ctx, engine_kwargs, tallies, by_key)
    finally:
        if model is not None:
            slot.stop(model)
    return {key: t.summary() for key, t in tallies.items()}


def _do(
    step: Step,
    model: Any,
    plan: Plan,
    slot: EngineSlot,
    ctx: Context,
    engine_kwargs: Callable[[str], dict[str, Any]],
    tallies: dict[str, Tally],
    by_key: dict[str, Any],
) -> Any:
    """One step; returns the engine now loaded (None when it stopped or failed to start)."""
    engine = by_key[step.engine]
    columns = plan.columns(engine)
    if step.kind == "start":
        try:
            return slot.start(engine.backend, **engine_kwargs(engine.backend))
        except NotOnCuda:
            raise
        except Exception as exc:  # an engine that cannot start costs its columns this round
            for col in columns:
                tallies[col.key].errors.append(f"round {step.round}: start: {exc!r}"[:500])
            return None
    if model is None:
        return None
    if step.kind == "warmup":
        _warm(model, ctx, columns)
    elif step.kind == "measure" and step.column is not None:
        try:
            tallies[step.column.key].add(measure(model, ctx, step.column))
        except Exception as exc:
            tallies[step.column.key].errors.append(f"round {step.round}: {exc!r}"[:500])
    elif step.kind == "stop":
        slot.stop(model)
        return None
    return model


def ratios(columns: dict[str, Any]) -> dict[str, float]:
    """Each streamed column's median tok/s over vanilla vLLM's plain generation at its streams."""
    out = {}
    for key, col in columns.items():
        engine, _workload, *rest = key.split("/")
        if not rest or engine == "vanilla" or "tok_s" not in col["stats"]:
            continue
        base = columns.get(f"vanilla/generate/{rest[0]}", {}).get("stats", {}).get("tok_s")
        if base and base["median"]:
            out[f"{key} / vanilla/generate/{rest[0]}"] = (
                col["stats"]["tok_s"]["median"] / base["median"]
            )
    return out
