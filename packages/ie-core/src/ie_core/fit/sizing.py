"""`fit(model_id, backend=...)`: a model's memory on a backend, priced from config.json and the
safetensors headers before any weight is read, against a GPU or this machine (`FitReport`).

ie-core prices the weights (the headers' dtype x shape, cast to the load dtype) and an
attribution graph; the backend prices what it holds itself through its plugin
(`BackendPlugin.memory`). Torch-free.
"""

from __future__ import annotations

import os
from collections.abc import Sequence

from ie_core.backend_plugin import backend_plugin
from ie_core.errors import BackendNotInstalledError, UnsupportedOperationError
from ie_core.fit.attribution import DEFAULT_L0, attribution_items
from ie_core.fit.checkpoint import Checkpoint, read_checkpoint
from ie_core.fit.items import Item, Workload
from ie_core.fit.report import FitReport
from ie_core.fit.shape import ModelShape, model_shape
from ie_core.fit.targets import target
from ie_core.grammar import POINTS, check_layer, family_for_architecture, get_point, to_address

__all__ = ["DTYPE_BYTES", "expand_addresses", "fit", "weights_item"]

DTYPE_BYTES = {"float32": 4, "float": 4, "bfloat16": 2, "float16": 2, "half": 2}


def expand_addresses(points: Sequence[str], shape: ModelShape) -> tuple[str, ...]:
    """`all` (every point the model's family has), point names (every layer) or addresses."""
    names = list(points)
    if names == ["all"]:
        family = family_for_architecture(shape.architecture)
        chosen = [p for p in POINTS if (family.has_point(p) if family else p.requires is None)]
        names = [p.name for p in chosen]
    out: list[str] = []
    for name in names:
        if "." in name:
            address = to_address(name, check=True)
            check_layer(address, shape.n_layers, "--points")
            out.append(str(address))
            continue
        point = get_point(name)
        out.extend(f"{name}.{i}" for i in range(shape.n_layers) if point.per_layer)
        if not point.per_layer:
            out.append(name)
    return tuple(out)


def _dtype(dtype: str | None, shape: ModelShape, device: str) -> str:
    """The load dtype: given; float32 on the CPU (ie's CPU default); else the config's."""
    text = (dtype or ("float32" if device == "cpu" else shape.torch_dtype or "bfloat16")).lower()
    text = text.removeprefix("torch.")
    if text not in DTYPE_BYTES:
        raise UnsupportedOperationError(
            f"dtype {text!r}: ie fit prices {', '.join(sorted(DTYPE_BYTES))}"
        )
    return text


def weights_item(ckpt: Checkpoint, element_bytes: int) -> Item:
    """The weights as loaded: floating tensors cast to the load dtype; a quantized checkpoint's
    tensors as stored (its kernels read them packed)."""
    quantized = "quantization_config" in (ckpt.config.get("text_config") or ckpt.config)
    loaded = ckpt.loaded_bytes(None if quantized else element_bytes)
    how = "as stored (quantized)" if quantized else f"floats at {element_bytes} B"
    return Item(
        "weights",
        loaded,
        f"{ckpt.parameters:,} parameters in the safetensors headers ({ckpt.file_bytes:,} B "
        f"stored), {how}",
        "a smaller dtype (--dtype bfloat16) or a GPU with more memory",
    )


def fit(
    model_id: str | os.PathLike[str],
    backend: str = "vllm",
    *,
    points: Sequence[str] = (),
    static_writes: Sequence[str] = (),
    max_model_len: int | None = None,
    streams: int = 1,
    gpu: str | None = None,
    memory_gib: float | None = None,
    attribute_tokens: int | None = None,
    l0: float = DEFAULT_L0,
    max_feature_nodes: int | None = None,
    dtype: str | None = None,
    hub: bool = True,
) -> FitReport:
    """Price `model_id` (a Hub id or a local folder) on `backend` for sequences of `max_model_len` tokens (the config's
    positions when None), `streams` at once, capturing `points` (vllm-static: tapping them and
    writing `static_writes`), and an attribution graph at `attribute_tokens` (transcoders of
    mean L0 `l0`, at most `max_feature_nodes` features kept); against `gpu`
    (a name, `ie_core.fit.GPU_MIB`), `memory_gib` of GPU, or this machine's RAM. `hub=False`
    reads disk only (a folder or the HF cache), never the network."""
    plugin = backend_plugin(backend)
    if plugin is None:
        raise BackendNotInstalledError(f"backend {backend!r} is not installed (ie fit asks it)")
    if plugin.memory is None:
        raise UnsupportedOperationError(
            f"backend {backend!r} does not price its memory for ie fit; use eager, vllm or "
            "vllm-static"
        )
    if streams < 1:
        raise UnsupportedOperationError(f"--streams {streams}: give at least 1")
    ckpt = read_checkpoint(model_id, hub=hub)
    shape = model_shape(ckpt.config, f"{ckpt.source}/config.json")
    where = target(backend, gpu, memory_gib)
    load = _dtype(dtype, shape, where.device)
    tokens = int(max_model_len or shape.max_positions or 0)
    if tokens < 1:
        raise UnsupportedOperationError(
            f"{ckpt.source}/config.json gives no max_position_embeddings; give --max-model-len"
        )
    work = Workload(
        backend, expand_addresses(points, shape), tuple(static_writes), tokens, streams,
        DTYPE_BYTES[load], where.device,
    )  # fmt: skip
    items = [weights_item(ckpt, DTYPE_BYTES[load]), *plugin.memory(shape, work)]
    if attribute_tokens is not None:
        items.extend(attribution_items(shape, attribute_tokens, l0, max_feature_nodes))
    return FitReport(
        str(model_id), backend, where, load, tokens, streams, ckpt.parameters, tuple(items)
    )
