"""The install check, `uv run pytest -m quick` (docs/TESTING.md): the packages import, the demo
runs and finds Paris, one capture on eager against the HF forward, the dashboard starts and
renders its cheat sheet. The vLLM capture is packages/ie-vllm/tests/test_vllm_script.py's plain
script (its test marked `quick`): one engine start, in a subprocess."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

pytestmark = pytest.mark.quick

PACKAGES = ("ie_core", "ie_eager", "ie_vllm", "ie_static", "ie_remote", "ie_dashboard")


def test_the_installed_packages_import_and_name_their_backends() -> None:
    import ie_core

    installed = [name for name in PACKAGES if importlib.util.find_spec(name) is not None]
    for name in installed:
        importlib.import_module(name)
    assert "eager" in ie_core.available_backends()
    if "ie_vllm" in installed:
        assert "vllm" in ie_core.available_backends()


def test_the_demo_runs_and_the_lens_finds_paris(capsys: pytest.CaptureFixture[str]) -> None:
    pytest.importorskip("ie_eager")
    from ie_eager.demo import demo_command

    assert demo_command(["--max-new-tokens", "4"]) == 0
    out = capsys.readouterr().out
    last = [line for line in out.splitlines() if line.strip().startswith("layer")][-1]
    assert "' Paris'" in last and "steering at" in out


def test_one_eager_capture_equals_the_hf_forward() -> None:
    pytest.importorskip("ie_eager")
    import torch
    from ie_core import capture, load_model

    model = load_model("ie-synthetic/llama", backend="eager", device="cpu", dtype="float32")
    ids = model.to_tokens("Hello world, hello")
    got = capture(model, [ids], ["resid_post.0"])["resid_post.0"]
    with torch.no_grad():
        hidden = model.hf_model(input_ids=torch.tensor([ids]), output_hidden_states=True)
    # hidden_states[1] is block 0's output; [0] (the embeddings) is the plausible wrong read.
    assert torch.allclose(got, hidden.hidden_states[1], atol=1e-5, rtol=0)
    assert not torch.allclose(got, hidden.hidden_states[0], atol=1e-3)


def test_the_dashboard_starts_and_renders_the_cheat_sheet(tmp_path: Path) -> None:
    pytest.importorskip("ie_dashboard")
    from fastapi.testclient import TestClient
    from ie_dashboard.app import create_app

    with TestClient(create_app(str(tmp_path / "dashboard.sqlite"), token=None)) as client:
        page = client.get("/", params={"arch": "llama"})
    assert page.status_code == 200
    assert 'id="pt-resid_post"' in page.text and 'id="pt-attn_probs"' in page.text
