"""What eager says about its points against what the points are: each reported width is the
width of the tensor a forward captures there (lm_head: HF's logits), each capability's
writability is the registry's role (the steering spec refuses a capture-only point whatever a
backend claims), and a model without a final norm or without an attention module in a block is
refused with the reason, word for word."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest
import torch
from eager_support import PROMPT, refusal_reason, synthetic_model
from ie_core.errors import PointUnavailableError, SteeringSpecError
from ie_core.grammar import POINTS, Address, get_family, get_point
from ie_core.ops import Additive, steer_at
from ie_eager.hooks import Session
from ie_eager.resolve import Resolver
from ie_eager.synthetic import FAMILIES

MAPS = ("attn_scores", "attn_probs")  # heads x q x k: no fixed width
SLUGS = sorted(FAMILIES)  # the standard and the special families


def _served(slug: str) -> list[Address]:
    """Every address the model serves, attention maps left out."""
    model = synthetic_model(slug)
    out = []
    for point in POINTS:
        if point.name in MAPS:
            continue
        for layer in range(model.n_layers) if point.per_layer else [None]:
            for stream in (None, 0):  # stream 0 of a multi-stream trunk's residual points
                try:
                    model.resolve(Address(point.name, layer, stream))
                except PointUnavailableError:
                    continue
                out.append(Address(point.name, layer, stream))
    return out


@pytest.mark.parametrize("slug", SLUGS)
def test_each_reported_width_is_the_captured_tensors_width(slug: str) -> None:
    # The width is the number of values per token: [batch, seq, ...] after the first two axes
    # (a stream-mixing matrix is n_streams x n_streams).
    model = synthetic_model(slug)
    addresses = _served(slug)
    assert Address("lm_head") in addresses and Address("mlp_out", 0) in addresses
    logits, cache = model.forward_with_cache([model.to_tokens(PROMPT)], addresses)
    for address in addresses:
        assert model.point_width(address) == cache[address][0, 0].numel(), str(address)
    # The unembed is as wide as HF's own logits; the residual as its hidden states.
    config: Any = model.hf_model.config
    assert model.point_width("lm_head") == logits.shape[-1] == config.vocab_size
    assert model.point_width("embeddings") == model.d_model
    for layer in model.capabilities()["attn_probs"].layers[:1]:  # hybrids: a softmax layer
        with pytest.raises(PointUnavailableError, match="no fixed width"):
            model.point_width(f"attn_probs.{layer}")


@pytest.mark.parametrize("slug", SLUGS)
def test_capabilities_call_writable_exactly_the_served_read_write_points(slug: str) -> None:
    # The registry's role decides what a steering spec accepts, so a capability claiming a
    # capture-only point writable (or the reverse) would be a false answer.
    caps = synthetic_model(slug).capabilities()
    for point in POINTS:
        cap = caps[point.name]
        assert cap.writable == (cap.served and point.writable), point.name
    assert caps["lm_head"].served and not caps["lm_head"].writable
    assert caps["attn_probs"].served and not caps["attn_probs"].writable
    assert caps["mlp_out"].writable and caps["final_norm"].writable
    with pytest.raises(SteeringSpecError, match="capture-only"):
        steer_at("lm_head", Additive([1.0] * synthetic_model(slug).d_model))


def _resolver(slug: str, **structure: object) -> Resolver:
    """The model's own resolver over its structure with some modules taken away."""
    model = synthetic_model(slug)
    s = model.resolver.s
    return Resolver(dataclasses.replace(s, **structure), model.resolver.family, model.hf_model)


def test_a_model_without_a_final_norm_refuses_final_norm_with_the_reason() -> None:
    with pytest.raises(PointUnavailableError) as info:
        _resolver("llama", final_norm=None).resolve("final_norm")
    assert str(info.value) == (
        "final_norm is not available on this model: no final norm module found before the unembed"
    )
    assert info.value.reason == "no final norm module found before the unembed"
    # Negative control: the model as loaded serves it, and the rest of the trunk still resolves.
    assert _resolver("llama").resolve("final_norm").width == synthetic_model("llama").d_model
    assert _resolver("llama", final_norm=None).resolve("lm_head").kind == "tap"


def test_a_block_without_attention_refuses_the_attention_maps_with_the_reason() -> None:
    s = synthetic_model("llama").resolver.s
    blocks = list(s.blocks)
    blocks[1] = dataclasses.replace(blocks[1], attn=None)
    resolver = _resolver("llama", blocks=tuple(blocks))
    for name in MAPS:
        with pytest.raises(PointUnavailableError) as info:
            resolver.resolve(f"{name}.1")
        assert str(info.value) == (
            f"{name} is not available on this model: no attention module in this block"
        )
        assert info.value.reason == "no attention module in this block"
        # Negative control: the other layers keep their attention.
        assert resolver.resolve(f"{name}.0").kind == "attention"


def _with_children(module: torch.nn.Module, names: tuple[str, ...]) -> torch.nn.Module:
    """A stand-in for `module` that keeps only the named children (a layout no family has)."""
    kept = torch.nn.Module()
    for name in names:
        kept.add_module(name, module.get_submodule(name))
    return kept


def test_blocks_missing_mlp_or_attention_modules_refuse_with_the_structural_reason() -> None:
    # Layouts no synthetic family reaches: the resolver names what is missing (and raises
    # PointUnavailableError, not an AttributeError from a half-resolved tap).
    block = synthetic_model("llama").resolver.s.blocks[1]
    mlp, attn = block.mlp, block.attn
    assert mlp is not None and attn is not None

    def resolver(**parts: object) -> Resolver:
        blocks = list(synthetic_model("llama").resolver.s.blocks)
        blocks[1] = dataclasses.replace(block, **parts)
        return _resolver("llama", blocks=tuple(blocks))

    no_mlp = resolver(mlp=None)
    for name in ("mlp_act", "mlp_pre", "mlp_pre_linear"):
        assert refusal_reason(no_mlp, f"{name}.1") == "no MLP module found"
    no_down = resolver(mlp=(mlp[0], _with_children(mlp[1], ("gate_proj", "up_proj"))))
    assert refusal_reason(no_down, "mlp_act.1") == "no down projection found in the MLP"
    down_only = resolver(mlp=(mlp[0], _with_children(mlp[1], ("down_proj",))))
    assert refusal_reason(down_only, "mlp_pre.1") == "no first MLP projection found"
    assert refusal_reason(down_only, "mlp_pre_linear.1") == (
        "the MLP is not gated (no separate up projection)"
    )
    no_o_proj = resolver(attn=(attn[0], _with_children(attn[1], ("q_proj", "k_proj", "v_proj"))))
    assert refusal_reason(no_o_proj, "z.1") == "no attention output projection found"
    # Negative controls: the same resolver serves the other layers, and the unchanged block's
    # gated MLP reads the gate and up projections.
    assert down_only.resolve("mlp_act.1").width == mlp[1].get_submodule("down_proj").in_features
    assert no_o_proj.resolve("z.0").tap.module is synthetic_model("llama").resolver.s.blocks[
        0
    ].attn[1].get_submodule("o_proj")
    plain = resolver()
    assert plain.resolve("mlp_pre.1").tap.module is mlp[1].get_submodule("gate_proj")
    assert plain.resolve("mlp_pre_linear.1").tap.module is mlp[1].get_submodule("up_proj")


@pytest.mark.parametrize("slug", ["opt", "phi", "starcoder2"])
def test_an_ungated_mlp_serves_mlp_pre_as_its_first_projection(slug: str) -> None:
    # fc1 / c_fc applied by hand to the captured mlp_in; the gated families' projections are
    # checked in test_eager_invariants.py.
    model = synthetic_model(slug)
    block = model.resolver.s.blocks[1]
    first = block.sub(block.mlp, ("fc1", "c_fc"))
    assert first is not None
    addresses = ["mlp_in.1", "mlp_pre.1", "mlp_act.1"]
    _, cache = model.forward_with_cache([model.to_tokens(PROMPT)], addresses)
    with torch.no_grad():
        want = first[1](cache["mlp_in.1"])
    torch.testing.assert_close(cache["mlp_pre.1"], want, rtol=1e-5, atol=1e-5)
    # Negative control: mlp_act, the activation of that, is another tensor of the same width.
    assert cache["mlp_act.1"].shape == want.shape
    assert (cache["mlp_act.1"] - want).abs().max() > 1e-2
    with pytest.raises(PointUnavailableError, match="no gated mlp"):
        model.resolve("mlp_pre_linear.1")


def test_hyper_connection_points_refuse_a_stream_and_a_block_without_the_module() -> None:
    model = synthetic_model("deepseek-v4")
    with pytest.raises(PointUnavailableError) as info:
        model.resolve("attn_stream_mix.1.stream-0")
    assert str(info.value) == (
        "attn_stream_mix is not available on this model: it is per token, not per stream"
    )
    blocks = list(model.resolver.s.blocks)
    blocks[1] = dataclasses.replace(blocks[1], attn_hc=None)
    resolver = _resolver("deepseek-v4", blocks=tuple(blocks))
    for name in ("attn_stream_write", "attn_stream_mix", "attn_stream_collapse"):
        with pytest.raises(PointUnavailableError) as info:
            resolver.resolve(f"{name}.1")
        assert str(info.value) == f"{name} is not available on this model: no attn_hc module"
        # Negative control: the other layers keep the module, and the MLP side its own.
        assert resolver.resolve(f"{name}.0").kind == "tap"
        assert resolver.resolve(f"{name.replace('attn', 'mlp')}.1").kind == "tap"
    # Without the hyper-connection module before the MLP there is no resid_mid stream.
    blocks[1] = dataclasses.replace(model.resolver.s.blocks[1], mlp_hc=None)
    with pytest.raises(PointUnavailableError) as info:
        _resolver("deepseek-v4", blocks=tuple(blocks)).resolve("resid_mid.1.stream-0")
    assert str(info.value) == (
        "resid_mid is not available on this model: no hyper-connection module before the MLP"
    )
    assert model.resolve("resid_mid.1.stream-0").width == model.d_model
    with pytest.raises(PointUnavailableError) as info:
        model.resolve("resid_streams.1.stream-0")
    assert str(info.value) == (
        "resid_streams is not available on this model: it is all 4 streams; read one as "
        "resid_post.1.stream-N"
    )


@pytest.mark.parametrize("slug", ["granitemoehybrid", "lfm2", "qwen3-next"])
def test_a_token_mixer_layer_names_the_softmax_layers_from_the_config(slug: str) -> None:
    # HF's config lists each layer's kind; the refusal on a mixer layer names the others.
    model = synthetic_model(slug)
    config: Any = model.hf_model.config
    kinds = config.get_text_config().layer_types
    softmax = [i for i, kind in enumerate(kinds) if kind == "full_attention"]
    mixers = [i for i, kind in enumerate(kinds) if kind != "full_attention"]
    assert softmax and mixers
    for layer in mixers:
        with pytest.raises(PointUnavailableError) as info:
            model.resolve(f"attn_probs.{layer}")
        assert str(info.value).endswith(f"Softmax-attention layers: {softmax}")
        assert f"layer {layer} mixes tokens with " in str(info.value)
    for layer in softmax:  # negative control: those layers serve the map
        assert model.resolve(f"attn_probs.{layer}").kind == "attention"


def test_a_fused_projection_of_another_width_or_layout_is_refused_for_value() -> None:
    # Shapes that do not fit the fused projection HF built: eager refuses rather than guess.
    gpt2 = synthetic_model("gpt2")
    hf: Any = gpt2.hf_model
    total = hf.transformer.h[1].attn.c_attn.nf  # [q | k | v], 3 x 128 wide
    shapes = dataclasses.replace(gpt2.resolver.s.shapes, n_kv_heads=2)
    with pytest.raises(PointUnavailableError) as info:
        _resolver("gpt2", shapes=shapes).resolve("value.1")
    assert str(info.value) == (
        f"value is not available on this model: fused projection attn.c_attn is {total} wide, "
        "expected (heads 4 + 2 x kv 2) x head_dim 32; its layout is unknown"
    )
    # GPT-NeoX's query_key_value with fewer KV heads than heads (same total width) and no
    # Falcon-style grouping flag has no known layout.
    neox = synthetic_model("gpt-neox")
    hf = neox.hf_model
    assert hf.gpt_neox.layers[1].attention.query_key_value.out_features == 384
    shapes = dataclasses.replace(neox.resolver.s.shapes, n_heads=2, n_kv_heads=5)  # (2+10) x 32
    with pytest.raises(PointUnavailableError) as info:
        _resolver("gpt-neox", shapes=shapes).resolve("value.1")
    assert str(info.value) == (
        "value is not available on this model: fused query_key_value with grouped KV heads has "
        "no known layout"
    )
    # Negative control: the shapes as loaded serve value, one KV head set wide.
    for slug in ("gpt2", "gpt-neox"):
        assert _resolver(slug).resolve("value.1").width == 4 * 32


def _read(resolver: Resolver, slug: str, names: list[str]) -> dict[str, torch.Tensor]:
    """One plain forward of the model, read through `resolver` (not the model's own)."""
    model = synthetic_model(slug)
    ids = torch.tensor([model.to_tokens(PROMPT)])
    reads = [resolver.resolve(name) for name in names]
    with torch.no_grad(), Session(model.hf_model, reads) as session:
        session.batch_shape = (1, ids.shape[1])
        model.hf_model(input_ids=ids, use_cache=False)
    return {name: session.captured[r.address] for name, r in zip(names, reads, strict=True)}


@pytest.mark.parametrize(("slug", "probed"), [("granitemoehybrid", True), ("qwen3-moe", False)])
def test_a_new_resolver_reads_router_logits_as_the_routers_own_linear(
    slug: str, probed: bool
) -> None:
    # Granite-4.0-H's router returns (indices, weights, logits), found by probing; without a
    # probe a resolver keeps the usual (logits, weights, indices) order of other routers.
    model = synthetic_model(slug)
    s = model.resolver.s
    probe = model._probe if probed else None  # the backend's own layout probe
    resolver = Resolver(s, model.resolver.family, model.hf_model, probe)
    layer = next(i for i, b in enumerate(s.blocks) if b.moe)
    got = _read(resolver, slug, [f"router_logits.{layer}", f"mlp_in.{layer}"])
    found = s.blocks[layer].sub(s.blocks[layer].mlp, ("gate", "router"))
    assert found is not None
    router: Any = found[1]
    with torch.no_grad():
        want = torch.nn.functional.linear(
            got[f"mlp_in.{layer}"], router.weight, getattr(router, "bias", None)
        )
    assert got[f"router_logits.{layer}"].shape == want.shape
    assert torch.allclose(got[f"router_logits.{layer}"], want, atol=1e-5, rtol=1e-5)
    if probed:  # negative control: without the probe, Granite's read is another output item
        blind = Resolver(s, model.resolver.family, model.hf_model)
        other = _read(blind, slug, [f"router_logits.{layer}"])[f"router_logits.{layer}"]
        assert other.shape != want.shape or not torch.allclose(other, want, atol=1e-5)


def test_a_new_resolver_keeps_the_family_reason_and_the_model_modules() -> None:
    resolver = _resolver("llama")
    with pytest.raises(PointUnavailableError) as info:
        resolver.resolve("q_norm_in.1")
    reason = get_family("llama").missing_reason(get_point("q_norm_in"))
    assert info.value.reason == reason and "no qk norm" in reason
    # A module path is looked up on the model the resolver was given.
    mlp = synthetic_model("llama").hf_model.get_submodule("model.layers.1.mlp")
    assert resolver.resolve("path.model.layers.1.mlp").tap.module is mlp


def test_a_resolver_over_a_module_without_an_hf_config_resolves_the_trunk() -> None:
    s = synthetic_model("llama").resolver.s
    resolver = Resolver(s, None, torch.nn.Module())
    assert resolver.config is None
    assert resolver.resolve("embeddings").width == s.shapes.d_model


def test_a_resolver_without_a_registered_family_gives_the_structural_reasons() -> None:
    # An architecture outside the family registry: each refusal says what the model lacks.
    model = synthetic_model("llama")
    resolver = Resolver(model.resolver.s, None, model.hf_model, model._probe)
    want = {
        "q_norm_in.1": "the attention has no per-head query/key norm (no QK-norm)",
        "attn_gate.1": "the attention has no output gate",
        "router_logits.1": "layer 1 has a dense MLP, not a mixture of experts",
    }
    for address, reason in want.items():
        with pytest.raises(PointUnavailableError) as info:
            resolver.resolve(address)
        assert info.value.reason == reason, address
    # Negative control: the registered family answers with its own reason instead.
    with pytest.raises(PointUnavailableError) as info:
        model.resolve("attn_gate.1")
    assert info.value.reason == get_family("llama").missing_reason(get_point("attn_gate"))
    assert info.value.reason != want["attn_gate.1"]


@pytest.mark.parametrize("which", ["q", "k"])
def test_qk_norm_points_are_the_projection_and_the_hf_norm_of_it(which: str) -> None:
    # Qwen3 norms each head of q_proj(attn_in) (k_proj for keys) before RoPE.
    model = synthetic_model("qwen3")
    attn: Any = model.hf_model.get_submodule("model.layers.1.self_attn")
    names = ["attn_in.1", f"{which}_norm_in.1", f"{which}_norm_out.1"]
    _, cache = model.forward_with_cache([model.to_tokens(PROMPT)], names)
    proj, norm = getattr(attn, f"{which}_proj"), getattr(attn, f"{which}_norm")
    with torch.no_grad():
        raw = proj(cache["attn_in.1"])
        normed = norm(raw.unflatten(-1, (-1, attn.head_dim))).flatten(-2)
    got_in = cache[f"{which}_norm_in.1"].flatten(2)
    got_out = cache[f"{which}_norm_out.1"].flatten(2)
    assert torch.allclose(got_in, raw, atol=1e-5, rtol=1e-5)
    assert torch.allclose(got_out, normed, atol=1e-5, rtol=1e-5)
    assert not torch.allclose(got_in, got_out, atol=1e-3)  # negative control: the norm acts
