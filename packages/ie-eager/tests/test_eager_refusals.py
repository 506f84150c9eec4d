"""The resolver's refusals and its answers for layouts the synthetic families do not reach: a
block without its attention or MLP module, a gate projection without an up projection, a router
without weight or top_k, a dense MLP with a router-named child, a composite config over a fused
QKV. Each refusal is checked word for word (a half-resolved tap would raise another error), with
the model as loaded as the negative control."""

from __future__ import annotations

import dataclasses
from types import SimpleNamespace
from typing import Any

import pytest
import torch
from eager_support import refusal_reason, synthetic_model
from ie_core.errors import MissingLayerError
from ie_core.grammar import Address, get_family, get_point
from ie_eager.resolve import Resolver
from ie_eager.selectors import Grouped, LastSlice
from ie_eager.structure import Block


def _resolver(slug: str, layer: int = 1, model: Any = None, **parts: object) -> Resolver:
    """The model's own resolver with block `layer` changed by `parts` (and over `model`)."""
    m = synthetic_model(slug)
    s = m.resolver.s
    blocks = list(s.blocks)
    blocks[layer] = dataclasses.replace(blocks[layer], **parts)
    structure = dataclasses.replace(s, blocks=tuple(blocks))
    return Resolver(structure, m.resolver.family, m.hf_model if model is None else model)


def _keep(module: torch.nn.Module, names: tuple[str, ...], **extra: torch.nn.Module) -> Any:
    """A stand-in for `module` with only the named children (and `extra` ones)."""
    kept = torch.nn.Module()
    for name in names:
        kept.add_module(name, module.get_submodule(name))
    for name, child in extra.items():
        kept.add_module(name, child)
    return kept


def _block(slug: str, layer: int = 1) -> Block:
    return synthetic_model(slug).resolver.s.blocks[layer]


def test_a_block_without_attention_refuses_its_attention_side_with_the_reason() -> None:
    resolver = _resolver("llama", attn=None)
    assert refusal_reason(resolver, "attn_in.1") == "no attention module found in the block"
    assert refusal_reason(resolver, "attn_out.1") == "no attention module found"
    for name in ("attn_out_post", "resid_mid"):
        assert refusal_reason(resolver, f"{name}.1") == "no sublayer module found"
    assert (
        refusal_reason(resolver, "value.1") == "no value projection (v_proj or a fused qkv) found"
    )
    # Negative control: layer 0 keeps its attention.
    for name in ("attn_in", "attn_out", "attn_out_post", "resid_mid", "value"):
        assert resolver.resolve(f"{name}.0").tap is not None


def test_a_block_without_an_mlp_refuses_its_mlp_side_with_the_reason() -> None:
    resolver = _resolver("llama", mlp=None, pre_mlp_norm=None)
    assert refusal_reason(resolver, "mlp_in.1") == "no MLP module found"
    assert refusal_reason(resolver, "mlp_out.1") == "no MLP module found"
    assert refusal_reason(resolver, "mlp_out_post.1") == "no sublayer module found"
    for name in ("mlp_in", "mlp_out", "mlp_out_post"):
        assert resolver.resolve(f"{name}.0").width == synthetic_model("llama").d_model


def test_a_gate_without_an_up_projection_is_not_a_gated_mlp() -> None:
    mlp = _block("llama").mlp
    assert mlp is not None
    resolver = _resolver("llama", mlp=(mlp[0], _keep(mlp[1], ("gate_proj", "down_proj"))))
    assert refusal_reason(resolver, "mlp_pre_linear.1") == (
        "the MLP is not gated (no separate up projection)"
    )
    assert refusal_reason(resolver, "mlp_pre.1") == "no first MLP projection found"
    assert resolver.resolve("mlp_act.1").tap.module is mlp[1].get_submodule("down_proj")


STRUCTURAL = {  # (family, address) -> what a resolver without a registered family says
    ("llama", "attn_stream_mix.1"): "the model has a single residual stream, so there are no "
    "stream coordinates or hyper-connection points; use the plain residual points",
    ("qwen3-moe", "mlp_act.1"): "layer 1 is a sparse mixture-of-experts layer: each expert has "
    "its own MLP activations over the tokens routed to it, so there is no single [batch, seq, "
    "d_mlp] tensor; capture router_logits / expert_indices or mlp_out",
    ("gpt-j", "resid_mid.1"): "attention and MLP run in parallel on this block, so there is no "
    "residual between them; use resid_pre (what both read) or resid_post",
    ("deepseek-v4", "mlp_out.1.stream-0"): "only resid_pre, resid_mid and resid_post take a stream",
    ("deepseek-v4", "resid_pre.1"): "the trunk carries 4 residual streams: name one "
    "(resid_pre.1.stream-0 to stream-3) or read resid_streams.1 for the whole stack",
    ("deepseek-v4", "value.1"): "keys and values are one shared single-head tensor (kv_proj, then "
    "kv_norm and RoPE on its rope slice), so there is no separate value projection; read the "
    "module with path.model.layers.1.self_attn.kv_norm",
}


@pytest.mark.parametrize(("slug", "address"), sorted(STRUCTURAL))
def test_a_resolver_without_a_family_names_what_the_structure_lacks(
    slug: str, address: str
) -> None:
    m = synthetic_model(slug)
    bare = Resolver(m.resolver.s, None, m.hf_model, m._probe)
    assert refusal_reason(bare, address) == STRUCTURAL[slug, address]
    # The registered family refuses it too, with this reason or its own.
    family = m.resolver.family
    assert family is not None
    own = family.missing_reason(get_point(address.split(".")[0]))
    assert refusal_reason(m.resolver, address) in (STRUCTURAL[slug, address], own)


def test_a_trunk_point_takes_no_stream_on_a_multi_stream_model() -> None:
    resolver = synthetic_model("deepseek-v4").resolver
    for name in ("embeddings", "final_norm"):
        assert refusal_reason(resolver, f"{name}.stream-0") == (
            "only resid_pre, resid_mid and resid_post take a stream"
        )
        assert resolver.resolve(name).width == synthetic_model("deepseek-v4").d_model


def test_resolve_checks_the_address_and_remembers_its_answer() -> None:
    resolver = _resolver("llama")
    with pytest.raises(MissingLayerError):
        resolver.resolve("resid_post")
    first = resolver.resolve("resid_post.1")
    assert resolver.resolve(Address("resid_post", 1)) is first
    assert resolver.resolve("resid_post.0") is not first


def test_a_router_without_weight_or_top_k_has_no_known_width() -> None:
    block = _block("qwen3-moe")
    assert block.moe and block.mlp is not None
    bare = _keep(block.mlp[1], ("experts",), gate=torch.nn.Identity())
    resolver = _resolver("qwen3-moe", mlp=(block.mlp[0], bare))
    for name in ("router_logits", "expert_weights", "expert_indices"):
        got = resolver.resolve(f"{name}.1")
        assert got.tap.module is bare.gate and got.width is None
    # Negative control: the real router's linear and top_k give the widths.
    config: Any = synthetic_model("qwen3-moe").hf_model.config
    assert _resolver("qwen3-moe").resolve("router_logits.1").width == config.num_experts
    assert _resolver("qwen3-moe").resolve("expert_weights.1").width == config.num_experts_per_tok


def test_a_dense_mlp_with_a_router_named_child_is_not_a_mixture_of_experts() -> None:
    mlp = _block("llama").mlp
    assert mlp is not None
    names = ("gate_proj", "up_proj", "down_proj")
    resolver = _resolver("llama", mlp=(mlp[0], _keep(mlp[1], names, router=torch.nn.Linear(4, 2))))
    want = get_family("llama").missing_reason(get_point("router_logits"))
    assert refusal_reason(resolver, "router_logits.1") == want
    without = Resolver(resolver.s, None, resolver.model)
    assert refusal_reason(without, "router_logits.1") == (
        "layer 1 has a dense MLP, not a mixture of experts"
    )
    assert without.resolve("mlp_pre.1").tap.module is mlp[1].get_submodule("gate_proj")


class _Composite(SimpleNamespace):
    """A multimodal config: the text model's settings are one level down."""

    def get_text_config(self) -> Any:
        return self.text_config


def test_falcons_fused_qkv_layout_comes_from_the_text_config() -> None:
    # Falcon's new_decoder_architecture groups query_key_value per KV head group; under a
    # composite config the flag is on the text config only.
    falcon = synthetic_model("falcon")
    config: Any = falcon.hf_model.config
    assert config.new_decoder_architecture and config.num_kv_heads < config.num_attention_heads
    wrapper = torch.nn.Module()
    wrapper.config = _Composite(text_config=config)  # type: ignore[assignment]
    composite = Resolver(falcon.resolver.s, falcon.resolver.family, wrapper)
    want = falcon.resolve("value.1").tap.select
    assert isinstance(want, Grouped)
    assert composite.resolve("value.1").tap.select == want
    # Without the flag the same projection has no known layout (negative control).
    flat = Resolver(falcon.resolver.s, falcon.resolver.family, torch.nn.Module())
    assert refusal_reason(flat, "value.1") == (
        "fused query_key_value with grouped KV heads has no known layout"
    )


def test_a_resolver_without_a_config_reads_gpt2s_value_as_the_last_third_of_c_attn() -> None:
    gpt2 = synthetic_model("gpt2")
    bare = Resolver(gpt2.resolver.s, gpt2.resolver.family, torch.nn.Module())
    got = bare.resolve("value.1")
    assert isinstance(got.tap.select, LastSlice)
    assert got.tap.select == gpt2.resolve("value.1").tap.select
