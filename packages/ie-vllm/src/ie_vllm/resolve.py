"""Where each standardized point lives on vLLM's own module tree, per family layout.

A `SiteDef` is one hook on one module: how to read the point's `[tokens, width]` rows from the
hook's arguments or output, and how to write steered rows back. vLLM's decoder layers pass
`(hidden, residual)` between them, so residual points are read as their sum and written back as
`(new, zeros)`, which the next fused add-norm turns into exactly `new`.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch
from ie_core.families import family_for_architecture
from ie_core.points import POINTS, Point, Service, get_point
from torch import nn

Args = tuple[Any, ...]
Kwargs = dict[str, Any]
Reader = Callable[[Args, Kwargs, Any], torch.Tensor]
Writer = Callable[[Args, Kwargs, Any, torch.Tensor], Any]

# Points whose vLLM tensor is one head- or neuron-shard per rank under tensor parallelism.
SHARDED_POINTS = frozenset(
    {"q_norm_in", "q_norm_out", "k_norm_in", "k_norm_out", "value", "z", "mlp_act",
     "attn_scores", "attn_probs"}
)  # fmt: skip


@dataclass(frozen=True)
class Profile:
    """Module names of one family layout on vLLM's tree (relative to the causal-LM module)."""

    layers: str
    embed: str
    final_norm: str
    attn: str = "self_attn"
    qkv: str = "qkv_proj"
    o_proj: str = "o_proj"
    mlps: tuple[str, ...] = ("mlp", "block_sparse_moe")
    down: str = "down_proj"
    router: str = "gate"
    pre_mlp_norm: str = "post_attention_layernorm"  # its input is resid_mid
    post_attn_norm: str | None = None  # sandwich norms define the *_post points
    post_mlp_norm: str | None = None
    fused_residual: bool = True  # decoder layers take and return (hidden, residual)
    hidden_arg: int = 1  # position of hidden_states in the decoder layer's call
    embed_scale: bool = False  # vLLM multiplies the embedding output outside the module


LLAMA = Profile(layers="model.layers", embed="model.embed_tokens", final_norm="model.norm")
SANDWICH = Profile(
    layers="model.layers",
    embed="model.embed_tokens",
    final_norm="model.norm",
    pre_mlp_norm="pre_feedforward_layernorm",
    post_attn_norm="post_attention_layernorm",
    post_mlp_norm="post_feedforward_layernorm",
    embed_scale=True,
)
GPT2 = Profile(
    layers="transformer.h",
    embed="transformer.wte",
    final_norm="transformer.ln_f",
    attn="attn",
    qkv="c_attn",
    o_proj="c_proj",
    mlps=("mlp",),
    down="c_proj",
    pre_mlp_norm="ln_2",
    fused_residual=False,
    hidden_arg=0,
)

PROFILES: dict[str, Profile] = {
    "LlamaForCausalLM": LLAMA,
    "MistralForCausalLM": LLAMA,
    "Qwen2ForCausalLM": LLAMA,
    "Qwen3ForCausalLM": LLAMA,
    "MixtralForCausalLM": LLAMA,
    "Qwen3MoeForCausalLM": LLAMA,
    "Qwen2MoeForCausalLM": LLAMA,
    "Phi3ForCausalLM": LLAMA,
    "GemmaForCausalLM": Profile(
        layers="model.layers", embed="model.embed_tokens", final_norm="model.norm", embed_scale=True
    ),
    "Gemma2ForCausalLM": SANDWICH,
    "Gemma3ForCausalLM": SANDWICH,
    "GPT2LMHeadModel": GPT2,
}


@dataclass(frozen=True)
class SiteDef:
    """One hook: `pre` reads (args, kwargs), `post` reads the output; `write` None = read only."""

    name: str
    module: nn.Module
    hook: str  # "pre" | "post"
    read: Reader
    write: Writer | None
    width: int
    # "residual_pair": the hooked tensor is the sum of a `(hidden, residual)` output, which a
    # read-only static tap can read without materializing; "tensor" otherwise.
    kind: str = "tensor"


@dataclass(frozen=True)
class AttnGeom:
    """What recomputing attention scores needs, read from vLLM's attention layer."""

    heads: int
    kv_heads: int
    head_dim: int
    scale: float
    softcap: float
    window: int | None


@dataclass
class PointTable:
    """Every address this model serves (-> site name) and every refusal (-> reason)."""

    n_layers: int
    d_model: int
    sites: dict[str, SiteDef] = field(default_factory=dict)
    addresses: dict[str, str] = field(default_factory=dict)
    writable: set[str] = field(default_factory=set)
    refused: dict[str, str] = field(default_factory=dict)  # address or bare point name -> reason
    attn: dict[int, AttnGeom] = field(default_factory=dict)
    widths: dict[str, int] = field(default_factory=dict)  # address -> width

    def info(self) -> dict[str, Any]:
        """Plain data for the host: widths, writability, refusals, attention geometry."""
        return {
            "n_layers": self.n_layers,
            "d_model": self.d_model,
            "widths": dict(self.widths),
            "writable": sorted(self.writable),
            "refused": dict(self.refused),
            "attn_heads": {layer: g.heads for layer, g in self.attn.items()},
        }


def get_module(root: nn.Module, path: str) -> nn.Module | None:
    mod: Any = root
    for part in path.split("."):
        mod = mod[int(part)] if part.isdigit() else getattr(mod, part, None)
        if mod is None:
            return None
    return mod


def _first(x: Any) -> torch.Tensor:
    return x[0] if isinstance(x, tuple | list) else x


def _arg(args: Args, kwargs: Kwargs, name: str, index: int) -> torch.Tensor:
    return kwargs[name] if name in kwargs else args[index]


def _set_arg(args: Args, kwargs: Kwargs, name: str, index: int, value: Any) -> tuple[Args, Kwargs]:
    if name in kwargs:
        return args, {**kwargs, name: value}
    return (*args[:index], value, *args[index + 1 :]), kwargs


def _flat(t: torch.Tensor) -> torch.Tensor:
    return t.reshape(t.shape[0], -1)


# --- readers / writers ---------------------------------------------------------------------


def pre_arg(name: str, index: int) -> tuple[Reader, Writer]:
    """A module input; multi-dim inputs ([tokens, heads, dim]) are read flat."""

    def read(args: Args, kwargs: Kwargs, _: Any) -> torch.Tensor:
        return _flat(_arg(args, kwargs, name, index))

    def write(args: Args, kwargs: Kwargs, _: Any, new: torch.Tensor) -> Any:
        old = _arg(args, kwargs, name, index)
        return _set_arg(args, kwargs, name, index, new.reshape(old.shape))

    return read, write


def post_out() -> tuple[Reader, Writer]:
    """A module output (a tensor, or the first item of a `(out, bias)` tuple)."""

    def read(_a: Args, _k: Kwargs, out: Any) -> torch.Tensor:
        return _flat(_first(out))

    def write(_a: Args, _k: Kwargs, out: Any, new: torch.Tensor) -> Any:
        old = _first(out)
        new = new.reshape(old.shape)
        return (new, *out[1:]) if isinstance(out, tuple) else new

    return read, write


def scaled_out(scale: torch.Tensor) -> tuple[Reader, Writer]:
    """An output the model multiplies by `scale` outside the module (Gemma's embedding)."""

    def read(_a: Args, _k: Kwargs, out: Any) -> torch.Tensor:
        return _first(out) * scale

    def write(_a: Args, _k: Kwargs, out: Any, new: torch.Tensor) -> Any:
        return new / scale

    return read, write


def pre_sum(h_name: str, h_index: int, r_name: str, r_index: int) -> tuple[Reader, Writer]:
    """A residual passed as (hidden, residual) inputs: the stream is their sum (residual may be None)."""

    def read(args: Args, kwargs: Kwargs, _: Any) -> torch.Tensor:
        h = _arg(args, kwargs, h_name, h_index)
        r = _arg(args, kwargs, r_name, r_index) if len(args) > r_index or r_name in kwargs else None
        return h if r is None else h + r

    def write(args: Args, kwargs: Kwargs, _: Any, new: torch.Tensor) -> Any:
        has_r = len(args) > r_index or r_name in kwargs
        r = _arg(args, kwargs, r_name, r_index) if has_r else None
        args, kwargs = _set_arg(args, kwargs, h_name, h_index, new)
        if r is not None:
            args, kwargs = _set_arg(args, kwargs, r_name, r_index, torch.zeros_like(r))
        return args, kwargs

    return read, write


def post_sum() -> tuple[Reader, Writer]:
    """A decoder layer's `(hidden, residual)` output: the residual stream is their sum."""

    def read(_a: Args, _k: Kwargs, out: Any) -> torch.Tensor:
        return out[0] + out[1] if isinstance(out, tuple) else out

    def write(_a: Args, _k: Kwargs, out: Any, new: torch.Tensor) -> Any:
        return (new, torch.zeros_like(out[1])) if isinstance(out, tuple) else new

    return read, write


def column_slice(start: int, stop: int) -> tuple[Reader, Writer]:
    """Columns [start, stop) of a fused projection's output (the value third of qkv)."""

    def read(_a: Args, _k: Kwargs, out: Any) -> torch.Tensor:
        return _first(out)[..., start:stop]

    def write(_a: Args, _k: Kwargs, out: Any, new: torch.Tensor) -> Any:
        full = _first(out).clone()
        full[..., start:stop] = new
        return (full, *out[1:]) if isinstance(out, tuple) else full

    return read, write


def qkv_arg(index: int) -> tuple[Reader, Writer | None]:
    """Post-RoPE q (0) or k (1) as passed to vLLM's attention layer; read only."""

    def read(args: Args, kwargs: Kwargs, _: Any) -> torch.Tensor:
        names = ("query", "key")
        return _flat(kwargs[names[index]] if names[index] in kwargs else args[index])

    return read, None


# --- resolution ----------------------------------------------------------------------------


def profile_for(architecture: str) -> Profile | None:
    return PROFILES.get(architecture)


def _missing(architecture: str, point: Point, structural: str) -> str:
    family = family_for_architecture(architecture)
    if family is not None and not family.has_point(point):
        return family.missing_reason(point)
    return structural


def resolve(model: nn.Module, architecture: str, hf_config: Any, tp_size: int = 1) -> PointTable:
    """Build the point table of a loaded vLLM model."""
    profile = profile_for(architecture)
    layers = get_module(model, profile.layers) if profile else None
    d_model = int(getattr(hf_config, "hidden_size", 0) or getattr(hf_config, "n_embd", 0))
    n_layers = int(getattr(hf_config, "num_hidden_layers", 0) or getattr(hf_config, "n_layer", 0))
    table = PointTable(n_layers=n_layers, d_model=d_model)
    if profile is None or layers is None:
        why = (
            f"ie-vllm has no map of {architecture}'s modules on vLLM; "
            "use backend='eager' for this model"
        )
        for p in POINTS:
            table.refused[p.name] = why
        return table

    def add(address: str, site: SiteDef, writable: bool = True) -> None:
        table.sites.setdefault(site.name, site)
        table.addresses[address] = site.name
        table.widths[address] = site.width
        if writable and site.write is not None:
            table.writable.add(address)

    def site(
        name: str,
        module: nn.Module,
        hook: str,
        rw: tuple[Reader, Writer | None],
        width: int,
        kind: str = "tensor",
    ) -> SiteDef:
        return SiteDef(name, module, hook, rw[0], rw[1], width, kind)

    # Trunk points.
    embed = get_module(model, profile.embed)
    if embed is not None:
        lm = get_module(model, profile.layers.rsplit(".", 1)[0])
        normalizer = getattr(lm, "normalizer", None) if profile.embed_scale else None
        rw = scaled_out(normalizer) if normalizer is not None else post_out()
        add("embeddings", site("embeddings", embed, "post", rw, d_model))
    norm = get_module(model, profile.final_norm)
    if norm is not None:
        add("final_norm", site("final_norm", norm, "post", post_out(), d_model))

    for i, layer in enumerate(layers):
        if layer.__class__.__name__ == "PPMissingLayer":
            continue
        _resolve_layer(table, profile, architecture, hf_config, i, layer, add, site, d_model)

    _refuse_rest(table, architecture, tp_size)
    return table


def _resolve_layer(
    table: PointTable,
    profile: Profile,
    architecture: str,
    hf_config: Any,
    i: int,
    layer: nn.Module,
    add: Callable[..., None],
    site: Callable[..., SiteDef],
    d_model: int,
) -> None:
    if profile.fused_residual:
        rs_pre = pre_sum("hidden_states", profile.hidden_arg, "residual", profile.hidden_arg + 1)
        rs_post = post_sum()
        post_kind = "residual_pair"
    else:
        rs_pre = pre_arg("hidden_states", profile.hidden_arg)
        rs_post = post_out()
        post_kind = "tensor"
    add(f"resid_pre.{i}", site(f"resid_pre.{i}", layer, "pre", rs_pre, d_model))
    add(f"resid_post.{i}", site(f"resid_post.{i}", layer, "post", rs_post, d_model, post_kind))

    attn = getattr(layer, profile.attn, None)
    if attn is not None:
        add(
            f"attn_in.{i}",
            site(
                f"attn_in.{i}",
                attn,
                "pre",
                pre_arg("hidden_states", 1 if profile.fused_residual else 0),
                d_model,
            ),
        )
        add(f"attn_out.{i}", site(f"attn_out.{i}", attn, "post", post_out(), d_model))
        _resolve_attention(table, attn, profile, i, add, site)

    post_attn = getattr(layer, profile.post_attn_norm, None) if profile.post_attn_norm else None
    if post_attn is not None:
        add(
            f"attn_out_post.{i}", site(f"attn_out_post.{i}", post_attn, "post", post_out(), d_model)
        )
    elif attn is not None:
        add(f"attn_out_post.{i}", table.sites[f"attn_out.{i}"])

    pre_mlp = getattr(layer, profile.pre_mlp_norm, None)
    if pre_mlp is not None:
        rw = pre_sum("x", 0, "residual", 1) if profile.fused_residual else pre_arg("x", 0)
        # Unfused layers keep their own copy of the residual: a write to the norm's input
        # would not reach it, so resid_mid is read only there.
        s = site(f"resid_mid.{i}", pre_mlp, "pre", rw, d_model)
        add(f"resid_mid.{i}", s, writable=profile.fused_residual)

    mlp = next((m for n in profile.mlps if (m := getattr(layer, n, None)) is not None), None)
    if mlp is not None:
        add(f"mlp_in.{i}", site(f"mlp_in.{i}", mlp, "pre", pre_arg("hidden_states", 0), d_model))
        add(f"mlp_out.{i}", site(f"mlp_out.{i}", mlp, "post", post_out(), d_model))
        down = getattr(mlp, profile.down, None)
        if down is not None:
            width = int(
                getattr(down, "input_size_per_partition", 0) or getattr(down, "input_size", 0)
            )
            add(f"mlp_act.{i}", site(f"mlp_act.{i}", down, "pre", pre_arg("input_", 0), width))
        else:
            table.refused[f"mlp_act.{i}"] = (
                "unreachable on vLLM: the experts of this sparse layer run in one fused MoE "
                "kernel, so no down-projection input exists; use backend='eager'"
            )
        router = getattr(mlp, profile.router, None)
        experts = getattr(mlp, "experts", None)
        if router is not None and experts is not None:
            n_exp = int(
                getattr(router, "output_size", 0) or getattr(experts, "global_num_experts", 0)
            )
            add(
                f"router_logits.{i}",
                site(f"router_logits.{i}", router, "post", post_out(), n_exp),
                writable=False,
            )
        elif _family_has(architecture, "router_logits"):
            table.refused[f"router_logits.{i}"] = f"layer {i} is a dense MLP layer with no router"

    post_mlp = getattr(layer, profile.post_mlp_norm, None) if profile.post_mlp_norm else None
    if post_mlp is not None:
        add(f"mlp_out_post.{i}", site(f"mlp_out_post.{i}", post_mlp, "post", post_out(), d_model))
    elif mlp is not None:
        add(f"mlp_out_post.{i}", table.sites[f"mlp_out.{i}"])


def _family_has(architecture: str, point: str) -> bool:
    family = family_for_architecture(architecture)
    return family is not None and family.has_point(get_point(point))


def _resolve_attention(
    table: PointTable,
    attn: nn.Module,
    profile: Profile,
    i: int,
    add: Callable[..., None],
    site: Callable[..., SiteDef],
) -> None:
    inner = getattr(attn, "attn", None)
    heads = int(getattr(inner, "num_heads", 0))
    kv_heads = int(getattr(inner, "num_kv_heads", 0))
    head_dim = int(getattr(inner, "head_size", 0))
    q_size, kv_size = heads * head_dim, kv_heads * head_dim
    qkv = getattr(attn, profile.qkv, None)
    if qkv is not None and inner is not None:
        add(
            f"value.{i}",
            site(
                f"value.{i}",
                qkv,
                "post",
                column_slice(q_size + kv_size, q_size + 2 * kv_size),
                kv_size,
            ),
        )
    o_proj = getattr(attn, profile.o_proj, None)
    if o_proj is not None:
        add(f"z.{i}", site(f"z.{i}", o_proj, "pre", pre_arg("input_", 0), q_size))
    for norm_name, point, width in (("q_norm", "q", q_size), ("k_norm", "k", kv_size)):
        norm = getattr(attn, norm_name, None)
        if norm is None:
            continue
        add(
            f"{point}_norm_in.{i}",
            site(f"{point}_norm_in.{i}", norm, "pre", pre_arg("x", 0), width),
        )
        add(f"{point}_norm_out.{i}", site(f"{point}_norm_out.{i}", norm, "post", post_out(), width))
    if inner is not None:
        impl = getattr(inner, "impl", None)
        table.attn[i] = AttnGeom(
            heads=heads,
            kv_heads=kv_heads,
            head_dim=head_dim,
            scale=float(getattr(impl, "scale", head_dim**-0.5)),
            softcap=float(getattr(impl, "logits_soft_cap", 0.0) or 0.0),
            window=getattr(inner, "sliding_window", None),
        )
        table.sites[f"attn_q.{i}"] = site(f"attn_q.{i}", inner, "pre", qkv_arg(0), q_size)
        table.sites[f"attn_k.{i}"] = site(f"attn_k.{i}", inner, "pre", qkv_arg(1), kv_size)
        for p in ("attn_scores", "attn_probs"):
            table.widths[f"{p}.{i}"] = heads


def _refuse_rest(table: PointTable, architecture: str, tp_size: int) -> None:
    """Give every point that resolved nowhere its reason: not served, family lacks it, TP shard."""
    served_names = {a.split(".")[0] for a in table.widths}
    for p in POINTS:
        if p.vllm.service is Service.NOT_SERVED:
            table.refused[p.name] = f"{p.name} is {p.vllm.reason}"
        elif p.name not in served_names:
            table.refused.setdefault(
                p.name,
                _missing(architecture, p, f"{architecture} on vLLM has no module for {p.name}"),
            )
        if tp_size > 1 and p.name in SHARDED_POINTS:
            table.refused[p.name] = (
                f"{p.name} is split across heads or neurons under tensor parallelism "
                f"(tensor_parallel_size={tp_size}): each rank holds a shard; load with "
                "tensor_parallel_size=1 or use backend='eager'"
            )
    if tp_size > 1:
        for address in list(table.widths):
            if address.split(".")[0] in SHARDED_POINTS:
                table.widths.pop(address)
                table.addresses.pop(address, None)
                table.writable.discard(address)
