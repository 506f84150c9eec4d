"""LoRA on the vLLM host without an engine: the refusals that come before any request, and the
base requests' zero adapter (exactly zero, on the model's own Linear names)."""

from __future__ import annotations

from pathlib import Path

import pytest
from ie_core.errors import UnsupportedOperationError
from ie_core.lora import LoraError, LoraSpec, load_adapter
from ie_vllm.host.lora import BASE_NAME, HostAdapters, _linear_shapes, _zero_adapter

SPEC = LoraSpec("a", "/nowhere")


def test_an_engine_started_without_lora_refuses_adapters() -> None:
    with pytest.raises(UnsupportedOperationError, match="enable_lora=True"):
        HostAdapters(None, "m", "vllm", {}).request(SPEC)
    assert HostAdapters(None, "m", "vllm", {}).request(None) is None


def test_vllm_static_refuses_adapters_by_name() -> None:
    with pytest.raises(UnsupportedOperationError, match="vllm-static"):
        HostAdapters(None, "m", "vllm-static", {"enable_lora": True}).request(SPEC)


def test_the_base_name_is_reserved() -> None:
    with pytest.raises(LoraError, match=BASE_NAME):
        HostAdapters(None, "m", "vllm", {"enable_lora": True}).request(LoraSpec(BASE_NAME, "/x"))


def test_the_zero_adapter_is_zero_on_the_models_linears() -> None:
    from ie_core.models import resolve_model_path

    source = str(resolve_model_path("ie-synthetic/llama"))
    shapes = _linear_shapes(source)
    folder = _zero_adapter(shapes, source)
    adapter = load_adapter(LoraSpec("z", str(Path(folder))))
    adapter.check("ie-synthetic/llama", shapes.get, (source,))
    assert len(adapter.weights) == 7 * sum(1 for p in shapes if p.endswith("q_proj"))
    assert all(float(a.abs().max()) == 0 and float(b.abs().max()) == 0
               for a, b in adapter.weights.values())  # fmt: skip
