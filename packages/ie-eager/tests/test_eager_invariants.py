"""POINTS.md invariants on every synthetic family (fp32, CPU), each with a negative control.

Tolerance: 1e-5 absolute and relative (fp32, one backend; only summation order differs)."""

from __future__ import annotations

import functools

import pytest
import torch
from eager_support import FAMILY_SLUGS, PROMPT, synthetic_model
from ie_core.cache import ActivationCache
from ie_core.grammar import FAMILIES_BY_SLUG, get_family, get_point
from ie_eager import structure as st
from ie_eager.backend import EagerModel

TOL = {"atol": 1e-5, "rtol": 1e-5}


def close(a: torch.Tensor, b: torch.Tensor) -> bool:
    return torch.allclose(a, b, **TOL)


def layers(model: EagerModel) -> list[int]:
    return sorted({0, model.n_layers // 2, model.n_layers - 1})


def all_addresses(model: EagerModel) -> list:
    out: list = []
    for name in model.points():
        if get_point(name).per_layer:
            out += [(name, i) for i in range(model.n_layers) if has(model, name, i)]
        else:
            out.append(name)
    return out


@functools.cache
def full(slug: str) -> tuple[torch.Tensor, ActivationCache]:
    """One forward per family capturing every point at every layer; the tests read from it."""
    model = synthetic_model(slug)
    return model.forward_with_cache([model.to_tokens(PROMPT)], all_addresses(model))


def capture(model: EagerModel, names: list[str], layer: int) -> dict[str, torch.Tensor]:
    cache = full(_slug(model))[1]
    return {n: cache[(n, layer)] for n in names}


def _slug(model: EagerModel) -> str:
    return next(s for s in FAMILY_SLUGS if synthetic_model(s) is model)


def has(model: EagerModel, name: str, layer: int) -> bool:
    try:
        model.resolve((name, layer))
        return True
    except Exception:
        return False


@pytest.mark.parametrize("slug", FAMILY_SLUGS)
def test_residual_decomposes_into_sublayer_writes(slug: str) -> None:
    model = synthetic_model(slug)
    for layer in layers(model):
        c = capture(model, ["resid_pre", "attn_out_post", "mlp_out_post", "resid_post"], layer)
        total = c["resid_pre"] + c["attn_out_post"] + c["mlp_out_post"]
        assert close(total, c["resid_post"]), f"{slug} layer {layer}"
        # Negative control: forgetting the attention write must fail.
        assert not close(c["resid_pre"] + c["mlp_out_post"], c["resid_post"])


@pytest.mark.parametrize("slug", FAMILY_SLUGS)
def test_resid_mid_sits_between_attention_and_mlp(slug: str) -> None:
    model = synthetic_model(slug)
    layer = model.n_layers - 1
    if not has(model, "resid_mid", layer):
        assert model.structure.blocks[layer].parallel
        return
    c = capture(
        model, ["resid_pre", "attn_out_post", "resid_mid", "mlp_out_post", "resid_post"], layer
    )
    assert close(c["resid_pre"] + c["attn_out_post"], c["resid_mid"])
    # Independent side: the block output minus the MLP write (read at the block's real output).
    assert close(c["resid_mid"] + c["mlp_out_post"], c["resid_post"])
    assert not close(c["resid_pre"] + c["mlp_out_post"], c["resid_post"])


def _expand_heads(value: torch.Tensor, heads: int, head_dim: int, interleave: bool) -> torch.Tensor:
    b, s, _ = value.shape
    v = value.view(b, s, -1, head_dim).transpose(1, 2)  # [b, kv, s, hd]
    groups = heads // v.shape[1]
    return v.repeat_interleave(groups, dim=1) if interleave else v.repeat(1, groups, 1, 1)


@pytest.mark.parametrize("slug", FAMILY_SLUGS)
def test_probs_times_value_is_z(slug: str) -> None:
    model = synthetic_model(slug)
    sh = model.structure.shapes
    for layer in layers(model):
        c = capture(model, ["attn_probs", "value", "z"], layer)
        v = _expand_heads(c["value"], sh.n_heads, sh.head_dim, interleave=True)
        z = (c["attn_probs"] @ v).transpose(1, 2).flatten(-2)
        assert close(z, c["z"]), f"{slug} layer {layer}"
        # Negative controls: tiling KV heads instead of repeat-interleave (GQA), or heads rolled.
        if 1 < sh.n_kv_heads < sh.n_heads:
            tiled = _expand_heads(c["value"], sh.n_heads, sh.head_dim, interleave=False)
            assert not close((c["attn_probs"] @ tiled).transpose(1, 2).flatten(-2), c["z"])
        wrong = c["attn_probs"].roll(1, dims=-1) @ v
        assert not close(wrong.transpose(1, 2).flatten(-2), c["z"])


@pytest.mark.parametrize("slug", ["gpt-neox", "bloom"])
def test_interleaved_fused_qkv_negative_control(slug: str) -> None:
    """Reading value as the contiguous last third of query_key_value (GPT-2's layout) must fail."""
    model = synthetic_model(slug)
    sh = model.structure.shapes
    block = model.structure.blocks[1]
    fused = block.sub(block.attn, st.FUSED_QKV_NAMES)
    path = f"path.{block.path}.{fused[0]}"
    _, cache = model.forward_with_cache(
        [model.to_tokens(PROMPT)], [("attn_probs", 1), ("z", 1), path]
    )
    qkv = cache[path]
    wrong_v = qkv[..., 2 * sh.d_model :]
    v = _expand_heads(wrong_v, sh.n_heads, sh.head_dim, interleave=True)
    z = (cache[("attn_probs", 1)] @ v).transpose(1, 2).flatten(-2)
    assert not close(z, cache[("z", 1)])


@pytest.mark.parametrize("slug", FAMILY_SLUGS)
def test_softmax_of_scores_is_probs(slug: str) -> None:
    model = synthetic_model(slug)
    for layer in layers(model):
        c = capture(model, ["attn_scores", "attn_probs"], layer)
        probs = torch.softmax(c["attn_scores"].float(), dim=-1)
        assert close(probs, c["attn_probs"])
        assert close(c["attn_probs"].sum(-1), torch.ones_like(c["attn_probs"].sum(-1)))
        # Negative control: softmax over the query axis.
        assert not close(torch.softmax(c["attn_scores"].float(), dim=-2), c["attn_probs"])


@pytest.mark.parametrize("slug", FAMILY_SLUGS)
def test_scores_mask_future_and_window_with_dtype_min(slug: str) -> None:
    model = synthetic_model(slug)
    config = model.text_config
    window = getattr(config, "sliding_window", None)
    kinds = getattr(config, "layer_types", None)
    for layer in range(model.n_layers):
        scores = capture(model, ["attn_scores"], layer)["attn_scores"][0, 0]
        q, k = torch.meshgrid(
            torch.arange(scores.shape[0]), torch.arange(scores.shape[1]), indexing="ij"
        )
        sliding = window is not None and (kinds is None or kinds[layer] == "sliding_attention")
        visible = (k <= q) & ((q - k < window) if sliding else True)
        low = torch.finfo(scores.dtype).min
        # ALiBi adds a finite bias to dtype min, which rounds back to dtype min in fp32.
        assert bool((scores[~visible] <= low / 2).all()), f"{slug} layer {layer}: future not masked"
        assert bool((scores[visible] > low / 2).all()), f"{slug} layer {layer}: visible key masked"


@pytest.mark.parametrize("slug", FAMILY_SLUGS)
def test_down_projection_of_mlp_act_is_mlp_out(slug: str) -> None:
    model = synthetic_model(slug)
    dense = [i for i in layers(model) if has(model, "mlp_act", i)]
    if not dense:
        pytest.skip(f"{slug}: every layer is a sparse MoE layer (mlp_act refused there)")
    for layer in dense:
        block = model.structure.blocks[layer]
        down = block.sub(block.mlp, st.DOWN_NAMES)[1]
        c = capture(model, ["mlp_pre", "mlp_act", "mlp_out"], layer)
        with torch.no_grad():
            assert close(down(c["mlp_act"]), c["mlp_out"])
            assert not close(down(c["mlp_pre"]), c["mlp_out"])


def _act(mlp: torch.nn.Module) -> torch.nn.Module:
    for name in ("act_fn", "activation_fn", "act"):
        if hasattr(mlp, name):
            return getattr(mlp, name)
    raise AssertionError(f"no activation on {type(mlp).__name__}")


@pytest.mark.parametrize("slug", FAMILY_SLUGS)
def test_gated_mlp_act_is_act_gate_times_up(slug: str) -> None:
    model = synthetic_model(slug)
    gated = [i for i in layers(model) if has(model, "mlp_pre_linear", i)]
    if not gated:
        assert (
            model.family is None
            or not model.family.has_point(get_point("mlp_pre_linear"))
            or all(model.structure.blocks[i].moe for i in layers(model))
        )
        return
    for layer in gated:
        block = model.structure.blocks[layer]
        act = _act(block.mlp[1])
        c = capture(model, ["mlp_pre", "mlp_pre_linear", "mlp_act"], layer)
        with torch.no_grad():
            assert close(act(c["mlp_pre"]) * c["mlp_pre_linear"], c["mlp_act"])
            assert not close(act(c["mlp_pre_linear"]) * c["mlp_pre"], c["mlp_act"])


@pytest.mark.parametrize("slug", FAMILY_SLUGS)
def test_per_head_output_contributions_sum_to_attn_out(slug: str) -> None:
    model = synthetic_model(slug)
    sh = model.structure.shapes
    for layer in layers(model):
        block = model.structure.blocks[layer]
        o_proj = block.sub(block.attn, st.O_PROJ_NAMES)[1]
        w = o_proj.weight if hasattr(o_proj, "nf") else o_proj.weight.T  # [H, d]
        bias = o_proj.bias if getattr(o_proj, "bias", None) is not None else 0.0
        c = capture(model, ["z", "attn_out"], layer)
        z = c["z"].unflatten(-1, (sh.n_heads, sh.head_dim))
        w_heads = w.detach().unflatten(0, (sh.n_heads, sh.head_dim))  # [h, hd, d]
        per_head = torch.einsum("bshe,hed->bshd", z, w_heads)
        assert close(per_head.sum(2), c["attn_out"] - bias), f"{slug} layer {layer}"
        assert not close(per_head[:, :, 1:].sum(2), c["attn_out"] - bias)


@pytest.mark.parametrize("slug", FAMILY_SLUGS)
def test_lens_on_last_resid_post_is_the_logits(slug: str) -> None:
    model = synthetic_model(slug)
    last = model.n_layers - 1
    logits, cache = full(slug)
    from ie_core.runner import run

    decoded = run(model.decode_residuals(cache[("resid_post", last)]))
    assert close(decoded, logits), slug
    # Negative control: skipping the final norm.
    from ie_eager.lens import logit_transform

    raw = logit_transform(
        model.text_config, model.structure.lm_head[1](cache[("resid_post", last)])
    )
    assert not close(raw.detach(), logits)


@pytest.mark.parametrize("slug", FAMILY_SLUGS)
def test_capture_leaves_logits_bit_identical(slug: str) -> None:
    model = synthetic_model(slug)
    ids = [model.to_tokens(PROMPT)]
    plain = model.forward_with_cache(ids, [])[0]
    everything = all_addresses(model)
    captured, cache = full(slug)
    assert len(cache) == len(everything)
    assert torch.equal(plain, captured)
    # Negative control: a write does change them.
    from ie_core.ops import Additive, steer_at

    vec = [1.0] * model.d_model
    steered = model.forward_with_cache(
        ids, [], steering=steer_at(("resid_post", 0), Additive(vec))
    )[0]
    assert not torch.equal(plain, steered)


@pytest.mark.parametrize("slug", [s for s in FAMILY_SLUGS if s in FAMILIES_BY_SLUG])
def test_points_equal_the_family_registry(slug: str) -> None:
    model = synthetic_model(slug)
    family = get_family(slug)
    assert model.family is family
    assert set(model.points()) == {p.name for p in family.points}


@pytest.mark.parametrize("slug", ["qwen3-moe", "qwen2-moe", "mixtral"])
def test_router_points_are_the_routers_own_top_k(slug: str) -> None:
    model = synthetic_model(slug)
    layer = model.n_layers - 1
    c = capture(model, ["router_logits", "expert_weights", "expert_indices"], layer)
    probs = torch.softmax(c["router_logits"].float(), dim=-1)
    k = c["expert_indices"].shape[-1]
    assert torch.equal(c["expert_indices"], probs.topk(k, dim=-1).indices)
    expected = probs.gather(-1, c["expert_indices"])
    if getattr(model.text_config, "norm_topk_prob", True):
        expected = expected / expected.sum(-1, keepdim=True)
    assert close(c["expert_weights"].float(), expected)
    # Negative control: the weights belong to their own experts, not to the other order.
    assert not close(c["expert_weights"].float(), expected.flip(-1))
