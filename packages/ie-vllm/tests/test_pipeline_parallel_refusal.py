"""pipeline_parallel_size > 1 is refused before an engine starts, with the measured reason."""

from __future__ import annotations

import psutil
import pytest
from ie_core import load_model
from ie_core.errors import UnsupportedOperationError
from ie_vllm.parallel_support import check_pipeline_parallel


def test_load_model_refuses_pp2_before_any_engine() -> None:
    with pytest.raises(UnsupportedOperationError, match="pipeline_parallel_size=2") as caught:
        load_model("ie-synthetic/llama", backend="vllm", pipeline_parallel_size=2)
    assert "tensor_parallel_size" in str(caught.value)  # says what to do instead
    # Refused before Engine.start: no engine process was left behind (or ever spawned).
    assert not [p for p in psutil.Process().children(recursive=True) if "VLLM" in p.name()]


def test_pp1_and_unset_are_let_through() -> None:
    check_pipeline_parallel({})
    check_pipeline_parallel({"pipeline_parallel_size": 1, "tensor_parallel_size": 2})
