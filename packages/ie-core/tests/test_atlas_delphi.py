"""`ie atlas delphi`: an atlas exported as delphi's latent cache is read by the released
eai-delphi 0.1.3 (its own `LatentDataset`, constructor and sampler, in its own environment), and
what delphi reads equals a brute force over the activations the atlas was built from.

The environment is built once by `scripts/delphi_env.sh` (network: PyPI) under
`~/.cache/interp-engine/delphi-0.1.3` (or `$IE_DELPHI_ENV`); without it the delphi tests skip,
naming that command. The layout checks that need no delphi run always.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch
from atlas_synthetic import write_synthetic_atlas
from ie_core.atlas.command import atlas_command
from ie_core.atlas.errors import AtlasError
from safetensors.torch import load_file

ROOT = Path(__file__).resolve().parents[3]
ENV = Path(os.environ.get("IE_DELPHI_ENV") or Path.home() / ".cache/interp-engine/delphi-0.1.3")
PYTHON = ENV / "bin" / "python"
D_SAE, CONTEXT, VOCAB = 48, 32, 300
MODULE = "mlp_in.5"

# Run in delphi's environment: its loader over the export, then its constructor and sampler
# (LatentDataset's iteration) with a word-level tokenizer over the synthetic vocabulary.
DELPHI_SCRIPT = """
import json, sys
from tokenizers import Tokenizer, models
from transformers import PreTrainedTokenizerFast
from delphi.config import ConstructorConfig, SamplerConfig
from delphi.latents import LatentDataset

raw_dir, module, vocab = sys.argv[1], sys.argv[2], int(sys.argv[3])
words = {f"w{i}": i for i in range(vocab)}
tokenizer = PreTrainedTokenizerFast(tokenizer_object=Tokenizer(models.WordLevel(words, unk_token="w0")))
dataset = LatentDataset(
    raw_dir, SamplerConfig(n_examples_train=4, n_examples_test=4, n_quantiles=2, train_type="top"),
    ConstructorConfig(example_ctx_len=16, min_examples=1, n_non_activating=2,
                      non_activating_source="random"),
    tokenizer=tokenizer, modules=[module],
)
buffers = {}
for buffer in dataset.buffers:
    latents, locations, activations = buffer.load_data_per_latent()
    for f, loc, act in zip(latents.tolist(), locations, activations):
        buffers[f] = sorted([int(w), int(p), float(a)] for (w, p, _), a in zip(loc.tolist(), act.tolist()))
records = {}
for record in dataset:
    records[record.latent.latent_index] = {
        "max": float(record.max_activation), "examples": len(record.examples),
        "train_tokens": record.train[0].str_tokens if record.train else [],
    }
print(json.dumps({"tokens": list(dataset.tokens.shape), "buffers": buffers, "records": records}))
"""


@pytest.fixture(scope="module")
def exported(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    tmp = tmp_path_factory.mktemp("delphi")
    data = write_synthetic_atlas(
        tmp / "atlas", d_sae=D_SAE, windows=40, context=CONTEXT, vocab=VOCAB, k=3, samples=2,
        address=MODULE, fire=0.02,
    )  # fmt: skip
    out = tmp / "latents"
    rc = atlas_command(["delphi", str(data.folder), "--out", str(out), "--splits", "3"])
    assert rc == 0
    return {"data": data, "out": out}


def _brute(data: Any, bands: bool = True) -> dict[int, list[list[float]]]:
    """Per feature: (window row among the kept windows, position, activation) of every firing
    in the windows the atlas kept for that feature (`bands=False`: its top contexts' only),
    from the synthetic activations."""
    state = data.state
    kept = torch.cat([state.top_sequence.flatten(), state.sample_sequence.flatten()])
    windows = sorted(set(kept[kept >= 0].tolist()))
    row_of = {w: i for i, w in enumerate(windows)}
    out: dict[int, list[list[float]]] = {}
    for f in range(state.d_sae):
        own = state.top_sequence[f].flatten()
        if bands:
            own = torch.cat([own, state.sample_sequence[f].flatten()])
        rows = []
        for w in sorted(set(own[own >= 0].tolist())):
            acts = data.acts[w, :, f]
            rows += [[row_of[w], p, float(acts[p])] for p in (acts > 0).nonzero()[:, 0].tolist()]
        if rows:
            out[f] = sorted(rows)
    return out


def test_the_files_are_delphis_layout(exported: dict[str, Any]) -> None:
    folder = exported["out"] / MODULE
    names = sorted(p.name for p in folder.iterdir())
    assert names == ["0_15.safetensors", "16_31.safetensors", "32_47.safetensors", "config.json"]
    config = json.loads((folder / "config.json").read_text())
    assert config["cache_ctx_len"] == CONTEXT and config["model_name"] == "ie-synthetic/llama"
    part = load_file(str(folder / "16_31.safetensors"))
    assert part["locations"].shape[1] == 3 and part["locations"][:, 2].max() < 16
    assert part["tokens"].shape[1] == CONTEXT and part["activations"].dtype == torch.float32


def test_a_bad_module_name_or_a_full_folder_is_refused(
    exported: dict[str, Any], tmp_path: Path
) -> None:
    folder = str(exported["data"].folder)
    with pytest.raises(AtlasError, match="not empty"):
        atlas_command(["delphi", folder, "--out", str(exported["out"])])
    with pytest.raises(AtlasError, match="not a folder name"):
        atlas_command(["delphi", folder, "--out", str(tmp_path), "--module", "../x"])
    with pytest.raises(AtlasError, match="--splits 0"):
        atlas_command(["delphi", folder, "--out", str(tmp_path), "--splits", "0"])


@pytest.mark.skipif(
    not PYTHON.exists(),
    reason=f"no eai-delphi 0.1.3 environment at {ENV}: create it with scripts/delphi_env.sh "
    "(network: PyPI), or point IE_DELPHI_ENV at one",
)
def test_released_delphi_reads_the_export(exported: dict[str, Any]) -> None:
    done = subprocess.run(
        [str(PYTHON), "-c", DELPHI_SCRIPT, str(exported["out"]), MODULE, str(VOCAB)],
        capture_output=True, text=True, timeout=600, cwd=exported["out"],
        env={k: v for k, v in os.environ.items() if not k.startswith(("VIRTUAL_ENV", "PYTHONPATH"))}
        | {"HF_HUB_OFFLINE": "1"},
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    got = json.loads(done.stdout.strip().splitlines()[-1])
    want = _brute(exported["data"])
    buffers = {int(f): rows for f, rows in got["buffers"].items()}
    assert sorted(buffers) == sorted(want)
    for f, rows in want.items():
        assert [r[:2] for r in buffers[f]] == [r[:2] for r in rows], f
        assert [r[2] for r in buffers[f]] == pytest.approx([r[2] for r in rows], rel=1e-6), f
    # delphi's records: one per feature that fired, its max the atlas's top value.
    records = {int(f): r for f, r in got["records"].items()}
    assert sorted(records) == sorted(want)
    state = exported["data"].state
    for f, record in records.items():
        assert record["max"] == pytest.approx(float(state.top_values[f, 0]), rel=1e-6)
        assert all(t.startswith("w") for t in record["train_tokens"])

    # Negative control: the same comparison against an export of the top contexts alone (the
    # band samples' windows dropped) fails.
    def places(found: dict[int, list[list[float]]]) -> dict[int, list[list[float]]]:
        return {f: [r[:2] for r in rows] for f, rows in found.items()}

    assert places(_brute(exported["data"], bands=False)) != places(buffers)
    print(f"delphi read {len(records)} features from {got['tokens']} tokens", file=sys.stderr)
