"""Helpers the ie-vllm tests import: start and stop real vLLM engines on CPU, eager references.

A module of its own (not conftest.py), so that `import` finds it by a name no other package's
tests use."""

from __future__ import annotations

import os
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


def registered_keys(model: Any) -> list[str]:
    """The request keys the engine's workers hold now (`stats()["keys"]`)."""
    from ie_core.runner import run
    from ie_core.sync import unwrap

    return list(run(unwrap(model).stats())["keys"])


def check_released(test: str, before: list[str], after: list[str]) -> None:
    """Fail when a test left a request registered on a shared engine: every key held after the
    test and not before it is a leak (a later test on the same engine would run beside it)."""
    leaked = sorted(set(after) - set(before))
    if leaked:
        raise AssertionError(
            f"{test} left {len(leaked)} request(s) registered on the shared engine: "
            + ", ".join(repr(key) for key in leaked)
        )
