"""Granite-4.0-H invariants (fp32, CPU). Its decoder layer adds
`(block_sparse_moe(h) + shared_mlp(h)) * residual_multiplier` inline, so no module outputs the MLP
branch: mlp_out is read from two modules and written through the shared MLP. Each check compares
with an independent computation (HF's own hidden states, the modules called by hand, residual
differences) and has a negative control; the shared family invariants (attention maps, routers,
lens, cached generation) run on it in test_eager_new_families.py.

Tolerance: 1e-5 absolute and relative (fp32, one backend; only summation order differs)."""

from __future__ import annotations

import functools

import pytest
import torch
from eager_support import PROMPT, synthetic_model
from ie_core.cache import ActivationCache
from ie_core.errors import PointUnavailableError
from ie_core.ops import Additive, Orthogonal, steer_at
from ie_core.runner import run
from ie_eager.backend import EagerModel

TOL = {"atol": 1e-5, "rtol": 1e-5}
SLUG = "granitemoehybrid"
MIXERS = ["mamba", None, "mamba", None]  # layer_types: linear, full, linear, full
NAMES = ("resid_pre", "attn_in", "attn_out", "attn_out_post", "resid_mid", "mlp_in", "mlp_out")
NAMES += ("mlp_out_post", "resid_post", "router_logits", "expert_weights", "expert_indices")


def close(a: torch.Tensor, b: torch.Tensor) -> bool:
    return torch.allclose(a, b, **TOL)


def model() -> EagerModel:
    return synthetic_model(SLUG)


def ids() -> list[list[int]]:
    return [model().to_tokens(PROMPT)]


def capture(names: tuple[str, ...] = NAMES, steering=None) -> ActivationCache:
    addresses = [(n, i) for n in names for i in range(model().n_layers)]
    return model().forward_with_cache(ids(), addresses, steering=steering)[1]


@functools.cache
def plain() -> ActivationCache:
    return capture()


def block(i: int) -> torch.nn.Module:
    return model().structure.blocks[i].module


def test_the_build_is_a_mamba_attention_hybrid_with_moe_and_multipliers() -> None:
    config = model().text_config
    assert [b.mixer for b in model().structure.blocks] == MIXERS
    assert all(b.moe and b.sibling_mlp is not None for b in model().structure.blocks)
    assert config.num_local_experts == 4 and config.num_experts_per_tok == 2
    multipliers = ("embedding_multiplier", "residual_multiplier", "attention_multiplier")
    assert all(getattr(config, m) != 1.0 for m in (*multipliers, "logits_scaling"))


def test_residual_points_are_hfs_hidden_states() -> None:
    with torch.no_grad():
        own = model().hf_model(torch.tensor(ids()), output_hidden_states=True).hidden_states
    cache = plain()
    for i in range(model().n_layers):
        assert close(cache[("resid_pre", i)], own[i]), i
    # Negative control: the embedding without embedding_multiplier is not the block input.
    embedded = model().structure.embed[1](torch.tensor(ids())).detach()
    assert close(embedded * model().text_config.embedding_multiplier, cache[("resid_pre", 0)])
    assert not close(embedded, cache[("resid_pre", 0)])


def test_mlp_out_is_routed_plus_shared_and_post_is_what_the_branch_adds() -> None:
    cache, m = plain(), model().text_config.residual_multiplier
    for i in range(model().n_layers):
        h, out = cache[("mlp_in", i)], cache[("mlp_out", i)]
        with torch.no_grad():
            routed, shared = block(i).block_sparse_moe(h), block(i).shared_mlp(h)
        added = cache[("resid_post", i)] - cache[("resid_mid", i)]
        assert close(routed + shared, out), i
        assert close(out * m, cache[("mlp_out_post", i)]), i
        assert close(cache[("mlp_out_post", i)], added), i
        # Negative controls: either MLP alone, or the unscaled sum, is not what the layer adds.
        assert not close(shared * m, added) and not close(routed * m, added)
        assert not close(out, added)


def test_reading_one_mlp_module_alone_is_not_mlp_out() -> None:
    """What a single-module tap would read (the shared MLP, or the routed one) fails the check
    mlp_out passes: it is not the residual difference over residual_multiplier."""
    layer, m = 1, model().text_config.residual_multiplier
    paths = [f"path.model.layers.{layer}.{name}" for name in ("shared_mlp", "block_sparse_moe")]
    _, cache = model().forward_with_cache(ids(), paths)
    added = plain()[("resid_post", layer)] - plain()[("resid_mid", layer)]
    for path in paths:
        assert not close(cache[path] * m, added), path
    assert close(plain()[("mlp_out", layer)] * m, added)


def test_attn_out_post_is_the_scaled_mixer_output_on_both_layer_kinds() -> None:
    cache, m = plain(), model().text_config.residual_multiplier
    for i, mixer in enumerate(MIXERS):
        out = cache[("attn_out", i)]
        assert close(out * m, cache[("attn_out_post", i)]), i
        assert close(cache[("resid_mid", i)] - cache[("resid_pre", i)], out * m), i
        assert not close(cache[("resid_pre", i)] + out, cache[("resid_mid", i)])
        if mixer == "mamba":  # the Mamba2 mixer by hand, without a cache
            with torch.no_grad():
                assert close(block(i).mamba(hidden_states=cache[("attn_in", i)]), out), i


@pytest.mark.parametrize("name", ["mlp_out", "mlp_out_post"])
def test_steering_the_mlp_branch_moves_exactly_what_it_adds(name: str) -> None:
    layer, m = 2, model().text_config.residual_multiplier
    vec = torch.linspace(-1, 1, model().d_model)
    cache = capture(steering=steer_at((name, layer), Additive(vec.tolist())))
    base = plain()
    assert close(cache[(name, layer)] - base[(name, layer)], vec.expand_as(base[(name, layer)]))
    moved = vec * (m if name == "mlp_out" else 1.0)
    delta = cache[("resid_post", layer)] - base[("resid_post", layer)]
    assert close(delta, moved.expand_as(delta))
    assert close(cache[("resid_mid", layer)], base[("resid_mid", layer)])
    assert close(cache[("router_logits", layer)], base[("router_logits", layer)])
    # The read after the write is what the layer added: the identity holds on the steered run.
    added = cache[("resid_post", layer)] - cache[("resid_mid", layer)]
    assert close(cache[("mlp_out_post", layer)], added)
    assert not close(cache[("resid_post", layer + 1)], base[("resid_post", layer + 1)])


def test_ablating_mlp_out_removes_the_direction_from_both_mlps() -> None:
    """A non-additive write separates a correct branch write from one that changes the shared MLP
    alone: ablating a direction on mlp_out leaves no component along it in the sum, while the
    same ablation on the shared MLP's output leaves the routed MLP's component."""
    layer = 3
    u = torch.linspace(1, -1, model().d_model)
    u = u / u.norm()
    names = ("mlp_out", "resid_post")
    right = capture(names, steer_at(("mlp_out", layer), Orthogonal(u.tolist())))
    assert close(right[("mlp_out", layer)] @ u, torch.zeros(1, len(ids()[0])))
    before = plain()[("mlp_out", layer)]
    expected = before - (before @ u).unsqueeze(-1) * u
    assert close(right[("mlp_out", layer)], expected)
    # Negative control: the same ablation applied to the shared MLP's output alone.
    with torch.no_grad():
        h = plain()[("mlp_in", layer)]
        routed, shared = block(layer).block_sparse_moe(h), block(layer).shared_mlp(h)
    wrong = routed + shared - (shared @ u).unsqueeze(-1) * u
    assert not close(wrong @ u, torch.zeros(1, len(ids()[0])))
    assert not close(wrong, right[("mlp_out", layer)])


def test_mlp_in_write_reaches_the_routed_and_the_shared_mlp() -> None:
    layer = 1
    vec = torch.linspace(-0.5, 0.5, model().d_model)
    cache = capture(steering=steer_at(("mlp_in", layer), Additive(vec.tolist())))
    h = plain()[("mlp_in", layer)] + vec
    with torch.no_grad():
        both = block(layer).block_sparse_moe(h) + block(layer).shared_mlp(h)
        routed_only = block(layer).block_sparse_moe(h) + block(layer).shared_mlp(h - vec)
    assert close(cache[("mlp_out", layer)], both)
    assert not close(cache[("mlp_out", layer)], routed_only)


def test_router_items_follow_granites_output_order() -> None:
    # GraniteMoeHybridTopKRouter returns (indices, weights, logits), the reverse of other routers.
    cache, config = plain(), model().text_config
    for i in range(model().n_layers):
        logits, weights = cache[("router_logits", i)], cache[("expert_weights", i)]
        indices = cache[("expert_indices", i)]
        assert logits.shape[-1] == config.num_local_experts
        assert weights.shape[-1] == indices.shape[-1] == config.num_experts_per_tok
        assert not indices.is_floating_point()
        top = logits.topk(config.num_experts_per_tok, -1)
        assert torch.equal(indices, top.indices)
        assert close(weights, torch.softmax(top.values, -1))
        assert not close(weights, torch.softmax(logits, -1).gather(-1, indices))


def test_lens_divides_by_logits_scaling() -> None:
    last = plain()[("resid_post", model().n_layers - 1)]
    logits = model().forward_with_cache(ids(), [])[0]
    assert close(run(model().decode_residuals(last)), logits)
    s = model().structure
    with torch.no_grad():
        raw = s.lm_head[1](s.final_norm[1](last))
    assert close(raw / model().text_config.logits_scaling, logits)
    assert not close(raw, logits)


def test_mamba_layers_refuse_attention_internals_and_serve_the_mlp_side() -> None:
    for layer, mixer in enumerate(MIXERS):
        for name in ("attn_scores", "value", "z"):
            if mixer is None:
                model().resolve((name, layer))
                continue
            with pytest.raises(PointUnavailableError, match="GraniteMoeHybridMambaLayer"):
                model().resolve((name, layer))
        for name in ("mlp_pre", "mlp_act"):
            with pytest.raises(PointUnavailableError, match="mixture of experts"):
                model().resolve((name, layer))
