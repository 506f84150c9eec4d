"""Where each standardized point lives on vLLM's own module tree, per family layout.

A `SiteDef` is one hook on one module: how to read the point's `[tokens, width]` rows from the
hook's arguments or output, and how to write steered rows back. vLLM's decoder layers pass
`(hidden, residual)` between them, so residual points are read as their sum and written back as
`(new, zeros)`, which the next fused add-norm turns into exactly `new`.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any, cast

from ie_core.address import to_address
from ie_core.families import family_for_architecture
from ie_core.points import POINTS, Point, Service, get_point
from torch import nn

from ie_vllm.access import (
    BranchSum,
    Reader,
    Writer,
    column_slice,
    head_slice,
    post_first,
    post_out,
    post_sum,
    pre_arg,
    pre_sum,
    qkv_arg,
    scaled_out,
)
from ie_vllm.point_table import AttnGeom, PointTable, SiteDef
from ie_vllm.profiles import Profile, profile_for

# Points whose vLLM tensor is one head- or neuron-shard per rank under tensor parallelism.
SHARDED_POINTS = frozenset(
    {"q_norm_in", "q_norm_out", "k_norm_in", "k_norm_out", "value", "z", "mlp_act",
     "attn_scores", "attn_probs"}
)  # fmt: skip


def get_module(root: nn.Module, path: str) -> nn.Module | None:
    mod: Any = root
    for part in path.split("."):
        mod = mod[int(part)] if part.isdigit() else getattr(mod, part, None)
        if mod is None:
            return None
    return mod


# --- resolution ----------------------------------------------------------------------------


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
    bt = profile.batched
    embed = get_module(model, profile.embed)
    if embed is not None:
        lm = get_module(model, profile.layers.rsplit(".", 1)[0])
        scale = getattr(lm, "normalizer", None) if profile.embed_scale else None
        rw = scaled_out(scale, bt) if scale is not None else post_out(bt)
        add("embeddings", site("embeddings", embed, "post", rw, d_model))
    norm = get_module(model, profile.final_norm)
    if norm is not None:
        add("final_norm", site("final_norm", norm, "post", post_out(bt), d_model))

    for i, layer in enumerate(cast("Iterable[nn.Module]", layers)):
        if layer.__class__.__name__ == "PPMissingLayer":
            continue
        _resolve_layer(table, profile, architecture, hf_config, i, layer, add, site, d_model)

    _refuse_rest(table, architecture, tp_size)
    return table


def _residual_rw(profile: Profile) -> tuple[tuple[Reader, Writer], tuple[Reader, Writer]]:
    """Readers/writers of a decoder layer's residual input and output."""
    if profile.fused_residual:
        h = profile.hidden_arg
        r = profile.residual_arg if profile.residual_arg is not None else h + 1
        return pre_sum("hidden_states", h, "residual", r), post_sum()
    pre = pre_arg("hidden_states", profile.hidden_arg, profile.batched)
    return pre, (post_first() if profile.first_out else post_out(profile.batched))


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
    bt = profile.batched
    rs_pre, rs_post = _residual_rw(profile)
    # A fused layer returns (hidden, residual): a static tap reads their sum without storing it.
    post_kind = "residual_pair" if profile.fused_residual else "tensor"
    add(f"resid_pre.{i}", site(f"resid_pre.{i}", layer, "pre", rs_pre, d_model))
    add(f"resid_post.{i}", site(f"resid_post.{i}", layer, "post", rs_post, d_model, post_kind))
    m = profile.residual_multiplier
    mult = float(getattr(hf_config, m, 1.0)) if m else None

    attn = getattr(layer, profile.attn, None)
    if attn is not None:
        a = profile.attn_hidden_arg
        a = a if a is not None else (1 if profile.fused_residual else 0)
        attn_arg = pre_arg("hidden_states", a, bt)
        add(f"attn_in.{i}", site(f"attn_in.{i}", attn, "pre", attn_arg, d_model))
        add(f"attn_out.{i}", site(f"attn_out.{i}", attn, "post", post_out(bt), d_model))
        _resolve_attention(table, attn, profile, i, add, site)

    post_attn = getattr(layer, profile.post_attn_norm, None) if profile.post_attn_norm else None
    if post_attn is not None:
        add(
            f"attn_out_post.{i}",
            site(f"attn_out_post.{i}", post_attn, "post", post_out(bt), d_model),
        )
    elif attn is not None and mult is not None:
        # Granite adds attn_out * residual_multiplier to the stream, outside any module.
        rw = scaled_out(mult, bt)
        add(f"attn_out_post.{i}", site(f"attn_out_post.{i}", attn, "post", rw, d_model))
    elif attn is not None:
        add(f"attn_out_post.{i}", table.sites[f"attn_out.{i}"])
    if attn is None:
        _resolve_mixer(table, profile, i, layer, add, site, d_model, mult)

    if not _is_parallel(profile, hf_config):
        _resolve_resid_mid(profile, i, layer, add, site, d_model)

    _resolve_mlp(table, profile, architecture, i, layer, add, site, d_model, mult)


def _resolve_mixer(
    table: PointTable,
    profile: Profile,
    i: int,
    layer: nn.Module,
    add: Callable[..., None],
    site: Callable[..., SiteDef],
    d_model: int,
    mult: float | None,
) -> None:
    """A layer whose token mixer is not attention (Mamba2): attn_in / attn_out are its input and
    output; the attention-only points are refused at this layer."""
    name, mixer = next(
        ((n, m) for n in profile.mixers if (m := getattr(layer, n, None)) is not None), ("", None)
    )
    if mixer is None:
        return
    add(f"attn_in.{i}", site(f"attn_in.{i}", mixer, "pre", pre_arg("hidden_states", 0), d_model))
    add(f"attn_out.{i}", site(f"attn_out.{i}", mixer, "post", post_out(), d_model))
    if mult is not None:
        rw = scaled_out(mult)
        add(f"attn_out_post.{i}", site(f"attn_out_post.{i}", mixer, "post", rw, d_model))
    else:
        add(f"attn_out_post.{i}", table.sites[f"attn_out.{i}"])
    why = (
        f"layer {i} mixes tokens with {type(mixer).__name__} ({name}), a state-space layer with "
        "no softmax attention, heads' scores or value projection; its input and output are "
        "attn_in and attn_out"
    )
    for point in ("value", "z", "attn_scores", "attn_probs"):
        table.refused[f"{point}.{i}"] = why


def _is_parallel(profile: Profile, hf_config: Any) -> bool:
    """Parallel blocks per the config when it says (GPT-NeoX, Falcon), else per the profile."""
    if hasattr(hf_config, "use_parallel_residual") and profile.parallel:
        return bool(hf_config.use_parallel_residual)
    if hasattr(hf_config, "parallel_attn") and profile.attn == "self_attention":
        return bool(hf_config.parallel_attn or getattr(hf_config, "new_decoder_architecture", 0))
    return profile.parallel


def _resolve_resid_mid(
    profile: Profile,
    i: int,
    layer: nn.Module,
    add: Callable[..., None],
    site: Callable[..., SiteDef],
    d_model: int,
) -> None:
    bt = profile.batched
    if profile.resid_mid_at_mlp:
        # OLMo-2 feeds the stream itself to the MLP; the layer keeps its own copy as the
        # residual, so a write there would not reach it: read only.
        mlp = next((m for n in profile.mlps if (m := getattr(layer, n, None)) is not None), None)
        if mlp is not None:
            rw = pre_arg("hidden_states", 0, bt)
            add(f"resid_mid.{i}", site(f"resid_mid.{i}", mlp, "pre", rw, d_model), writable=False)
        return
    pre_mlp = getattr(layer, profile.pre_mlp_norm, None) if profile.pre_mlp_norm else None
    if pre_mlp is not None:
        rw = pre_sum("x", 0, "residual", 1) if profile.fused_residual else pre_arg("x", 0, bt)
        # Unfused layers keep their own copy of the residual: a write to the norm's input
        # would not reach it, so resid_mid is read only there.
        s = site(f"resid_mid.{i}", pre_mlp, "pre", rw, d_model)
        add(f"resid_mid.{i}", s, writable=profile.fused_residual)


def _resolve_mlp(
    table: PointTable,
    profile: Profile,
    architecture: str,
    i: int,
    layer: nn.Module,
    add: Callable[..., None],
    site: Callable[..., SiteDef],
    d_model: int,
    mult: float | None,
) -> None:
    bt = profile.batched
    mlp = next((m for n in profile.mlps if (m := getattr(layer, n, None)) is not None), None)
    first = last = None
    if profile.block_mlp is not None:
        # OPT keeps fc1 / fc2 on the decoder layer: mlp_in is fc1's input, mlp_out fc2's output.
        first, last = (getattr(layer, n, None) for n in profile.block_mlp)
    shared = getattr(layer, profile.shared_mlp, None) if profile.shared_mlp else None
    if mlp is not None and shared is not None:
        _resolve_branch_mlp(profile, i, layer, mlp, shared, add, site, d_model, mult)
        _resolve_router(table, profile, architecture, i, mlp, add, site)
        return
    if mlp is not None or (first is not None and last is not None):
        src_in, src_out = (mlp, mlp) if mlp is not None else (first, last)
        name_in = "hidden_states" if mlp is not None else "input_"
        rw_in = pre_arg(name_in, 0, bt)
        add(f"mlp_in.{i}", site(f"mlp_in.{i}", src_in, "pre", rw_in, d_model))
        add(f"mlp_out.{i}", site(f"mlp_out.{i}", src_out, "post", post_out(bt), d_model))
        down = getattr(mlp, profile.down, None) if mlp is not None else last
        if down is not None:
            width = int(
                getattr(down, "input_size_per_partition", 0) or getattr(down, "input_size", 0)
            )
            rw = pre_arg("input_", 0, bt)
            add(f"mlp_act.{i}", site(f"mlp_act.{i}", down, "pre", rw, width))
        else:
            table.refused[f"mlp_act.{i}"] = (
                "unreachable on vLLM: the experts of this sparse layer run in one fused MoE "
                "kernel, so no down-projection input exists; use backend='eager'"
            )
    if mlp is not None:
        _resolve_router(table, profile, architecture, i, mlp, add, site)

    post_mlp = getattr(layer, profile.post_mlp_norm, None) if profile.post_mlp_norm else None
    if post_mlp is not None:
        rw = post_out(bt)
        add(f"mlp_out_post.{i}", site(f"mlp_out_post.{i}", post_mlp, "post", rw, d_model))
    elif f"mlp_out.{i}" in table.widths and mult is not None:
        src = table.sites[f"mlp_out.{i}"].module
        rw = scaled_out(mult, bt)
        add(f"mlp_out_post.{i}", site(f"mlp_out_post.{i}", src, "post", rw, d_model))
    elif f"mlp_out.{i}" in table.widths:
        add(f"mlp_out_post.{i}", table.sites[f"mlp_out.{i}"])


def _resolve_router(
    table: PointTable,
    profile: Profile,
    architecture: str,
    i: int,
    mlp: nn.Module,
    add: Callable[..., None],
    site: Callable[..., SiteDef],
) -> None:
    router = getattr(mlp, profile.router, None)
    experts = getattr(mlp, "experts", None)
    if router is not None and experts is not None:
        n_exp = int(getattr(router, "output_size", 0) or getattr(experts, "global_num_experts", 0))
        rw = post_out()
        add(f"router_logits.{i}", site(f"router_logits.{i}", router, "post", rw, n_exp), False)
    elif _family_has(architecture, "router_logits"):
        table.refused[f"router_logits.{i}"] = f"layer {i} is a dense MLP layer with no router"


def _resolve_branch_mlp(
    profile: Profile,
    i: int,
    layer: nn.Module,
    routed: nn.Module,
    shared: nn.Module,
    add: Callable[..., None],
    site: Callable[..., SiteDef],
    d_model: int,
    mult: float | None,
) -> None:
    """Routed experts and a shared MLP summed inline (Granite-4.0-H): mlp_in is the pre-MLP
    norm's output, which both read (the routed one a copy taken after it); mlp_out is the sum,
    read at the shared MLP (which runs second) with the routed output a companion hook kept."""
    norm = getattr(layer, profile.pre_mlp_norm, None)
    if norm is not None:
        add(f"mlp_in.{i}", site(f"mlp_in.{i}", norm, "post", post_out(), d_model))
    for name, scale in ((f"mlp_out.{i}", 1.0), (f"mlp_out_post.{i}", mult or 1.0)):
        branch = BranchSum()
        read, write = branch.rw(scale)
        companion = ((routed, branch.companion),)
        add(name, SiteDef(name, shared, "post", read, write, d_model, companions=companion))


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
    bt = profile.batched
    qkv = getattr(attn, profile.qkv, None)
    if qkv is not None and inner is not None:
        if profile.value_per_head and heads == kv_heads:
            # HF GPT-NeoX lays the fused output out as [q, k, v] per head (vLLM's Transformers
            # backend keeps HF's weights), as eager's value selector does.
            rw = head_slice(heads, 3, 2, head_dim, bt)
        else:
            rw = column_slice(q_size + kv_size, q_size + 2 * kv_size, bt)
        add(f"value.{i}", site(f"value.{i}", qkv, "post", rw, kv_size))
    o_proj = getattr(attn, profile.o_proj, None)
    if o_proj is not None:
        add(f"z.{i}", site(f"z.{i}", o_proj, "pre", pre_arg("input_", 0, bt), q_size))
    for norm_name, point, width in (("q_norm", "q", q_size), ("k_norm", "k", kv_size)):
        norm = getattr(attn, norm_name, None)
        if norm is None:
            continue
        add(
            f"{point}_norm_in.{i}",
            site(f"{point}_norm_in.{i}", norm, "pre", pre_arg("x", 0, bt), width),
        )
        rw = post_out(bt)
        add(f"{point}_norm_out.{i}", site(f"{point}_norm_out.{i}", norm, "post", rw, width))
    if inner is not None and bt:
        for p in ("attn_scores", "attn_probs"):
            table.refused[f"{p}.{i}"] = (
                f"{p} is not served by hooked vLLM on {type(attn).__name__}: vLLM runs this "
                "family through its Transformers modeling backend, which calls the attention "
                "layer's forward directly, so no hook sees the post-RoPE q and k to recompute "
                "it from; use backend='eager'"
            )
    elif inner is not None:
        impl = getattr(inner, "impl", None)
        slopes = getattr(impl, "alibi_slopes", None)
        table.attn[i] = AttnGeom(
            heads=heads,
            kv_heads=kv_heads,
            head_dim=head_dim,
            scale=float(getattr(impl, "scale", head_dim**-0.5)),
            softcap=float(getattr(impl, "logits_soft_cap", 0.0) or 0.0),
            window=getattr(inner, "sliding_window", None),
            alibi=tuple(float(x) for x in slopes) if slopes is not None else (),
            sinks=_sinks(attn),
        )
        table.sites[f"attn_q.{i}"] = site(f"attn_q.{i}", inner, "pre", qkv_arg(0), q_size)
        table.sites[f"attn_k.{i}"] = site(f"attn_k.{i}", inner, "pre", qkv_arg(1), kv_size)
        for p in ("attn_scores", "attn_probs"):
            table.widths[f"{p}.{i}"] = heads


def _sinks(attn: nn.Module) -> tuple[float, ...]:
    """gpt-oss's per-head sink logits (an `nn.Parameter` on vLLM's attention module), if any."""
    sinks = getattr(attn, "sinks", None)
    return tuple(float(x) for x in sinks.detach().float().cpu()) if sinks is not None else ()


def _refuse_rest(table: PointTable, architecture: str, tp_size: int) -> None:
    """Give every point that resolved nowhere its reason: not served, family lacks it, TP shard."""
    served_names = {to_address(a).name for a in table.widths}
    for p in POINTS:
        if p.vllm.service is Service.NOT_SERVED:
            table.refused[p.name] = f"{p.name} is {p.vllm.reason}"
        elif p.name not in served_names:
            # A reason given on every layer (e.g. attention maps on the Transformers backend)
            # is the point's reason, unless the family lacks the point altogether.
            layer_reason = next(
                (r for a, r in table.refused.items() if a.partition(".")[0] == p.name and r),
                f"{architecture} on vLLM has no module for {p.name}",
            )
            table.refused.setdefault(p.name, _missing(architecture, p, layer_reason))
        if tp_size > 1 and p.name in SHARDED_POINTS:
            table.refused[p.name] = (
                f"{p.name} is split across heads or neurons under tensor parallelism "
                f"(tensor_parallel_size={tp_size}): each rank holds a shard; load with "
                "tensor_parallel_size=1 or use backend='eager'"
            )
    if tp_size > 1:
        for address in list(table.widths):
            if to_address(address).name in SHARDED_POINTS:
                table.widths.pop(address)
                table.addresses.pop(address, None)
                table.writable.discard(address)
