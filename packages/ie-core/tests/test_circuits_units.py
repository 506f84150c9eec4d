"""ie_core.circuits without a model: circuit-tracer's per-layer and cross-layer (CLT) folder
formats (round trip, config hooks, refusals), influence pruning on hand-built graphs against hand-computed shares,
and the family refusal of the frozen replacement."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from ie_core.circuits import (
    AttributionInputError,
    Graph,
    LogitTarget,
    ReplacementUnsupportedError,
    TranscoderFormatError,
    TranscoderLayerError,
    TranscoderSet,
    TranscoderWidthError,
    load_transcoders,
    prune,
    random_transcoder,
    write_layer_file,
)
from ie_core.circuits.clt import random_clt, write_clt
from ie_core.circuits.influence import normalized, path_influence
from ie_core.circuits.weights import weights_of
from safetensors.torch import save_file


def _folder(tmp_path: Path, n: int = 3, activation: str = "jumprelu") -> Path:
    for layer in range(n):
        tc = random_transcoder(16, 8, layer, seed=layer, activation=activation)
        write_layer_file(tc, tmp_path / f"layer_{layer}.safetensors")
    return tmp_path


def test_folder_round_trip(tmp_path: Path) -> None:
    ts = load_transcoders(_folder(tmp_path))
    assert ts.n_layers == 3 and ts.scan == tmp_path.name
    want = random_transcoder(16, 8, 1, seed=1, activation="jumprelu")
    got = ts.transcoders[1]
    assert (got.address, got.out_address, got.meta.activation) == (
        "mlp_in.1",
        "mlp_out.1",
        "jumprelu",
    )
    for k in ("W_enc", "W_dec", "b_enc", "b_dec", "threshold"):
        torch.testing.assert_close(got.weights[k], want.weights[k], rtol=0, atol=0)
    ts.check(3, 16)


def test_config_yaml_lists_files_and_hooks(tmp_path: Path) -> None:
    folder = _folder(tmp_path, 2, activation="relu")
    (folder / "config.yaml").write_text(
        "model_kind: transcoder_set\nscan: my-scan\nfeature_input_hook: mlp.hook_in\n"
        "feature_output_hook: mlp.hook_out\ntranscoders:\n- layer_0.safetensors\n"
        "- layer_1.safetensors\n"
    )
    ts = load_transcoders(folder)
    assert ts.scan == "my-scan" and ts.transcoders[0].meta.activation == "relu"
    (folder / "config.yaml").write_text(
        "model_kind: transcoder_set\nfeature_input_hook: hook_resid_mid\n"
    )
    with pytest.raises(TranscoderFormatError, match="hook_resid_mid"):
        load_transcoders(folder)
    (folder / "config.yaml").write_text("model_kind: sparse_autoencoder\n")
    with pytest.raises(TranscoderFormatError, match="'cross_layer_transcoder'"):
        load_transcoders(folder)
    (folder / "config.yaml").write_text("model_kind: cross_layer_transcoder\n")
    with pytest.raises(TranscoderFormatError, match="no W_enc_<L>"):
        load_transcoders(folder)


def test_clt_folder_round_trip(tmp_path: Path) -> None:
    want = random_clt(16, 8, 3, seed=4, activation="jumprelu")
    write_clt(want, tmp_path)
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        f"W_{kind}_{layer}.safetensors" for kind in ("dec", "enc") for layer in range(3)
    ]
    got = load_transcoders(tmp_path)
    assert got.is_cross_layer and got.n_layers == 3 and got.scan == tmp_path.name
    for layer in range(3):
        assert tuple(got.decoders(layer).shape) == (8, 3 - layer, 16)
        torch.testing.assert_close(got.decoders(layer), want.decoders(layer), rtol=0, atol=0)
        a, b = got.transcoders[layer], want.transcoders[layer]
        assert (a.address, a.out_address, a.meta.activation) == (
            f"mlp_in.{layer}",
            f"mlp_out.{layer}",
            "jumprelu",
        )
        for k in ("W_enc", "W_dec", "b_enc", "b_dec", "threshold"):
            torch.testing.assert_close(a.weights[k], b.weights[k], rtol=0, atol=0)
    got.check(3, 16)
    (tmp_path / "config.yaml").write_text(
        "model_kind: cross_layer_transcoder\nfeature_input_hook: hook_resid_mid\n"
    )
    with pytest.raises(TranscoderFormatError, match="hook_resid_mid"):
        load_transcoders(tmp_path)


def test_clt_refusals(tmp_path: Path) -> None:
    write_clt(random_clt(16, 8, 3, seed=4), tmp_path)
    dec = tmp_path / "W_dec_1.safetensors"
    save_file({"W_dec_1": torch.zeros(8, 3, 16)}, str(dec))  # one layer too many
    with pytest.raises(TranscoderWidthError, match=r"\[8, 2, 16\]"):
        load_transcoders(tmp_path)
    save_file({"W_dec_1": torch.zeros(16, 2, 8)}, str(dec))  # transposed feature / model axes
    with pytest.raises(TranscoderFormatError, match="W_dec_1 is"):
        load_transcoders(tmp_path)
    dec.unlink()
    with pytest.raises(TranscoderFormatError, match=r"W_dec_1\.safetensors is missing"):
        load_transcoders(tmp_path)
    write_clt(random_clt(16, 8, 3, seed=4), tmp_path)
    enc = tmp_path / "W_enc_1.safetensors"
    save_file({"W_enc_1": torch.zeros(8, 16), "W_skip_1": torch.zeros(16, 16)}, str(enc))
    with pytest.raises(TranscoderFormatError, match="skip connection"):
        load_transcoders(tmp_path)
    enc.unlink()
    with pytest.raises(TranscoderLayerError, match=r"misses encoder layer\(s\) \[1\]"):
        load_transcoders(tmp_path)
    with pytest.raises(TranscoderFormatError, match="not topk"):
        write_clt(random_clt(16, 8, 2, seed=1, activation="topk", k=2), tmp_path / "t")
    with pytest.raises(TranscoderFormatError, match="cross-layer sets"):
        write_clt(TranscoderSet((random_transcoder(16, 8, 0, seed=0),)), tmp_path / "p")


def test_refusals(tmp_path: Path) -> None:
    folder = _folder(tmp_path)
    (folder / "layer_1.safetensors").unlink()
    with pytest.raises(TranscoderLayerError, match=r"misses layer\(s\) \[1\]"):
        load_transcoders(folder)
    g = torch.Generator().manual_seed(0)
    base = {k: torch.randn(*s, generator=g) for k, s in
            (("W_enc", (8, 16)), ("W_dec", (8, 16)), ("b_enc", (8,)), ("b_dec", (16,)))}  # fmt: skip
    save_file(base | {"W_skip": torch.zeros(16, 16)}, str(folder / "layer_1.safetensors"))
    with pytest.raises(TranscoderFormatError, match="skip connection"):
        load_transcoders(folder)
    save_file(base | {"W_dec": base["W_dec"].T.contiguous()}, str(folder / "layer_1.safetensors"))
    with pytest.raises(TranscoderFormatError, match=r"\[d_transcoder, d_model\]"):
        load_transcoders(folder)
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(TranscoderFormatError, match="no layer_"):
        load_transcoders(empty)
    with pytest.raises(TranscoderLayerError, match=r"reads mlp_in\.0"):
        TranscoderSet((random_transcoder(16, 8, 0, seed=0),) * 2)
    with pytest.raises(ReplacementUnsupportedError, match="gpt_neox"):
        weights_of(SimpleNamespace(config=SimpleNamespace(model_type="gpt_neox")))


def _graph(adjacency: torch.Tensor, n_features: int, probs: list[float]) -> Graph:
    """A graph with 1 layer, 1 position: features, 1 error, 1 token, len(probs) logits."""
    return Graph(
        prompt="x", tokens=(5,), token_strings=("x",), n_layers=1,
        active_features=torch.tensor([[0, 0, i] for i in range(n_features)]),
        activation_values=torch.ones(n_features),
        selected_features=torch.arange(n_features),
        logit_targets=tuple(LogitTarget(i, str(i), p) for i, p in enumerate(probs)),
        adjacency=adjacency, node_inputs=torch.zeros(len(adjacency)),
        node_bias=torch.zeros(len(adjacency)),
    )  # fmt: skip


def test_influence_is_the_path_sum() -> None:
    # token(3) -> f0 (w 2), token -> f1 (w 1), f0 -> logit(4) (w 3), f1 -> logit (w -1),
    # error(2) -> logit (w 4). Nodes: f0, f1, err, tok, logit.
    a = torch.zeros(5, 5)
    a[0, 3], a[1, 3], a[4, 0], a[4, 1], a[4, 2] = 2.0, 1.0, 3.0, -1.0, 4.0
    w = torch.tensor([0, 0, 0, 0, 1.0])
    infl = path_influence(normalized(a), w)
    # logit's row normalised: f0 3/8, f1 1/8, err 4/8; tok gets 3/8 + 1/8 through the features.
    torch.testing.assert_close(infl, torch.tensor([3 / 8, 1 / 8, 4 / 8, 4 / 8, 0.0]))
    pr = prune(_graph(a, 2, [1.0]), node_threshold=0.8, edge_threshold=1.0)
    # Sorted influences 4/8, 4/8, 3/8, 1/8 (total 12/8): 0.8 of the total is reached at 3/8,
    # so f1 (1/8) is dropped; token and logit always stay.
    assert pr.node_mask.tolist() == [True, False, True, True, True]
    assert not pr.edge_mask[1].any() and not pr.edge_mask[:, 1].any()
    assert bool(pr.edge_mask[4, 0]) and bool(pr.edge_mask[0, 3])


def test_absurd_thresholds_are_refused() -> None:
    g = _graph(torch.zeros(4, 4), 1, [1.0])
    for bad in (1.01, -0.5, float("nan")):
        with pytest.raises(AttributionInputError, match="node_threshold"):
            prune(g, node_threshold=bad)
        with pytest.raises(AttributionInputError, match="edge_threshold"):
            prune(g, edge_threshold=bad)
