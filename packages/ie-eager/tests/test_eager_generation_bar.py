"""A progress bar on long eager generations, where a person watches; the tokens are unchanged."""

from __future__ import annotations

import ie_core
import pytest
from eager_support import synthetic_model

N = 40  # above progress_bar.MIN_TOKENS


def test_long_generation_draws_a_bar_only_when_asked(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    model = synthetic_model("llama")
    monkeypatch.setenv("IE_PROGRESS", "0")
    quiet = ie_core.generate(model, "Hello", max_new_tokens=N, stop_at_eos=False)
    assert "generating" not in capsys.readouterr().err  # negative control
    monkeypatch.setenv("IE_PROGRESS", "1")
    shown = ie_core.generate(model, "Hello", max_new_tokens=N, stop_at_eos=False)
    err = capsys.readouterr().err
    assert "generating" in err and f"/{N}" in err
    assert shown.token_ids == quiet.token_ids and len(shown.token_ids) == N
