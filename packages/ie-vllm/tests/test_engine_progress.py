"""vLLM's weight-loading bar prints one line per step: the engine arguments turn it off in logs."""

from __future__ import annotations

import pytest
from ie_vllm.host.engine import engine_kwargs


def test_log_output_turns_the_loading_bar_off(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("IE_PROGRESS", "0")
    assert engine_kwargs("m", hooked=True, extension=None)["use_tqdm_on_load"] is False
    # The caller's own choice still wins.
    assert engine_kwargs("m", hooked=True, extension=None, use_tqdm_on_load=True)[
        "use_tqdm_on_load"
    ]


def test_a_terminal_keeps_vllms_default(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("IE_PROGRESS", "1")
    assert "use_tqdm_on_load" not in engine_kwargs("m", hooked=False, extension=None)
