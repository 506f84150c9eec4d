"""The Jacobian lens's backend-free part: the transport `rows @ J_L.T` against a float64 loop,
the file round trip, the refusals word for word (no model: the matrices are given here), and
`jacobian_lens_topk` against a float64 decode on a stand-in backend.

Tolerance: 1e-5 relative (fp32 matmul against the float64 sum)."""

from __future__ import annotations

import asyncio
import math
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from ie_core.errors import LayerOutOfRangeError, UnsupportedModelError
from ie_core.experiments.jacobian_lens import JacobianLens, ajacobian_lens_topk, jacobian_lens_topk
from ie_core.protocol import TopK

D = 6


def _lens(layers: tuple[int, ...] = (0, 2)) -> JacobianLens:
    g = torch.Generator().manual_seed(0)
    mats = {layer: torch.randn(D, D, generator=g) for layer in layers}
    return JacobianLens("m", 3, D, mats, n_rows=17)


def test_transport_is_rows_times_the_transposed_jacobian() -> None:
    lens = _lens()
    rows = torch.randn(2, 4, D, generator=torch.Generator().manual_seed(1), dtype=torch.float64)
    j = lens.matrices[2].double()
    want = torch.zeros(2, 4, D, dtype=torch.float64)
    for i in range(D):  # out[..., i] = sum_k rows[..., k] * J[i, k]: row i of J is d out_i / d in
        for k in range(D):
            want[..., i] += rows[..., k] * j[i, k]
    got = lens.transport(rows, 2)
    assert got.dtype == torch.float32 and got.shape == (2, 4, D)
    torch.testing.assert_close(got.double(), want, rtol=1e-5, atol=1e-5)
    # Negative control: J instead of J.T gives another image.
    assert (rows.float() @ lens.matrices[2] - got).abs().max() > 1e-2
    # A list of rows is accepted like a tensor.
    torch.testing.assert_close(lens.transport(rows[0, 0].tolist(), 2), got[0, 0])


def test_a_saved_lens_loads_back_bit_for_bit(tmp_path: Path) -> None:
    lens = _lens()
    path = tmp_path / "lens.safetensors"
    lens.save(path)
    back = JacobianLens.load(path)
    assert (back.model_id, back.n_layers, back.d_model, back.n_rows) == ("m", 3, D, 17)
    assert back.layers == (0, 2)
    for layer in (0, 2):
        assert torch.equal(back.matrix(layer), lens.matrix(layer))


def test_a_file_of_another_format_is_refused(tmp_path: Path) -> None:
    from safetensors.torch import save_file

    path = tmp_path / "other.safetensors"
    save_file({"J.0": torch.zeros(D, D)}, str(path), metadata={"format": "something-else"})
    with pytest.raises(ValueError) as info:
        JacobianLens.load(path)
    assert str(info.value) == f"{path} is not a Jacobian lens file (ie-jacobian-lens/1)"


def test_refusals_read_exactly() -> None:
    lens = _lens()
    with pytest.raises(LayerOutOfRangeError) as info:
        lens.matrix(1)
    assert str(info.value) == (
        "this Jacobian lens holds layers [0, 2], not 1; compute it for that layer "
        "(jacobian_lens(model, prompts, layers=[...]))"
    )
    assert info.value.text == "resid_post.1"  # the address the caller asked for
    with pytest.raises(TypeError) as info:
        lens.matrix(True)
    assert str(info.value) == "layer must be an int, got bool True"
    with pytest.raises(ValueError) as info:
        lens.transport(torch.zeros(3, D + 1), 0)
    assert str(info.value) == f"rows must be [..., d_model={D}], got shape (3, {D + 1})"
    with pytest.raises(ValueError) as info:
        lens.transport(torch.tensor(1.0), 0)
    assert str(info.value) == f"rows must be [..., d_model={D}], got shape ()"
    with pytest.raises(LayerOutOfRangeError) as info:
        JacobianLens("m", 3, D, {3: torch.zeros(D, D)}, 1)
    assert str(info.value) == "layer 3 is out of range for a 3-layer model"
    assert info.value.text == "3"
    with pytest.raises(LayerOutOfRangeError):
        JacobianLens("m", 3, D, {-1: torch.zeros(D, D)}, 1)
    with pytest.raises(ValueError) as info:
        JacobianLens("m", 3, D, {0: torch.zeros(D, D - 1)}, 1)
    assert str(info.value) == f"J_0 has shape ({D}, {D - 1}), expected ({D}, {D})"


def test_a_model_of_another_shape_is_refused() -> None:
    lens = _lens()
    lens.check_model(SimpleNamespace(n_layers=3, d_model=D))  # the same shape passes
    with pytest.raises(UnsupportedModelError) as info:
        lens.check_model(SimpleNamespace(n_layers=4, d_model=D))
    assert str(info.value) == (
        f"this Jacobian lens was computed on m (3 layers, d_model {D}); the model has 4 layers, "
        f"d_model {D}"
    )
    with pytest.raises(UnsupportedModelError):
        lens.check_model(SimpleNamespace(n_layers=3, d_model=D + 1))


class _Decoder:
    """A stand-in backend for the lens's last step: its 'logit lens' is softmax(rows @ W.T) over a
    vocabulary of V, top-k by torch. It records what it was asked, so a wrong layer, rows or k
    shows in the answer as well as in the values."""

    def __init__(self, n_layers: int = 3, d_model: int = D, vocab: int = 12) -> None:
        self.n_layers, self.d_model = n_layers, d_model
        self.unembed = torch.randn(vocab, d_model, generator=torch.Generator().manual_seed(5))
        self.asked: list[tuple[torch.Tensor, int]] = []

    async def decode_residuals_topk(self, rows: torch.Tensor, k: int) -> TopK:
        self.asked.append((rows, k))
        probs = torch.softmax(rows.double() @ self.unembed.double().T, dim=-1)
        vals, ids = torch.topk(probs, k, dim=-1)
        return TopK(ids=ids, probs=vals)


def _reference_topk(
    lens: JacobianLens, rows: torch.Tensor, layer: int, unembed: torch.Tensor, k: int
) -> tuple[list[list[int]], list[list[float]]]:
    """Float64 loops: image_i = sum_c rows[c] * J[i, c]; logit_v = sum_i W[v, i] * image_i; a
    softmax over the vocabulary; the k largest, largest first."""
    j = lens.matrices[layer].double().tolist()
    w = unembed.double().tolist()
    all_ids, all_probs = [], []
    for row in rows.double().tolist():
        image = [sum(row[c] * j[i][c] for c in range(D)) for i in range(D)]
        logits = [sum(wv[i] * image[i] for i in range(D)) for wv in w]
        top = max(logits)
        exps = [math.exp(x - top) for x in logits]
        probs = [e / sum(exps) for e in exps]
        order = sorted(range(len(probs)), key=lambda v: -probs[v])[:k]
        all_ids.append(order)
        all_probs.append([probs[v] for v in order])
    return all_ids, all_probs


def test_jacobian_lens_topk_decodes_the_transported_rows() -> None:
    """jacobian_lens_topk (and its async form) against the float64 reference: the rows of the
    layer asked for, carried by that layer's J, decoded with the k asked for (default 10)."""
    lens = _lens()
    rows = torch.randn(3, D, generator=torch.Generator().manual_seed(2))
    model = _Decoder()
    for layer, k in ((2, 4), (0, 3)):
        got = jacobian_lens_topk(model, lens, rows, layer, k=k)
        ids, probs = _reference_topk(lens, rows, layer, model.unembed, k)
        assert got.ids.tolist() == ids
        torch.testing.assert_close(
            got.probs, torch.tensor(probs, dtype=torch.float64), rtol=1e-5, atol=1e-6
        )
        # Negative control: the other layer's matrix gives other tokens or probabilities.
        other = _reference_topk(lens, rows, 2 - layer, model.unembed, k)
        assert other != (ids, probs)
    # k defaults to 10 (the vocabulary here is 12, so 11 would show).
    got = jacobian_lens_topk(model, lens, rows, 2)
    assert got.ids.shape == (3, 10) and model.asked[-1][1] == 10
    assert got.ids.tolist() == _reference_topk(lens, rows, 2, model.unembed, 10)[0]
    # The async form answers the same, and hands the backend fp32 rows of the same shape.
    again = asyncio.run(ajacobian_lens_topk(model, lens, rows, 2, k=4))
    assert torch.equal(again.ids, jacobian_lens_topk(model, lens, rows, 2, k=4).ids)
    sent, k = model.asked[-1]
    assert sent.dtype == torch.float32 and sent.shape == (3, D) and k == 4
    torch.testing.assert_close(sent, lens.transport(rows, 2))
    # Default k of the async form too.
    assert asyncio.run(ajacobian_lens_topk(model, lens, rows, 0)).ids.shape == (3, 10)


def test_jacobian_lens_topk_refuses_a_model_of_another_shape() -> None:
    lens = _lens()
    rows = torch.zeros(1, D)
    with pytest.raises(UnsupportedModelError) as info:
        jacobian_lens_topk(_Decoder(n_layers=4), lens, rows, 0)
    assert str(info.value) == (
        f"this Jacobian lens was computed on m (3 layers, d_model {D}); the model has 4 layers, "
        f"d_model {D}"
    )
    with pytest.raises(LayerOutOfRangeError):  # a layer the lens was not computed for
        jacobian_lens_topk(_Decoder(), lens, rows, 1)
