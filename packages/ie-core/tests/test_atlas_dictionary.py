"""The atlas's dictionary sources and the checks it runs before any model loads (no model here:
circuit-tracer files written by `write_layer_file`, and a bare config.json)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from ie_core.atlas.dictionary import check_against_config, read_dictionary
from ie_core.circuits.transcoders import random_transcoder, write_layer_file
from ie_core.errors import DictionaryFormatError, DictionaryShapeError


def _folder(tmp_path: Path, layers: int = 2, d_model: int = 16) -> Path:
    folder = tmp_path / "transcoders"
    folder.mkdir()
    for layer in range(layers):
        tc = random_transcoder(d_model, 8, layer, seed=layer, activation="jumprelu")
        write_layer_file(tc, folder / f"layer_{layer}.safetensors")
    return folder


def test_a_layer_of_a_circuit_tracer_folder_or_its_file(tmp_path: Path) -> None:
    folder = _folder(tmp_path)
    from_folder = read_dictionary(folder, layer=1)
    from_file = read_dictionary(folder / "layer_1.safetensors")
    assert (from_folder.address, from_folder.out_address) == ("mlp_in.1", "mlp_out.1")
    assert from_folder.key == from_file.key
    assert from_folder.key != read_dictionary(folder, layer=0).key  # another layer's weights
    with pytest.raises(DictionaryFormatError, match="--layer L"):
        read_dictionary(folder)
    with pytest.raises(DictionaryShapeError, match=r"layers 0\.\.1, not 5"):
        read_dictionary(folder, layer=5)


def test_non_finite_weights_are_refused(tmp_path: Path) -> None:
    from safetensors.torch import load_file, save_file

    folder = _folder(tmp_path)
    path = folder / "layer_0.safetensors"
    weights = load_file(str(path))
    weights["b_enc"][2] = float("inf")
    save_file(weights, str(path))
    with pytest.raises(DictionaryFormatError, match="b_enc holds 1 NaN or inf"):
        read_dictionary(path)
    assert torch.isfinite(read_dictionary(folder / "layer_1.safetensors").weights["b_enc"]).all()


def test_config_contradictions_are_refused(tmp_path: Path) -> None:
    sae = read_dictionary(_folder(tmp_path, d_model=16) / "layer_1.safetensors")
    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text(json.dumps({"hidden_size": 16, "num_hidden_layers": 4}))
    check_against_config(sae, model)  # fits: nothing raised
    (model / "config.json").write_text(json.dumps({"hidden_size": 32, "num_hidden_layers": 4}))
    with pytest.raises(DictionaryShapeError, match=r"16-wide rows but mlp_in\.1 is 32 wide"):
        check_against_config(sae, model)
    (model / "config.json").write_text(json.dumps({"hidden_size": 16, "num_hidden_layers": 1}))
    with pytest.raises(DictionaryShapeError, match="has 1 layers"):
        check_against_config(sae, model)
    check_against_config(sae, None)  # no folder (a Hub id): judged after the load instead
