"""Where things are in a loaded HF causal LM: decoder blocks, their attention and MLP modules,
norms, projections, and the config facts (parallel block, sandwich norms, multipliers) that decide
how a point maps onto them. Found by module-name vocabularies and shapes, never per checkpoint."""

from __future__ import annotations

import inspect
from dataclasses import dataclass
from typing import Any

from torch import nn

ATTN_NAMES = ("self_attn", "attn", "attention", "self_attention")
# Token mixers of hybrid families that are not softmax attention (gated delta, Mamba, short conv):
# they take the attention slot of the block (attn_in / attn_out), never the attention internals.
LINEAR_MIXER_NAMES = ("linear_attn", "mamba", "conv")
# Hyper-connection modules of multi-stream trunks (DeepSeek-V4): (write, mix, collapse) outputs.
ATTN_HC_NAMES = ("attn_hc",)
MLP_HC_NAMES = ("ffn_hc",)
STREAM_HEAD_NAMES = ("hc_head",)
MLA_KV_NAMES = ("kv_b_proj",)
SHARED_KV_NAMES = ("kv_proj",)  # DeepSeek-V4: one projection read as both key and value
MLP_NAMES = ("mlp", "feed_forward", "block_sparse_moe", "ffn", "shared_mlp")
# An always-on MLP beside the routed one whose outputs the block adds inline (Granite-4.0-H:
# `block_sparse_moe(h) + shared_mlp(h)`), and the norm whose output both read.
SIBLING_MLP_NAMES = ("shared_mlp",)
PRE_MLP_NORM_NAMES = ("post_attention_layernorm",)
Q_NORM_NAMES = ("q_norm", "q_layernorm", "query_layernorm")
K_NORM_NAMES = ("k_norm", "k_layernorm", "key_layernorm")
V_PROJ_NAMES = ("v_proj", "value")
Q_PROJ_NAMES = ("q_proj", "query")
K_PROJ_NAMES = ("k_proj", "key")
FUSED_QKV_NAMES = ("qkv_proj", "query_key_value", "c_attn", "Wqkv")
O_PROJ_NAMES = ("o_proj", "out_proj", "dense", "c_proj", "o_a_proj")
GATE_NAMES = ("gate_proj", "w1")
UP_NAMES = ("up_proj", "w3")
FUSED_GATE_UP_NAMES = ("gate_up_proj",)
PLAIN_IN_NAMES = ("fc1", "c_fc", "dense_h_to_4h", "fc_in")
DOWN_NAMES = ("down_proj", "w2", "fc2", "c_proj", "dense_4h_to_h", "fc_out")
ROUTER_NAMES = ("gate", "router")
EXPERTS_NAMES = ("experts",)
POST_MLP_NORM_NAMES = ("post_feedforward_layernorm", "post_mlp_layernorm")
POST_ATTN_NORM_NAMES = ("post_attention_layernorm",)
# LFM2 names its final norm `embedding_norm` (it runs after the last block).
FINAL_NORM_NAMES = (
    "norm", "ln_f", "final_layer_norm", "final_layernorm", "final_norm", "embedding_norm"
)  # fmt: skip


def child(module: nn.Module, names: tuple[str, ...]) -> tuple[str, nn.Module] | None:
    """The first direct child of `module` whose name is in `names`."""
    for name in names:
        sub = getattr(module, name, None)
        if isinstance(sub, nn.Module):
            return name, sub
    return None


def out_features(module: nn.Module) -> int:
    """Output width of a Linear or a GPT-2 style Conv1D (weight stored [in, out])."""
    linear: Any = module  # the attributes are read after the hasattr checks
    if hasattr(linear, "out_features"):
        return int(linear.out_features)
    if hasattr(linear, "nf"):
        return int(linear.nf)
    return int(linear.weight.shape[0])


def in_features(module: nn.Module) -> int:
    linear: Any = module
    if hasattr(linear, "in_features"):
        return int(linear.in_features)
    if hasattr(linear, "nf"):
        return int(linear.weight.shape[0])
    return int(linear.weight.shape[1])


def _is_norm(module: nn.Module) -> bool:
    return "norm" in type(module).__name__.lower()


@dataclass(frozen=True)
class Shapes:
    d_model: int
    n_heads: int
    n_kv_heads: int
    head_dim: int
    vocab: int


def config_shapes(config: Any, text_config: Any) -> Shapes:
    c = text_config
    d = _first(c, "hidden_size", "n_embd", "d_model")
    heads = _first(c, "num_attention_heads", "n_head", "num_heads")
    kv = _first(c, "num_key_value_heads", "num_kv_heads", default=None)
    if kv is None:
        kv = 1 if getattr(c, "multi_query", False) else heads
    if getattr(c, "new_decoder_architecture", None) is False and getattr(c, "multi_query", False):
        kv = 1
    head_dim = getattr(c, "head_dim", None) or d // heads
    return Shapes(int(d), int(heads), int(kv), int(head_dim), int(_first(c, "vocab_size")))


def _first(obj: Any, *names: str, default: Any = ...) -> Any:
    for name in names:
        value = getattr(obj, name, None)
        if value is not None:
            return value
    if default is ...:
        raise ValueError(f"config has none of {names}")
    return default


@dataclass(frozen=True)
class Block:
    """One decoder block and the modules the points land on (paths are from the model root)."""

    index: int
    path: str
    module: nn.Module
    attn: tuple[str, nn.Module] | None
    mlp: tuple[str, nn.Module] | None  # the block itself on OPT, whose fc1/fc2 sit on the block
    parallel: bool
    post_attn_norm: tuple[str, nn.Module] | None  # sandwich norms only
    post_mlp_norm: tuple[str, nn.Module] | None
    attn_adds_residual: bool  # BLOOM: the attention and MLP modules add the residual themselves
    mixer: str | None = None  # the linear-attention / SSM / conv module name on hybrid layers
    attn_hc: tuple[str, nn.Module] | None = None  # hyper-connections (multi-stream trunks)
    mlp_hc: tuple[str, nn.Module] | None = None
    # Granite-4.0-H: an MLP beside `mlp`, summed with it in the block forward, and their input norm.
    sibling_mlp: tuple[str, nn.Module] | None = None
    pre_mlp_norm: tuple[str, nn.Module] | None = None

    def sub(
        self, owner: tuple[str, nn.Module] | None, names: tuple[str, ...]
    ) -> tuple[str, nn.Module] | None:
        if owner is None:
            return None
        found = child(owner[1], names)
        if found is None:
            return None
        prefix = f"{owner[0]}." if owner[0] else ""
        return prefix + found[0], found[1]

    @property
    def moe(self) -> bool:
        return (
            self.sub(self.mlp, EXPERTS_NAMES) is not None
            and self.sub(self.mlp, ROUTER_NAMES) is not None
        )


@dataclass(frozen=True)
class Structure:
    layers_path: str
    blocks: tuple[Block, ...]
    embed: tuple[str, nn.Module]
    final_norm: tuple[str, nn.Module] | None
    lm_head: tuple[str, nn.Module]
    shapes: Shapes
    residual_multiplier: float | None
    multi_stream: bool
    n_streams: int = 1  # residual streams of a hyper-connection trunk (1 elsewhere)
    stream_head: tuple[str, nn.Module] | None = None  # collapses the streams before the final norm


def find_layers(model: nn.Module, n_layers: int) -> tuple[str, nn.ModuleList]:
    """The ModuleList of decoder blocks: `n_layers` long, each element holding an attention child."""
    for name, mod in model.named_modules():
        if (
            isinstance(mod, nn.ModuleList)
            and len(mod) == n_layers > 0
            and any(child(block, ATTN_NAMES) for block in mod)
        ):
            return name, mod
    raise ValueError(
        f"no ModuleList of {n_layers} decoder blocks with an attention child "
        f"({', '.join(ATTN_NAMES)}) in {type(model).__name__}"
    )


def _block_is_parallel(block: nn.Module, config: Any) -> bool:
    for flag in ("use_parallel_residual", "parallel_attn"):
        value = getattr(config, flag, None)
        if value is not None:
            return bool(value)
    norms = [n for n, m in block.named_children() if _is_norm(m)]
    return len(norms) <= 1


def _block(index: int, path: str, block: nn.Module, config: Any) -> Block:
    attn = child(block, ATTN_NAMES)
    mixer = None
    if attn is None:
        attn = child(block, LINEAR_MIXER_NAMES)
        mixer = attn[0] if attn is not None else None
    mlp = child(block, MLP_NAMES)
    if mlp is None and child(block, PLAIN_IN_NAMES) and child(block, DOWN_NAMES):
        mlp = ("", block)  # OPT keeps fc1/fc2 on the block itself
    post_mlp = child(block, POST_MLP_NORM_NAMES)
    post_attn = child(block, POST_ATTN_NORM_NAMES) if post_mlp is not None else None
    adds_residual = attn is not None and "residual" in inspect.signature(attn[1].forward).parameters
    sibling = child(block, SIBLING_MLP_NAMES)
    if sibling is not None and (mlp is None or sibling[1] is mlp[1]):
        sibling = None  # a dense Granite-4.0-H layer: the shared MLP is the only MLP
    return Block(
        index=index,
        path=path,
        module=block,
        attn=attn,
        mlp=mlp,
        parallel=_block_is_parallel(block, config),
        post_attn_norm=post_attn,
        post_mlp_norm=post_mlp,
        attn_adds_residual=adds_residual,
        mixer=mixer,
        attn_hc=child(block, ATTN_HC_NAMES),
        mlp_hc=child(block, MLP_HC_NAMES),
        sibling_mlp=sibling,
        pre_mlp_norm=child(block, PRE_MLP_NORM_NAMES) if sibling is not None else None,
    )


def _path_of(model: nn.Module, target: nn.Module) -> str:
    for name, mod in model.named_modules():
        if mod is target:
            return name
    raise ValueError(f"module {type(target).__name__} is not part of the model")


def _container_child(
    container: nn.Module, container_path: str, names: tuple[str, ...]
) -> tuple[str, nn.Module] | None:
    found = child(container, names)
    if found is None:
        return None
    return (f"{container_path}.{found[0]}" if container_path else found[0], found[1])


def analyze(model: Any, config: Any, text_config: Any, n_layers: int) -> Structure:
    layers_path, layers = find_layers(model, n_layers)
    blocks = tuple(_block(i, f"{layers_path}.{i}", b, text_config) for i, b in enumerate(layers))
    container_path = layers_path.rsplit(".", 1)[0] if "." in layers_path else ""
    container = model.get_submodule(container_path) if container_path else model
    final_norm = _container_child(container, container_path, FINAL_NORM_NAMES)
    embed_mod = model.get_input_embeddings()
    head_mod = model.get_output_embeddings()
    if head_mod is None:
        raise ValueError(f"{type(model).__name__} has no output embedding (lm_head)")
    mult = getattr(text_config, "residual_multiplier", None)
    return Structure(
        layers_path=layers_path,
        blocks=blocks,
        embed=(_path_of(model, embed_mod), embed_mod),
        final_norm=final_norm,
        lm_head=(_path_of(model, head_mod), head_mod),
        shapes=config_shapes(config, text_config),
        residual_multiplier=None if mult in (None, 1.0) else float(mult),
        multi_stream=int(getattr(text_config, "hc_mult", 1) or 1) > 1,
        n_streams=int(getattr(text_config, "hc_mult", 1) or 1),
        stream_head=_container_child(container, container_path, STREAM_HEAD_NAMES),
    )
