"""Dictionary loading (SAELens, Gemma Scope, sparsify folders the test writes; tensors in memory)
and the shared encode, each against an encode written here from the format's own definition."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch
from ie_core.errors import (
    DictionaryAddressError,
    DictionaryDtypeError,
    DictionaryFormatError,
    DictionaryShapeError,
)
from ie_core.experiments.sae_math import encode, reconstruct, reduce_rows
from ie_core.experiments.saes import address_from_hook, from_tensors, load_sae
from safetensors.torch import save_file

D, F = 16, 48
TOL = 1e-5


def _weights(seed: int = 0, d_out: int = D) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return {
        "W_enc": torch.randn(D, F, generator=g) / 4,
        "b_enc": torch.randn(F, generator=g) / 4,
        "W_dec": torch.randn(F, d_out, generator=g) / 4,
        "b_dec": torch.randn(d_out, generator=g) / 4,
    }


def _x(seed: int = 1) -> torch.Tensor:
    return torch.randn(2, 5, D, generator=torch.Generator().manual_seed(seed))


def _saelens(tmp: Path, cfg: dict, w: dict[str, torch.Tensor]) -> Path:
    tmp.mkdir(parents=True, exist_ok=True)
    (tmp / "cfg.json").write_text(json.dumps(cfg))
    save_file({k: v.contiguous() for k, v in w.items()}, str(tmp / "sae_weights.safetensors"))
    return tmp


def test_saelens_relu_folder_matches_its_definition(tmp_path: Path) -> None:
    w = _weights()
    cfg = {"architecture": "standard", "d_in": D, "d_sae": F,
           "hook_name": "blocks.1.hook_resid_post", "apply_b_dec_to_input": True}  # fmt: skip
    sae = load_sae(_saelens(tmp_path / "s", cfg, w))
    assert (sae.address, sae.out_address, sae.meta.activation) == ("resid_post.1",) * 2 + ("relu",)
    x = _x()
    want = torch.relu((x - w["b_dec"]) @ w["W_enc"] + w["b_enc"])
    assert (encode(x, sae.weights, sae.meta) - want).abs().max() < TOL
    # Negative control: forgetting the b_dec subtraction changes the features.
    assert (torch.relu(x @ w["W_enc"] + w["b_enc"]) - want).abs().max() > 1e-2


def test_saelens_topk_and_transcoder(tmp_path: Path) -> None:
    w = _weights()
    cfg = {"architecture": "topk", "k": 5, "hook_name": "blocks.0.hook_mlp_out"}
    sae = load_sae(_saelens(tmp_path / "t", cfg, w))
    x = _x()
    pre = x @ w["W_enc"] + w["b_enc"]
    vals, ids = pre.topk(5, dim=-1)
    want = torch.zeros_like(pre).scatter(-1, ids, vals.clamp(min=0))
    assert sae.address == "mlp_out.0"
    assert (encode(x, sae.weights, sae.meta) - want).abs().max() < TOL
    assert int((encode(x, sae.weights, sae.meta) != 0).sum(-1).max()) <= 5
    tw = _weights(3, d_out=24)
    tc = {"hook_name": "blocks.2.ln2.hook_out", "hook_name_out": "blocks.2.hook_mlp_out"}
    tr = load_sae(_saelens(tmp_path / "tc", tc, tw))
    assert (tr.address, tr.out_address, tr.is_transcoder) == ("mlp_in.2", "mlp_out.2", True)
    assert torch.allclose(
        reconstruct(x, tr.weights, tr.meta),
        torch.relu(x @ tw["W_enc"] + tw["b_enc"]) @ tw["W_dec"] + tw["b_dec"],
        atol=TOL,
    )


def test_gemma_scope_jumprelu_folder(tmp_path: Path) -> None:
    w = _weights()
    thr = torch.rand(F) * 0.3
    folder = tmp_path / "gemma-scope-2b-pt-res" / "layer_3" / "width_16k" / "average_l0_50"
    folder.mkdir(parents=True)
    np.savez(folder / "params.npz", **{k: v.numpy() for k, v in w.items()}, threshold=thr.numpy())
    sae = load_sae(folder)
    assert (sae.address, sae.meta.activation, sae.meta.b_dec_in) == (
        "resid_post.3",
        "jumprelu",
        False,
    )
    x = _x()
    pre = x @ w["W_enc"] + w["b_enc"]
    want = (pre > thr) * torch.relu(pre)
    got = encode(x, sae.weights, sae.meta)
    assert (got - want).abs().max() < TOL
    assert int(((pre > 0) & (pre <= thr)).sum()) > 0  # the threshold matters here: a control


def test_sparsify_topk_folder(tmp_path: Path) -> None:
    w = _weights()
    folder = tmp_path / "layers.4"
    folder.mkdir()
    (folder / "cfg.json").write_text(json.dumps({"activation": "topk", "k": 4, "d_in": D}))
    save_file({"encoder.weight": w["W_enc"].T.contiguous(), "encoder.bias": w["b_enc"],
               "W_dec": w["W_dec"], "b_dec": w["b_dec"]}, str(folder / "sae.safetensors"))  # fmt: skip
    sae = load_sae(folder)
    assert (sae.address, sae.meta.k) == ("resid_post.4", 4)
    x = _x()
    pre = torch.relu((x - w["b_dec"]) @ w["W_enc"] + w["b_enc"])
    vals, ids = pre.topk(4, dim=-1)
    want = torch.zeros_like(pre).scatter(-1, ids, vals)
    assert (encode(x, sae.weights, sae.meta) - want).abs().max() < TOL
    out = reduce_rows(x, sae.weights, sae.meta, 3, True)
    assert torch.equal(out["values"], want.topk(3, dim=-1).values)
    fve = 1 - out["sq_error"] / out["sq_norm"]
    x_hat = want @ w["W_dec"] + w["b_dec"]
    want_fve = 1 - ((x - x_hat) ** 2).sum(-1) / ((x - x.mean(-1, keepdim=True)) ** 2).sum(-1)
    assert (fve - want_fve).abs().max() < 1e-4


def test_layer_norm_input_normalisation() -> None:
    w = _weights()
    sae = from_tensors(w, address="resid_post.0", normalize="layer_norm")
    x = _x() * 7 + 3
    mu = x.mean(-1, keepdim=True)
    std = (x - mu).std(-1, keepdim=True) + 1e-5
    acts = torch.relu(((x - mu) / std) @ w["W_enc"] + w["b_enc"])
    want = (acts @ w["W_dec"] + w["b_dec"]) * std + mu
    assert (reconstruct(x, sae.weights, sae.meta) - want).abs().max() < 1e-4


def test_named_errors_for_shape_dtype_address_format(tmp_path: Path) -> None:
    w = _weights()
    with pytest.raises(DictionaryShapeError, match="transposed"):
        from_tensors({**w, "W_dec": w["W_dec"].T}, address="resid_post.0")
    with pytest.raises(DictionaryDtypeError):
        from_tensors({**w, "b_enc": torch.zeros(F, dtype=torch.int64)}, address="resid_post.0")
    with pytest.raises(DictionaryAddressError):
        address_from_hook("blocks.1.hook_nothing")
    with pytest.raises(DictionaryFormatError, match="threshold"):
        from_tensors(w, address="resid_post.0", activation="jumprelu")
    with pytest.raises(DictionaryFormatError, match="holds no"):
        load_sae(tmp_path)
    with pytest.raises(DictionaryShapeError, match="transcoder"):
        from_tensors(_weights(d_out=24), address="resid_post.0")


def test_content_key_tells_dictionaries_apart() -> None:
    a, b = (
        from_tensors(_weights(0), address="resid_post.0"),
        from_tensors(_weights(0), address="resid_post.0"),
    )
    c = from_tensors(_weights(1), address="resid_post.0")
    assert a.key == b.key != c.key


def test_hub_id_reads_a_cached_snapshot(tmp_path: Path) -> None:
    """A Hub id resolved by huggingface_hub from its cache (no network here): the cache layout is
    written by the test, and the sub-folder names the dictionary inside the repo."""
    sha = "0" * 40
    repo = tmp_path / "models--someone--saes"
    (repo / "refs").mkdir(parents=True)
    (repo / "refs" / "main").write_text(sha)
    w = _weights()
    sub = repo / "snapshots" / sha / "blocks.2.hook_resid_pre"
    _saelens(sub, {"hook_name": "blocks.2.hook_resid_pre"}, w)
    hub = {"cache_dir": str(tmp_path), "local_files_only": True}
    sae = load_sae("someone/saes/blocks.2.hook_resid_pre", hub=hub)
    assert sae.address == "resid_pre.2"
    assert torch.equal(sae.weights["W_enc"], w["W_enc"])
