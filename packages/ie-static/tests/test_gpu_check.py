"""The GPU check script imports and skips cleanly without CUDA; with CUDA it must pass parity."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[1] / "scripts" / "gpu_check.py"


def _script():
    spec = importlib.util.spec_from_file_location("ie_static_gpu_check", SCRIPT)
    module = importlib.util.module_from_spec(spec)  # type: ignore[arg-type]
    spec.loader.exec_module(module)  # type: ignore[union-attr]
    return module


def test_skips_without_cuda(capsys, monkeypatch) -> None:
    script = _script()
    monkeypatch.setattr(script, "cuda_available", lambda: False)
    assert script.main([]) == 0
    assert "skipped" in json.loads(capsys.readouterr().out.strip().splitlines()[-1])


@pytest.mark.gpu
@pytest.mark.slow
def test_gpu_parity_and_price(tmp_path) -> None:
    script = _script()
    if not script.cuda_available():
        pytest.skip("needs a CUDA device")
    out = tmp_path / "gpu_check.json"
    assert script.main(["--out", str(out)]) == 0
    assert json.loads(out.read_text())["parity_ok"]
