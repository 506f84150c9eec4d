"""This project's backends (`eager`, `vllm`, `vllm-static`) through the ie_core protocol."""

from __future__ import annotations

import contextlib
from collections.abc import Sequence
from typing import Any

from ie_core.errors import InterpError

from ie_validator.engines.base import (
    Capture,
    CaptureFailure,
    EngineError,
    ModelSpec,
    Request,
    canonical,
)
from ie_validator.mappings import Gap
from ie_validator.scoring import Tier

LOAD_KWARGS: dict[str, dict[str, Any]] = {
    "eager": {"dtype": "float32", "device": "cpu"},
    # One short prompt: a small context keeps the CPU KV cache and engine start small.
    "vllm": {"dtype": "float32", "max_model_len": 256},
    # Every tappable point at every layer, declared as the capability sweep declares it
    # (`ie_core.tooling.capability_sweep.load_kwargs`), so the column compares what the backend can tap.
    "vllm-static": {
        "dtype": "float32",
        "max_model_len": 256,
        "static_points": "all",
        "static_writes": "auto",
    },
}


# vLLM's CPU kernels for int8 and 4-bit weights take bfloat16 / float16 activations only
# (ie_vllm.host.cpu_support refuses float32 before an engine starts), so a quantized checkpoint runs
# in bfloat16 on the vLLM backends; eager stays the float32 reference.
QUANTIZED_DTYPE = "bfloat16"


def load_kwargs(backend: str, model: ModelSpec) -> dict[str, Any]:
    """How `backend` loads `model`: LOAD_KWARGS, in bfloat16 for a quantized one on vLLM."""
    kwargs = dict(LOAD_KWARGS.get(backend, {}))
    if model.quantization and backend != "eager":
        kwargs["dtype"] = QUANTIZED_DTYPE
    return kwargs


def engine_dtype(backend: str, model: ModelSpec) -> str:
    """The dtype `backend` computes `model` in (what its result records)."""
    return str(load_kwargs(backend, model).get("dtype", "float32"))


class ProjectEngine:
    """One of this project's backends, loaded with `ie_core.load_model(folder, backend=...)`."""

    def __init__(self, backend: str) -> None:
        self.name = backend
        self.tier = Tier.RAW_HF if backend == "eager" else Tier.FUSED
        self.versions: dict[str, str] = {}  # the vLLM model runner a vLLM backend ran on

    def _load(self, model: ModelSpec) -> Any:
        from ie_core import load_model

        try:
            return load_model(str(model.path), backend=self.name, **load_kwargs(self.name, model))
        except Exception as exc:
            raise EngineError(
                f"load_model(backend={self.name!r}) failed: {type(exc).__name__}: {exc}"
            ) from exc

    def capture(self, model: ModelSpec, ids: Sequence[int], requests: Sequence[Request]) -> Capture:
        from ie_core import capture
        from ie_core.runner import run

        loaded = self._load(model)
        runner = getattr(getattr(loaded, "info", None), "model_runner", "")
        self.versions = {"vllm-model-runner": runner} if runner else {}
        out: Capture = {}
        try:
            batch = [list(ids)]
            try:
                cache = capture(loaded, batch, [r.address for r in requests])
                for req in requests:
                    out[req.key] = canonical(req.address.name, cache[req.address])
            except InterpError:
                # One refused point fails the whole call: ask point by point for the reasons.
                for req in requests:
                    try:
                        cache = capture(loaded, batch, [req.address])
                        out[req.key] = canonical(req.address.name, cache[req.address])
                    except InterpError as exc:
                        out[req.key] = Gap(f"{self.name} refuses: {exc}")
                    except Exception as exc:  # not a refusal: a broken capture is a FAIL
                        out[req.key] = CaptureFailure(
                            f"{self.name}: {type(exc).__name__}: {exc}"[:400]
                        )
        finally:
            shutdown = getattr(loaded, "shutdown", None)
            if shutdown is not None:
                # Best effort: a failed shutdown leaves nothing this sweep still needs.
                with contextlib.suppress(Exception):
                    run(shutdown())
        return out
