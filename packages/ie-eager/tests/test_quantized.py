"""Quantized variants `ie-synthetic/<family>-<scheme>`: the format written, byte-identical builds
in two processes, the names resolved, refusals, and eager's dequantization checked by hand."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from ie_core.errors import ModelNotFoundError
from ie_core.models import resolve_model_path
from ie_eager import quantized, synthetic
from safetensors.torch import load_file

_BUILD = (
    "import sys; from ie_core.models import resolve_model_path; "
    "[print(resolve_model_path(a)) for a in sys.argv[1:]]"
)
_VARIANTS = [f"ie-synthetic/llama-{s}" for s in sorted(quantized.SCHEMES)]


def _digests(folder: Path) -> dict[str, str]:
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(folder.iterdir())}


def _build_in_process(cache: Path) -> list[Path]:
    """Every variant built by a fresh interpreter into its own cache (one process, 3 builds)."""
    env = {**os.environ, "IE_CACHE_DIR": str(cache)}
    out = subprocess.run(
        [sys.executable, "-c", _BUILD, *_VARIANTS], env=env, check=True, capture_output=True
    )
    return [Path(line) for line in out.stdout.decode().strip().splitlines()[-len(_VARIANTS) :]]


@pytest.fixture(scope="module")
def cache(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("qcache")


@pytest.fixture(scope="module")
def built(cache: Path) -> list[Path]:
    """Every variant built in this process into the module's cache."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("IE_CACHE_DIR", str(cache))
        return [synthetic.source(v) for v in _VARIANTS]


def test_two_processes_write_the_same_bytes(built: list[Path], tmp_path: Path) -> None:
    firsts, seconds = built, _build_in_process(tmp_path)
    for scheme, first, second in zip(sorted(quantized.SCHEMES), firsts, seconds, strict=True):
        assert first.name == second.name == f"llama-{synthetic.BUILD_VERSION}-{scheme}-q1"
        assert _digests(first) == _digests(second)
        assert set(_digests(first)) >= {"config.json", "model.safetensors", "tokenizer.json"}
    # The variants differ from each other (a negative control for the comparison above).
    assert len({_digests(f)["model.safetensors"] for f in firsts}) == len(firsts)


def test_names_split_at_a_known_scheme() -> None:
    assert quantized.split_variant("llama-w8a8") == ("llama", quantized.SCHEMES["w8a8"])
    assert quantized.split_variant("qwen3-moe") == ("qwen3-moe", None)
    assert quantized.split_variant("gpt-neox") == ("gpt-neox", None)


def test_unquantizable_family_and_unknown_family_are_refused(
    cache: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("IE_CACHE_DIR", str(cache))
    with pytest.raises(quantized.QuantizationUnavailableError, match="quantizer handles llama"):
        resolve_model_path("ie-synthetic/gpt2-w8a8")
    with pytest.raises(ModelNotFoundError, match="unknown synthetic family 'nope'"):
        resolve_model_path("ie-synthetic/nope-w8a8")


def test_missing_compressed_tensors_is_named(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "compressed_tensors", None)
    with pytest.raises(quantized.QuantizationUnavailableError, match=r"ie-eager\[quant\]"):
        quantized.build_variant("llama", Path("/nonexistent/llama-v1"), quantized.SCHEMES["w8a8"])


def test_w8a8_weights_are_int8_per_channel_and_dequantize_close(
    cache: Path, built: list[Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("IE_CACHE_DIR", str(cache))
    base = load_file(resolve_model_path("ie-synthetic/llama") / "model.safetensors")
    folder = resolve_model_path("ie-synthetic/llama-w8a8")
    state = load_file(folder / "model.safetensors")
    config = json.loads((folder / "config.json").read_text())["quantization_config"]
    assert config["format"] == "int-quantized" and config["ignore"] == ["lm_head"]
    name = "model.layers.2.mlp.down_proj"
    q, scale, w = state[f"{name}.weight"], state[f"{name}.weight_scale"], base[f"{name}.weight"]
    assert q.dtype == torch.int8 and scale.shape == (w.shape[0], 1)
    # Symmetric per channel, compressed-tensors' range: scale = absmax / 127.5.
    expected = w.abs().amax(dim=1, keepdim=True) / 127.5
    torch.testing.assert_close(scale, expected, rtol=1e-6, atol=0)
    error = (q.float() * scale - w).abs()
    assert bool((error <= scale / 2 + 1e-7).all())  # round to nearest, no clipping
    assert state["lm_head.weight"].dtype == torch.float32  # the unembed stays full precision
    torch.testing.assert_close(
        state["model.embed_tokens.weight"], base["model.embed_tokens.weight"]
    )
