"""What a worker holds as vLLM allocated it: the model's weights and the KV cache, in bytes, and
the KV cache's tokens; `ie fit`'s prices are checked against these (`ie_memory`)."""

from __future__ import annotations

from typing import Any

import torch

from ie_vllm.worker.runner_adapter import loaded_model

__all__ = ["held_memory"]


def _flat_tensors(items: Any) -> list[torch.Tensor]:
    """The tensors of a possibly nested list (vLLM keeps one KV tensor, or a pair, per layer)."""
    if isinstance(items, torch.Tensor):
        return [items]
    if isinstance(items, list | tuple):
        return [t for item in items for t in _flat_tensors(item)]
    return []


def _packed_bytes(model: torch.nn.Module) -> int:
    """Bytes of the linear weights vLLM's CPU GEMM dispatch moved into packed kernels (oneDNN,
    sgl), leaving an empty `weight`: each layer's own size, output x input per partition."""
    total = 0
    for module in model.modules():
        if hasattr(module, "base_layer"):
            continue  # a LoRA wrapper shows its base layer's weight: that layer counts it once
        weight = getattr(module, "weight", None)
        if (
            hasattr(module, "cpu_linear")
            and isinstance(weight, torch.Tensor)
            and not weight.numel()
        ):
            rows = int(getattr(module, "output_size_per_partition", 0))
            cols = int(getattr(module, "input_size_per_partition", 0))
            total += rows * cols * weight.element_size()
    return total


def held_memory(runner: Any) -> dict[str, int]:
    """`weights`: the model's parameters and buffers (a tied tensor once) and its packed linear
    weights; `kv_cache`: the KV tensors' storages, each once; `kv_tokens`: blocks x block size."""
    model = loaded_model(runner).model
    held = (*model.parameters(), *model.buffers())
    weights = sum(t.numel() * t.element_size() for t in held) + _packed_bytes(model)
    storages: dict[int, int] = {}
    for t in _flat_tensors(getattr(runner, "kv_caches", [])):
        storages[t.untyped_storage().data_ptr()] = t.untyped_storage().nbytes()
    cache = runner.cache_config
    tokens = int(cache.num_gpu_blocks or 0) * int(cache.block_size)
    return {"weights": weights, "kv_cache": sum(storages.values()), "kv_tokens": tokens}
