"""The parts of a loaded vLLM model that its request helpers (the lens read-outs, the dictionary
read-out) use: they take this protocol, not `VLLMModel`, so the model imports them and nothing
imports the model back."""

from __future__ import annotations

from typing import Any, Protocol

from ie_core.model_info import ModelInfo

from ie_vllm.host.admission import Admission
from ie_vllm.host.channel import Channel
from ie_vllm.host.engine import Engine
from ie_vllm.host.request import Flow
from ie_vllm.host.variant import Variant

__all__ = ["ModelParts"]


class ModelParts(Protocol):
    """What a `VLLMModel` (or a subclass such as ie-static's) holds once loaded."""

    @property
    def backend(self) -> str: ...

    @property
    def variant(self) -> Variant: ...

    @property
    def engine(self) -> Engine: ...

    @property
    def info(self) -> ModelInfo: ...

    @property
    def tokenizer(self) -> Any: ...

    @property
    def admission(self) -> Admission: ...

    @property
    def flow(self) -> Flow: ...

    @property
    def channel(self) -> Channel: ...

    @property
    def d_model(self) -> int: ...
