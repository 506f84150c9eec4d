"""What a static engine is started with: the declared sites, their config and the buffer plan.

One function serves both ways of starting one, the in-process backend (`StaticModel.create_static`)
and `ie serve --backend vllm-static` (`serve.serve_args`), so both refuse the same models before
minutes of engine start and size the step the same way.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ie_core.errors import PointUnavailableError
from ie_core.grammar import Trait, family_for_architecture, to_address
from ie_core.models import resolve_model_path
from ie_vllm import check_cpu_support, on_cpu

from ie_static.config import StaticConfig
from ie_static.declared import Declared, declared_sets
from ie_static.memory import GIB, BufferPlan, estimated_width, plan_buffers
from ie_static.tables import TableShape

CPU_WORKER = "ie_static.worker_cpu.StaticCPUWorker"
GPU_WORKER = "ie_static.worker_gpu.StaticGPUWorker"
DEFAULT_ROWS_CPU = 2048
DEFAULT_ROWS_GPU = 8192
DEFAULT_BUFFER_GIB = 2.0


@dataclass(frozen=True)
class Launch:
    """A planned static engine: where its weights are, what it taps, how many rows a step holds."""

    source: str  # local folder or hub id, as vLLM and the tokenizer are given it
    architecture: str
    declared: Declared
    config: StaticConfig
    plan: BufferPlan
    cpu: bool

    @property
    def worker_cls(self) -> str:
        return CPU_WORKER if self.cpu else GPU_WORKER

    @property
    def max_num_seqs(self) -> int:
        return min(256, self.plan.rows)


def plan_launch(
    model_id: Any,
    static_points: Any,
    static_writes: Any,
    *,
    slots: int,
    max_ops: int,
    masks: int,
    patch_rows: int = 16,
    dtype: Any = None,
    max_model_len: int | None = None,
    buffer_gib: float = DEFAULT_BUFFER_GIB,
    requested_rows: int | None = None,
) -> Launch:
    """Resolve the model and the declaration; refuse what cannot start before starting anything."""
    path = resolve_model_path(model_id)
    source = str(path) if path is not None else str(model_id)
    check_cpu_support(path, str(dtype or "float32"))
    from transformers import AutoConfig

    hf = AutoConfig.from_pretrained(source)
    text = hf.get_text_config() if hasattr(hf, "get_text_config") else hf
    architecture = (getattr(hf, "architectures", None) or [""])[0]
    family = family_for_architecture(architecture)
    if family is not None and family.has(Trait.MULTI_STREAM):
        raise PointUnavailableError(
            f"{architecture} has several residual streams; vllm-static does not tap "
            "resid_streams yet; use backend='vllm'"
        )
    n_layers = int(getattr(text, "num_hidden_layers", 0) or getattr(text, "n_layer", 0))
    declared = declared_sets(static_points, static_writes, n_layers, family)
    config = StaticConfig(declared.reads, declared.writes, slots, max_ops, masks, patch_rows)
    cpu = on_cpu()
    max_len = int(max_model_len or getattr(text, "max_position_embeddings", 2048))
    plan = plan_buffers(
        read_widths=[estimated_width(to_address(a).name, text) for a in declared.reads],
        write_widths=[estimated_width(to_address(a).name, text) for a in declared.writes],
        dtype_bytes=_dtype_bytes(dtype, hf, cpu),
        shape=TableShape(slots, max_ops, masks, max_len, patch_rows),
        budget_bytes=int(buffer_gib * GIB),
        requested_rows=requested_rows,
        default_rows=DEFAULT_ROWS_CPU if cpu else DEFAULT_ROWS_GPU,
    )
    return Launch(source, architecture, declared, config, plan, cpu)


def _dtype_bytes(dtype: Any, hf: Any, cpu: bool) -> int:
    if dtype is None:
        if cpu:
            return 4
        dtype = getattr(hf, "dtype", None) or getattr(hf, "torch_dtype", None) or "bfloat16"
    text = str(dtype).removeprefix("torch.")
    return {"float32": 4, "float": 4, "float16": 2, "half": 2, "bfloat16": 2, "auto": 2}.get(
        text, 4
    )


__all__ = ["DEFAULT_BUFFER_GIB", "Launch", "plan_launch"]
