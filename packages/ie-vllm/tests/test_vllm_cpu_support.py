"""The known vLLM CPU failures are refused before an engine starts, quoting vLLM's own error,
and only for checkpoints that would hit them (no engine)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from ie_core.errors import UnsupportedModelError
from ie_vllm.host import cpu_support


def _folder(tmp_path: Path, **config: object) -> Path:
    tmp_path.mkdir(parents=True, exist_ok=True)
    (tmp_path / "config.json").write_text(json.dumps(config))
    return tmp_path


@pytest.fixture(autouse=True)
def _measured_release(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(cpu_support, "_vllm_version", lambda: cpu_support.MEASURED_ON)


def test_deepseek_v3_without_noaux_tc_is_refused_with_vllms_error(tmp_path: Path) -> None:
    folder = _folder(tmp_path, architectures=["DeepseekV3ForCausalLM"])
    with pytest.raises(UnsupportedModelError, match=r"e_score_correction_bias.*backend=.eager."):
        cpu_support.check_cpu_support(folder, "float32")
    # Negative control: a config that carries topk_method noaux_tc (real DeepSeek-V3) passes.
    arch = ["DeepseekV3ForCausalLM"]
    ok = _folder(tmp_path, architectures=arch, topk_method="noaux_tc")
    cpu_support.check_cpu_support(ok, "float32")
    # The synthetic latent (32 + 32) is a head size vLLM's MLA backends do not take.
    small = _folder(
        tmp_path, architectures=arch, topk_method="noaux_tc", kv_lora_rank=32, qk_rope_head_dim=32
    )
    with pytest.raises(UnsupportedModelError, match="not supported by MLA"):
        cpu_support.check_cpu_support(small, "float32")


def test_each_known_failure_applies_only_where_vllm_fails(tmp_path: Path) -> None:
    cases = [
        ({"architectures": ["DeepseekV4ForCausalLM"], "mlp_layer_types": ["moe"]}, "float32"),
        ({"architectures": ["Lfm2ForCausalLM"]}, "float32"),
        ({"architectures": ["Lfm2ForCausalLM"], "conv_dim": 128}, "float32"),
        ({"architectures": ["Qwen3NextForCausalLM"]}, "float32"),
    ]
    for config, dtype in cases:
        with pytest.raises(UnsupportedModelError, match=r"vLLM 0\.32\.0 \(CPU\) cannot run"):
            cpu_support.check_cpu_support(_folder(tmp_path, **config), dtype)
    passing = [
        ({"architectures": ["DeepseekV4ForCausalLM"], "mlp_layer_types": ["sparse"]}, "float32"),
        ({"architectures": ["Lfm2ForCausalLM"], "conv_dim": 128, "block_dim": 128}, "float32"),
        ({"architectures": ["Qwen3NextForCausalLM"]}, "bfloat16"),
        ({"architectures": ["LlamaForCausalLM"]}, "float32"),
    ]
    for config, dtype in passing:
        cpu_support.check_cpu_support(_folder(tmp_path, **config), dtype)


def test_other_vllm_releases_are_not_second_guessed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(cpu_support, "_vllm_version", lambda: "0.33.0")
    cpu_support.check_cpu_support(_folder(tmp_path, architectures=["Lfm2ForCausalLM"]), "float32")


def test_quantized_float32_is_refused_where_the_cpu_kernels_fail(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(cpu_support, "_amx", lambda: True)
    arch = ["LlamaForCausalLM"]

    def quant(fmt: str) -> dict[str, str]:
        return {"quant_method": "compressed-tensors", "format": fmt}

    w8a8 = _folder(tmp_path / "a", architectures=arch, quantization_config=quant("int-quantized"))
    with pytest.raises(UnsupportedModelError, match=r"int8_scaled_mm_with_quant.*bfloat16"):
        cpu_support.check_cpu_support(w8a8, "float32")
    w4 = _folder(tmp_path / "b", architectures=arch, quantization_config=quant("pack-quantized"))
    with pytest.raises(UnsupportedModelError, match=r"cpu_gemm_wna16.*dtype='bfloat16'"):
        cpu_support.check_cpu_support(w4, "float32")
    # Negative controls: the same checkpoints in bfloat16, and W8A8 where the CPU has no AMX
    # (vLLM takes its oneDNN path there; not measured, so not refused).
    cpu_support.check_cpu_support(w8a8, "bfloat16")
    cpu_support.check_cpu_support(w4, "bfloat16")
    monkeypatch.setattr(cpu_support, "_amx", lambda: False)
    cpu_support.check_cpu_support(w8a8, "float32")


def test_awq_is_refused_in_every_dtype(tmp_path: Path) -> None:
    awq = {"quant_method": "awq", "bits": 4, "group_size": 128, "zero_point": True}
    folder = _folder(tmp_path, architectures=["LlamaForCausalLM"], quantization_config=awq)
    for dtype in ("bfloat16", "float32"):
        with pytest.raises(UnsupportedModelError, match=r"AWQ.*exit code: -4.*pack-quantized"):
            cpu_support.check_cpu_support(folder, dtype)


def test_exact_int8_dot_reads_the_vnni_and_amx_flags() -> None:
    def info(flags: str) -> str:
        return f"processor\t: 0\nflags\t\t: fpu sse2 avx avx2 {flags}\nbugs\t\t: avx512_vnni\n"

    assert cpu_support.exact_int8_dot(info("avx512f avx512_vnni"))
    assert cpu_support.exact_int8_dot(info("avx_vnni"))
    assert cpu_support.exact_int8_dot(info("amx_tile amx_int8"))
    # Negative controls: AVX2 or AVX-512 without VNNI, and a name only on another line.
    assert not cpu_support.exact_int8_dot(info(""))
    assert not cpu_support.exact_int8_dot(info("avx512f avx512bw"))


def test_w8a8_on_a_cpu_without_exact_int8_dot_warns_with_the_measured_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    quant = {"quant_method": "compressed-tensors", "format": "int-quantized"}
    folder = _folder(tmp_path, architectures=["LlamaForCausalLM"], quantization_config=quant)
    monkeypatch.setattr(cpu_support, "exact_int8_dot", lambda: False)
    with caplog.at_level("WARNING", logger=cpu_support.__name__):
        cpu_support.check_cpu_support(folder, "bfloat16")
    assert "no VNNI or AMX" in caplog.text and "0.38" in caplog.text
    caplog.clear()
    # Negative controls: the same CPU on a 4-bit checkpoint, and W8A8 on a VNNI / AMX CPU.
    quant = {"quant_method": "compressed-tensors", "format": "pack-quantized"}
    cpu_support.check_cpu_support(_folder(tmp_path, quantization_config=quant), "bfloat16")
    monkeypatch.setattr(cpu_support, "exact_int8_dot", lambda: True)
    cpu_support.check_cpu_support(folder, "bfloat16")
    assert caplog.text == ""
