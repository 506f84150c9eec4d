"""Engines for the ie-vllm tests: real vLLM on CPU, one per test module (or per family param)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from vllm_support import SMOLLM2, eager, start, stop


@pytest.fixture(scope="module")
def smollm2() -> Iterator[Any]:
    model = start(SMOLLM2)
    yield model
    stop(model)


@pytest.fixture(scope="module")
def smollm2_eager() -> Any:
    return eager(SMOLLM2)
