"""Engines for the ie-vllm tests: real vLLM on CPU, one per test module (or per family param)."""

from __future__ import annotations

import os
from collections.abc import Iterator
from typing import Any

import pytest
import torch

os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
# A shared, oversubscribed CI box can stall one forward for minutes; vLLM kills the engine at 300 s.
os.environ.setdefault("VLLM_EXECUTE_MODEL_TIMEOUT_SECONDS", "1800")
torch.set_num_threads(min(2, torch.get_num_threads()))

SMOLLM2 = "HuggingFaceTB/SmolLM2-135M-Instruct"
MAX_MODEL_LEN = 256


def vllm_available() -> bool:
    try:
        import vllm  # noqa: F401
    except Exception:
        return False
    return True


requires_vllm = pytest.mark.skipif(not vllm_available(), reason="vLLM is not installed")


def start(model_id: str, backend: str = "vllm", **kw: Any) -> Any:
    from ie_core import load_model

    kw.setdefault("max_model_len", MAX_MODEL_LEN)
    return load_model(model_id, backend=backend, **kw)


def stop(model: Any) -> None:
    from ie_core.runner import run

    run(model.shutdown())


def eager(model_id: str) -> Any:
    from ie_core import load_model

    return load_model(model_id, backend="eager", device="cpu", dtype="float32")


@pytest.fixture(scope="module")
def smollm2() -> Iterator[Any]:
    model = start(SMOLLM2)
    yield model
    stop(model)


@pytest.fixture(scope="module")
def smollm2_eager() -> Any:
    return eager(SMOLLM2)
