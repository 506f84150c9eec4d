"""`ie fit` from config.json and safetensors headers only (`ie_core.fit`), no engine.

Published figures: the Hugging Face Hub model pages' parameter counts (from the repos'
safetensors metadata): meta-llama/Llama-3.1-8B 8.03B, mistralai/Mistral-7B-v0.1 7.24B, both
stored in bf16. The fixtures are each model's real config.json fields and header-only safetensors
files (dtype and shape per tensor, no data) listing the architecture's tensors, so the price is
read from headers as it is for a real checkpoint; weights must be within 2% of the published
figure, and a header listing full-width K/V projections (no grouped-query attention) must not.
"""

from __future__ import annotations

import json
import math
import struct
import subprocess
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pytest
from ie_core.fit import ConfigFieldError, FitSourceError, fit, model_shape, node_count
from ie_core.fit.checkpoint import read_hub

LLAMA_31_8B = {
    "architectures": ["LlamaForCausalLM"], "hidden_size": 4096, "intermediate_size": 14336,
    "num_hidden_layers": 32, "num_attention_heads": 32, "num_key_value_heads": 8,
    "vocab_size": 128256, "max_position_embeddings": 131072, "torch_dtype": "bfloat16",
    "tie_word_embeddings": False,
}  # fmt: skip
MISTRAL_7B = {
    "architectures": ["MistralForCausalLM"], "hidden_size": 4096, "intermediate_size": 14336,
    "num_hidden_layers": 32, "num_attention_heads": 32, "num_key_value_heads": 8,
    "vocab_size": 32000, "max_position_embeddings": 32768, "sliding_window": 4096,
    "torch_dtype": "bfloat16", "tie_word_embeddings": False,
}  # fmt: skip
PUBLISHED_PARAMETERS = {"llama-3.1-8b": 8.03e9, "mistral-7b-v0.1": 7.24e9}
BF16 = 2
pytest.importorskip("ie_vllm.memory_prices")  # the vllm backend prices the KV cache


def _tensors(c: Mapping[str, Any]) -> dict[str, tuple[int, ...]]:
    """A Llama-layout checkpoint's tensors (HF names) from its config."""
    d, n, v = c["hidden_size"], c["intermediate_size"], c["vocab_size"]
    hd = d // c["num_attention_heads"]
    kv = c["num_key_value_heads"] * hd
    out: dict[str, tuple[int, ...]] = {
        "model.embed_tokens.weight": (v, d),
        "model.norm.weight": (d,),
    }
    for i in range(c["num_hidden_layers"]):
        p = f"model.layers.{i}."
        out |= {
            p + "self_attn.q_proj.weight": (d, d), p + "self_attn.k_proj.weight": (kv, d),
            p + "self_attn.v_proj.weight": (kv, d), p + "self_attn.o_proj.weight": (d, d),
            p + "mlp.gate_proj.weight": (n, d), p + "mlp.up_proj.weight": (n, d),
            p + "mlp.down_proj.weight": (d, n), p + "input_layernorm.weight": (d,),
            p + "post_attention_layernorm.weight": (d,),
        }  # fmt: skip
    if not c.get("tie_word_embeddings"):
        out["lm_head.weight"] = (v, d)
    return out


def _header_only(path: Path, tensors: Mapping[str, tuple[int, ...]], dtype: str = "BF16") -> None:
    """A safetensors header naming `tensors` (offsets as if the data followed), no data."""
    header, offset = {}, 0
    for name, shape in tensors.items():
        size = math.prod(shape) * BF16
        header[name] = {
            "dtype": dtype,
            "shape": list(shape),
            "data_offsets": [offset, offset + size],
        }
        offset += size
    data = json.dumps(header).encode()
    path.write_bytes(struct.pack("<Q", len(data)) + data)


def _folder(root: Path, config: Mapping[str, Any], shards: int = 2) -> Path:
    """config.json and `shards` header-only files with an index, as a sharded Hub checkpoint."""
    root.mkdir(parents=True)
    (root / "config.json").write_text(json.dumps(config))
    names = list(_tensors(config).items())
    weight_map = {}
    for s in range(shards):
        part = dict(names[s::shards])
        file = f"model-{s + 1:05d}-of-{shards:05d}.safetensors"
        _header_only(root / file, part)
        weight_map |= dict.fromkeys(part, file)
    (root / "model.safetensors.index.json").write_text(json.dumps({"weight_map": weight_map}))
    return root


@pytest.mark.parametrize(
    ("name", "config"), [("llama-3.1-8b", LLAMA_31_8B), ("mistral-7b-v0.1", MISTRAL_7B)]
)
def test_weights_match_published_sizes_within_2_percent(
    name: str, config: dict[str, Any], tmp_path: Path
) -> None:
    published = PUBLISHED_PARAMETERS[name] * BF16
    report = fit(_folder(tmp_path / name, config), "vllm", gpu="H100", max_model_len=4096)
    weights = next(i.nbytes for i in report.items if i.name == "weights")
    assert abs(weights - published) <= 0.02 * published, (weights, published)
    assert report.dtype == "bfloat16"  # the config's dtype on a GPU
    # Negative control: every head with its own K and V (no GQA) is far from the published size.
    mha = {**config, "num_key_value_heads": config["num_attention_heads"]}
    wrong = fit(_folder(tmp_path / "mha", mha), "vllm", gpu="H100", max_model_len=4096)
    wrong_weights = next(i.nbytes for i in wrong.items if i.name == "weights")
    assert abs(wrong_weights - published) > 0.02 * published


def test_kv_floor_counts_kv_heads_and_the_sliding_window(tmp_path: Path) -> None:
    """Mistral-7B: 2 x 8 kv heads x 128 x 2 B x 32 layers = 128 KiB per token, held for at most
    its 4,096-token window; Llama-3.1-8B has no window."""
    mistral = _folder(tmp_path / "m", MISTRAL_7B)
    at_4k = fit(mistral, "vllm", gpu="H100", max_model_len=4096, streams=2)
    at_32k = fit(mistral, "vllm", gpu="H100", max_model_len=32768, streams=2)
    floor = {r.tokens: next(i.nbytes for i in r.items if i.name == "KV cache floor")
             for r in (at_4k, at_32k)}  # fmt: skip
    assert floor[4096] == 2 * 4096 * 128 * 1024
    assert floor[32768] == floor[4096]
    llama = fit(_folder(tmp_path / "l", LLAMA_31_8B), "vllm", gpu="H100", max_model_len=32768)
    assert next(i.nbytes for i in llama.items if i.name == "KV cache floor") == 32768 * 128 * 1024


def test_gemma_sliding_layers_follow_the_family() -> None:
    base = {"hidden_size": 2304, "num_hidden_layers": 26, "num_attention_heads": 8,
            "vocab_size": 256000, "sliding_window": 4096}  # fmt: skip
    assert model_shape({**base, "architectures": ["Gemma2ForCausalLM"]}).sliding_layers == 13
    assert model_shape({**base, "sliding_window_pattern": 6}).sliding_layers == 26 - 4
    types = ["sliding_attention", "full_attention"] * 13
    assert model_shape({**base, "layer_types": types}).sliding_layers == 13


def test_a_config_without_a_needed_field_is_refused_by_name(tmp_path: Path) -> None:
    config = {k: v for k, v in LLAMA_31_8B.items() if k != "num_hidden_layers"}
    folder = _folder(tmp_path / "x", {**config, "num_hidden_layers": 1})
    (folder / "config.json").write_text(json.dumps(config))
    with pytest.raises(ConfigFieldError, match="has no `num_hidden_layers`"):
        fit(folder, "vllm", gpu="H100")
    cli = subprocess.run(
        [sys.executable, "-m", "ie_core.tooling.cli", "fit", str(folder), "--gpu", "H100"],
        capture_output=True, text=True, check=False,
    )  # fmt: skip
    assert cli.returncode == 2 and "num_hidden_layers" in cli.stderr, cli.stderr


def test_the_hub_path_refuses_offline_with_what_to_do(monkeypatch: pytest.MonkeyPatch) -> None:
    import huggingface_hub.constants

    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)
    with pytest.raises(FitSourceError, match=r"give a local folder holding config\.json"):
        read_hub("ie-tests/no-such-model")


def test_the_verdict_and_advice_when_it_does_not_fit(tmp_path: Path) -> None:
    folder = _folder(tmp_path / "l", LLAMA_31_8B)
    report = fit(folder, "vllm", gpu="T4", max_model_len=8192)
    assert not report.fits and report.margin < 0
    assert report.advice()[0].startswith("weights")
    assert "does not fit T4" in report.verdict()
    on_h100 = fit(folder, "vllm", gpu="H100", max_model_len=8192)
    assert on_h100.fits and on_h100.total == report.total
    data = json.loads(json.dumps(on_h100.to_json()))
    assert data["fits"] and data["total_bytes"] == sum(i["nbytes"] for i in data["items"])


def test_attribution_nodes_are_the_graph_layout() -> None:
    """circuit-tracer's node order: features, errors (layers x positions), tokens, logits."""
    assert node_count(100, 30, 6, 10) == 100 + 30 * 6 + 6 + 10


def test_an_address_past_the_last_layer_is_refused(tmp_path: Path) -> None:
    from ie_core.errors import LayerOutOfRangeError

    folder = _folder(tmp_path / "l", LLAMA_31_8B)
    with pytest.raises(LayerOutOfRangeError, match=r"layer 32 in resid_post\.32 is out of range"):
        fit(folder, "vllm", points=["resid_post.32"], gpu="H100", max_model_len=128)
    rows = fit(folder, "vllm", points=["resid_post.31"], gpu="H100", max_model_len=128)
    assert next(i.nbytes for i in rows.items if i.name.startswith("rows")) == 128 * 4096 * 2
