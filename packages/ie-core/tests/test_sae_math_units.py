"""`ie_core.experiments.sae_math` against definitions written here (SAELens conventions, float64): the meta
a worker receives, the worker's reduction (dense, top-k, reconstruction statistics), top-k order
and ties, layer-norm inputs. Shares nothing with the maths under test but the tensors."""

from __future__ import annotations

import pytest
import torch
from ie_core.experiments.sae_math import DictMeta, reduce_rows, topk_features

D, F = 8, 12


def _weights(seed: int = 0) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return {
        "W_enc": torch.randn(D, F, generator=g),
        "b_enc": torch.randn(F, generator=g) * 0.2,
        "W_dec": torch.randn(F, D, generator=g),
        "b_dec": torch.randn(D, generator=g) * 0.3,
        "threshold": torch.rand(F, generator=g),
    }


def _reference(
    x: torch.Tensor, w: dict[str, torch.Tensor], meta: DictMeta
) -> dict[str, torch.Tensor]:
    x, w = x.double(), {k: v.double() for k, v in w.items()}
    mu = torch.zeros(())
    std = torch.ones(())
    h = x
    if meta.normalize == "layer_norm":
        mu = x.mean(-1, keepdim=True)
        std = (x - mu).std(-1, keepdim=True) + 1e-5
        h = (x - mu) / std
    if meta.b_dec_in:
        h = h - w["b_dec"]
    pre = h @ w["W_enc"] + w["b_enc"]
    if meta.activation == "relu":
        acts = pre.clamp_min(0)
    elif meta.activation == "jumprelu":
        acts = torch.where(pre > w["threshold"], pre, 0.0).clamp_min(0)
    else:
        top = pre.topk(meta.k or F, -1)
        acts = torch.zeros_like(pre).scatter(-1, top.indices, top.values.clamp_min(0))
    recon = (acts @ w["W_dec"] + w["b_dec"]) * std + mu
    return {
        "acts": acts,
        "sq_error": (x - recon).pow(2).sum(-1),
        "sq_norm": (x - x.mean(-1, keepdim=True)).pow(2).sum(-1),
    }


METAS = [
    DictMeta("relu"),
    DictMeta("relu", b_dec_in=True),
    DictMeta("jumprelu"),
    DictMeta("topk", k=3),
    DictMeta("relu", normalize="layer_norm"),
    DictMeta("topk", k=4, b_dec_in=True, normalize="layer_norm"),
]


@pytest.mark.parametrize("meta", METAS, ids=lambda m: str(m.to_dict()))
def test_the_meta_survives_its_dict_form(meta: DictMeta) -> None:
    assert DictMeta.from_dict(meta.to_dict()) == meta
    assert DictMeta.from_dict({"activation": "relu"}) == DictMeta("relu", None, False, "none")


@pytest.mark.parametrize("meta", METAS, ids=lambda m: str(m.to_dict()))
def test_reduce_rows_equals_the_definition(meta: DictMeta) -> None:
    w = _weights()
    x = torch.randn(2, 5, D, generator=torch.Generator().manual_seed(1)) * 2 + 0.5
    want = _reference(x, w, meta)
    dense = reduce_rows(x, w, meta, None, stats=True)
    assert set(dense) == {"acts", "sq_error", "sq_norm"}
    for name in dense:
        assert torch.allclose(dense[name].double(), want[name], rtol=1e-5, atol=1e-4), name
    assert bool((want["acts"] > 0).any()) and bool((want["acts"] == 0).any())
    top = reduce_rows(x, w, meta, 2, stats=False)
    assert set(top) == {"ids", "values"}
    best = want["acts"].topk(2, -1)
    assert torch.allclose(top["values"].double(), best.values, atol=1e-5)
    assert torch.equal(want["acts"].gather(-1, top["ids"]), best.values)


def test_topk_is_largest_first_and_k_is_capped_at_the_width() -> None:
    acts = torch.tensor([[0.0, 3.0, 1.0, 2.0]])
    ids, values = topk_features(acts, 3)
    assert ids.tolist() == [[1, 3, 2]] and values.tolist() == [[3.0, 2.0, 1.0]]
    ids, values = topk_features(acts, 10)
    assert ids.tolist() == [[1, 3, 2, 0]] and values.shape == (1, 4)


def test_jumprelu_at_its_threshold_is_off_and_topk_uses_the_feature_axis() -> None:
    from ie_core.experiments.sae_math import activate

    w = {"threshold": torch.tensor([1.0, 1.0, 1.0])}
    pre = torch.tensor([[1.0, 1.5, 0.5]])
    assert activate(pre, w, DictMeta("jumprelu")).tolist() == [[0.0, 1.5, 0.0]]
    # [batch 1, seq 2, features 5], k = 3: more than the seq axis, fewer than the features.
    acts = torch.tensor([[[5.0, 1.0, 4.0, 2.0, 3.0], [0.0, 9.0, 8.0, 7.0, 1.0]]])
    dense = activate(acts, {}, DictMeta("topk", k=3))
    assert dense.tolist() == [[[5.0, 0.0, 4.0, 0.0, 3.0], [0.0, 9.0, 8.0, 7.0, 0.0]]]
    ids, values = topk_features(acts, 3)
    assert ids.tolist() == [[[0, 2, 4], [1, 2, 3]]] and values.shape == (1, 2, 3)
