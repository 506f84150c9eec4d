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


def held_memory(runner: Any) -> dict[str, int]:
    """`weights`: the model's parameters and buffers (a tied tensor once); `kv_cache`: the KV
    tensors' storages, each once; `kv_tokens`: blocks x block size."""
    model = loaded_model(runner).model
    held = (*model.parameters(), *model.buffers())
    weights = sum(t.numel() * t.element_size() for t in held)
    storages: dict[int, int] = {}
    for t in _flat_tensors(getattr(runner, "kv_caches", [])):
        storages[t.untyped_storage().data_ptr()] = t.untyped_storage().nbytes()
    cache = runner.cache_config
    tokens = int(cache.num_gpu_blocks or 0) * int(cache.block_size)
    return {"weights": weights, "kv_cache": sum(storages.values()), "kv_tokens": tokens}
