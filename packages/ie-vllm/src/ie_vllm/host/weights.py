"""Weights by TransformerLens's names on vLLM (`model.W_Q`, ...): the host's half of `ie_weights`.

One `ie_weights` RPC per part reads it on every worker (`ie_vllm.worker.weights`); pipeline
stages answer for their own layers and the host puts the layers in order. Under tensor
parallelism each rank holds a shard of every part (vocabulary rows, heads, MLP columns), so the
part is refused by name before any RPC rather than gathered.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Protocol

from ie_core.errors import UnsupportedOperationError
from ie_core.model_info import ModelInfo
from ie_core.runner import run

from ie_vllm import payload

if TYPE_CHECKING:
    from ie_vllm.host.engine import Engine

__all__ = ["weight_parts"]


class Served(Protocol):
    """What the weights are asked through: the engine, the model's description and names."""

    engine: Engine
    info: ModelInfo
    model_id: str
    backend: str


PER_MODEL = ("embed", "unembed", "unembed_bias", "pos_embed")


def weight_parts(model: Served, part: str) -> Any:
    """`part` in torch's layout: one tensor, or one per layer (None where absent)."""
    if model.info.tp_size > 1:
        raise UnsupportedOperationError(
            f"{part} is sharded over tensor_parallel_size={model.info.tp_size} ranks on "
            f"{model.backend}, so it is not read whole; load with tensor_parallel_size=1 (or on "
            "backend='eager') to read weights by name"
        )
    try:
        replies = run(model.engine.rpc("ie_weights", part))
    except Exception as error:  # a worker class without the method (vllm-static's)
        raise UnsupportedOperationError(
            f"the {model.backend} workers do not serve weights ({type(error).__name__}); "
            "load the model on backend='vllm' or 'eager' to read weights by name"
        ) from error
    tensors: dict[str, Any] = {}
    absent: set[str] = set()
    for reply in replies:
        if reply["refused"]:
            raise UnsupportedOperationError(
                f"{model.model_id} on {model.backend}: {reply['refused']}"
            )
        for name, tensor in payload.decode(reply["tensors"]).items():
            tensors.setdefault(name, tensor)
        absent.update(reply["absent"])
    if part in PER_MODEL:
        return tensors.get(part)
    out = []
    for layer in range(model.info.n_layers):
        key = f"{part}.{layer}"
        if key not in tensors and key not in absent:
            raise UnsupportedOperationError(f"no worker holds {part} of layer {layer}")
        out.append(tensors.get(key))
    return out
