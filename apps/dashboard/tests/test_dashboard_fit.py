"""The model's memory page (`/fit`): `ie fit`'s table from a model folder's config.json and
safetensors header, linked from a validation run; a refused query is a 400 with the reason."""

from __future__ import annotations

import json
import struct
from pathlib import Path

from fastapi.testclient import TestClient
from ie_core.fit import fit
from ie_dashboard.app import create_app
from ie_dashboard.links import Links

CONFIG = {
    "architectures": ["LlamaForCausalLM"], "hidden_size": 64, "intermediate_size": 128,
    "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
    "vocab_size": 1000, "max_position_embeddings": 512, "torch_dtype": "float32",
}  # fmt: skip


def _folder(root: Path, config: dict[str, object]) -> Path:
    root.mkdir()
    (root / "config.json").write_text(json.dumps(config))
    header = {"w": {"dtype": "F32", "shape": [1000, 64], "data_offsets": [0, 256_000]}}
    data = json.dumps(header).encode()
    (root / "model.safetensors").write_bytes(struct.pack("<Q", len(data)) + data)
    return root


def test_the_memory_page_shows_ie_fits_table(tmp_path: Path) -> None:
    folder = _folder(tmp_path / "m", CONFIG)
    want = fit(folder, "eager", gpu="T4", max_model_len=256)
    with TestClient(create_app(str(tmp_path / "d.sqlite"), token=None)) as c:
        page = c.get("/fit", params={"model": str(folder), "backend": "eager", "gpu": "T4",
                                     "tokens": 256})  # fmt: skip
        assert page.status_code == 200, page.text
        assert want.verdict() in page.text
        for item in want.items:
            assert f'<td>{item.name}</td><td class="num">{item.nbytes / 2**30:.3f}' in page.text
        bad = dict(CONFIG)
        del bad["vocab_size"]
        refused = c.get("/fit", params={"model": str(_folder(tmp_path / "b", bad))})
        assert refused.status_code == 400
        assert "has no `vocab_size`" in refused.text


def test_a_validation_run_links_its_memory_page_live_only() -> None:
    assert Links().fit("org/m", "vllm") == "/fit?model=org%2Fm&backend=vllm"
    assert Links.for_static_page("validation").fit("org/m", "vllm") is None
