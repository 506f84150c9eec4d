"""Where each standardized point lives on vLLM's own module tree, per family layout.

A `SiteDef` is one hook on one module: how to read the point's `[tokens, width]` rows from the
hook's arguments or output, and how to write steered rows back. vLLM's decoder layers pass
`(hidden, residual)` between them, so residual points are read as their sum and written back as
`(new, zeros)`, which the next fused add-norm turns into exactly `new`.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any, cast

from ie_core.grammar import POINTS, Point, Service, family_for_architecture, get_point, to_address
from torch import nn

from ie_vllm.serving import vllm_serving
from ie_vllm.worker.access import (
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
from ie_vllm.worker.point_table import AttnGeom, PointTable, SiteDef
from ie_vllm.worker.profiles import Profile, profile_for

# Points whose vLLM tensor is one head- or neuron-shard per rank under tensor parallelism.
SHARDED_POINTS = frozenset(
    {"q", "k", "q_rot", "k_rot", "q_norm_in", "q_norm_out", "k_norm_in", "k_norm_out", "value",
     "z", "mlp_act", "attn_scores", "attn_probs"}
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

    trunk = Sites(table, profile, architecture, hf_config, None, model, d_model)
    for group in dict.fromkeys(TRUNK_RESOLVERS.values()):
        group(trunk)
    m = profile.residual_multiplier
    mult = float(getattr(hf_config, m, 1.0)) if m else None
    for i, layer in enumerate(cast("Iterable[nn.Module]", layers)):
        if layer.__class__.__name__ == "PPMissingLayer":
            continue
        here = Sites(table, profile, architecture, hf_config, i, layer, d_model, mult)
        for group in dict.fromkeys(LAYER_RESOLVERS.values()):
            group(here)

    _refuse_rest(table, architecture, tp_size)
    return table


@dataclass(frozen=True)
class Sites:
    """One decoder layer (or the trunk, `i` None) being resolved, and where its sites go."""

    table: PointTable
    profile: Profile
    architecture: str
    hf_config: Any
    i: int | None
    module: nn.Module  # the decoder layer; the whole model for the trunk
    d_model: int
    mult: float | None = None  # Granite's residual multiplier on the branches it adds

    def name(self, point: str) -> str:
        return point if self.i is None else f"{point}.{self.i}"

    def site(
        self,
        point: str,
        module: nn.Module,
        hook: str,
        rw: tuple[Reader, Writer | None],
        width: int | None = None,
        kind: str = "tensor",
    ) -> SiteDef:
        width = self.d_model if width is None else width
        return SiteDef(self.name(point), module, hook, rw[0], rw[1], width, kind)

    def add(self, point: str, site: SiteDef, writable: bool = True) -> None:
        address = self.name(point)
        self.table.sites.setdefault(site.name, site)
        self.table.addresses[address] = site.name
        self.table.widths[address] = site.width
        if writable and site.write is not None:
            self.table.writable.add(address)

    def hook(self, point: str, module: nn.Module, hook: str, rw: Any, **kw: Any) -> None:
        """Serve `point` from a hook on `module` (`kw`: width, kind, writable)."""
        writable = kw.pop("writable", True)
        self.add(point, self.site(point, module, hook, rw, **kw), writable)

    def alias(self, point: str, same_as: str) -> None:
        """Serve `point` from the site of `same_as` (the two tensors are one on this layout)."""
        self.add(point, self.table.sites[self.name(same_as)])

    def refuse(self, point: str, why: str) -> None:
        self.table.refused[self.name(point)] = why

    def served(self, point: str) -> bool:
        return self.name(point) in self.table.widths

    def child(self, name: str | None) -> nn.Module | None:
        return getattr(self.module, name, None) if name else None


# --- the trunk -----------------------------------------------------------------------------


def _embeddings(s: Sites) -> None:
    embed = get_module(s.module, s.profile.embed)
    if embed is None:
        return
    bt = s.profile.batched
    lm = get_module(s.module, s.profile.layers.rsplit(".", 1)[0])
    scale = getattr(lm, "normalizer", None) if s.profile.embed_scale else None
    s.hook(
        "embeddings", embed, "post", scaled_out(scale, bt) if scale is not None else post_out(bt)
    )


def _final_norm(s: Sites) -> None:
    norm = get_module(s.module, s.profile.final_norm)
    if norm is not None:
        s.hook("final_norm", norm, "post", post_out(s.profile.batched))


def _no_module(_s: Sites) -> None:
    """A point no vLLM layout hooks here; `_refuse_rest` gives its reason from the registry."""


# --- one decoder layer ---------------------------------------------------------------------


def _residual_rw(profile: Profile) -> tuple[tuple[Reader, Writer], tuple[Reader, Writer]]:
    """Readers/writers of a decoder layer's residual input and output."""
    if profile.fused_residual:
        h = profile.hidden_arg
        r = profile.residual_arg if profile.residual_arg is not None else h + 1
        return pre_sum("hidden_states", h, "residual", r), post_sum()
    pre = pre_arg("hidden_states", profile.hidden_arg, profile.batched)
    return pre, (post_first() if profile.first_out else post_out(profile.batched))


def _residual(s: Sites) -> None:
    rs_pre, rs_post = _residual_rw(s.profile)
    # A fused layer returns (hidden, residual): a static tap reads their sum without storing it.
    post_kind = "residual_pair" if s.profile.fused_residual else "tensor"
    s.hook("resid_pre", s.module, "pre", rs_pre)
    s.hook("resid_post", s.module, "post", rs_post, kind=post_kind)


def _attention_block(s: Sites) -> None:
    """attn_in / attn_out / attn_out_post, and the heads' points inside attention."""
    profile, bt = s.profile, s.profile.batched
    attn = s.child(profile.attn)
    if attn is None:
        _mixer(s)
        return
    a = profile.attn_hidden_arg
    a = a if a is not None else (1 if profile.fused_residual else 0)
    s.hook("attn_in", attn, "pre", pre_arg("hidden_states", a, bt))
    s.hook("attn_out", attn, "post", post_out(bt))
    _attention(s, attn)
    post_attn = s.child(profile.post_attn_norm)
    if post_attn is not None:
        s.hook("attn_out_post", post_attn, "post", post_out(bt))
    elif s.mult is not None:
        # Granite adds attn_out * residual_multiplier to the stream, outside any module.
        s.hook("attn_out_post", attn, "post", scaled_out(s.mult, bt))
    else:
        s.alias("attn_out_post", "attn_out")


def _mixer(s: Sites) -> None:
    """A layer whose token mixer is not attention (Mamba2): attn_in / attn_out are its input and
    output; the attention-only points are refused at this layer."""
    found = ((n, m) for n in s.profile.mixers if (m := s.child(n)) is not None)
    name, mixer = next(found, ("", None))
    if mixer is None:
        return
    s.hook("attn_in", mixer, "pre", pre_arg("hidden_states", 0))
    s.hook("attn_out", mixer, "post", post_out())
    if s.mult is not None:
        s.hook("attn_out_post", mixer, "post", scaled_out(s.mult))
    else:
        s.alias("attn_out_post", "attn_out")
    why = (
        f"layer {s.i} mixes tokens with {type(mixer).__name__} ({name}), a state-space layer with "
        "no softmax attention, heads' scores or value projection; its input and output are "
        "attn_in and attn_out"
    )
    for point in ("value", "z", "attn_scores", "attn_probs"):
        s.refuse(point, why)


def _is_parallel(profile: Profile, hf_config: Any) -> bool:
    """Parallel blocks per the config when it says (GPT-NeoX, Falcon), else per the profile."""
    if hasattr(hf_config, "use_parallel_residual") and profile.parallel:
        return bool(hf_config.use_parallel_residual)
    if hasattr(hf_config, "parallel_attn") and profile.attn == "self_attention":
        return bool(hf_config.parallel_attn or getattr(hf_config, "new_decoder_architecture", 0))
    return profile.parallel


def _resid_mid(s: Sites) -> None:
    profile, bt = s.profile, s.profile.batched
    if _is_parallel(profile, s.hf_config):
        return  # attention and MLP both read resid_pre: no stream between them
    if profile.resid_mid_at_mlp:
        # OLMo-2 feeds the stream itself to the MLP; the layer keeps its own copy as the
        # residual, so a write there would not reach it: read only.
        mlp = next((m for n in profile.mlps if (m := s.child(n)) is not None), None)
        if mlp is not None:
            s.hook("resid_mid", mlp, "pre", pre_arg("hidden_states", 0, bt), writable=False)
        return
    pre_mlp = s.child(profile.pre_mlp_norm)
    if pre_mlp is not None:
        rw = pre_sum("x", 0, "residual", 1) if profile.fused_residual else pre_arg("x", 0, bt)
        # Unfused layers keep their own copy of the residual: a write to the norm's input
        # would not reach it, so resid_mid is read only there.
        s.hook("resid_mid", pre_mlp, "pre", rw, writable=profile.fused_residual)


def _mlp(s: Sites) -> None:
    profile, bt = s.profile, s.profile.batched
    mlp = next((m for n in profile.mlps if (m := s.child(n)) is not None), None)
    first = last = None
    if profile.block_mlp is not None:
        # OPT keeps fc1 / fc2 on the decoder layer: mlp_in is fc1's input, mlp_out fc2's output.
        first, last = (s.child(n) for n in profile.block_mlp)
    shared = s.child(profile.shared_mlp)
    if mlp is not None and shared is not None:
        _branch_mlp(s, mlp, shared)
        _router(s, mlp)
        return
    if mlp is not None or (first is not None and last is not None):
        pair = (mlp, mlp) if mlp is not None else (first, last)
        src_in, src_out = cast("tuple[nn.Module, nn.Module]", pair)
        name_in = "hidden_states" if mlp is not None else "input_"
        s.hook("mlp_in", src_in, "pre", pre_arg(name_in, 0, bt))
        s.hook("mlp_out", src_out, "post", post_out(bt))
        down = getattr(mlp, profile.down, None) if mlp is not None else last
        if down is not None:
            width = int(
                getattr(down, "input_size_per_partition", 0) or getattr(down, "input_size", 0)
            )
            s.hook("mlp_act", down, "pre", pre_arg("input_", 0, bt), width=width)
        else:
            s.refuse(
                "mlp_act",
                "unreachable on vLLM: the experts of this sparse layer run in one fused MoE "
                "kernel, so no down-projection input exists; use backend='eager'",
            )
    if mlp is not None:
        _router(s, mlp)

    post_mlp = s.child(profile.post_mlp_norm)
    if post_mlp is not None:
        s.hook("mlp_out_post", post_mlp, "post", post_out(bt))
    elif s.served("mlp_out") and s.mult is not None:
        src = s.table.sites[s.name("mlp_out")].module
        s.hook("mlp_out_post", src, "post", scaled_out(s.mult, bt))
    elif s.served("mlp_out"):
        s.alias("mlp_out_post", "mlp_out")


def _router(s: Sites, mlp: nn.Module) -> None:
    router = getattr(mlp, s.profile.router, None)
    experts = getattr(mlp, "experts", None)
    if router is not None and experts is not None:
        n_exp = int(getattr(router, "output_size", 0) or getattr(experts, "global_num_experts", 0))
        s.hook("router_logits", router, "post", post_out(), width=n_exp, writable=False)
    elif _family_has(s.architecture, "router_logits"):
        s.refuse("router_logits", f"layer {s.i} is a dense MLP layer with no router")


def _branch_mlp(s: Sites, routed: nn.Module, shared: nn.Module) -> None:
    """Routed experts and a shared MLP summed inline (Granite-4.0-H): mlp_in is the pre-MLP
    norm's output, which both read (the routed one a copy taken after it); mlp_out is the sum,
    read at the shared MLP (which runs second) with the routed output a companion hook kept."""
    norm = s.child(s.profile.pre_mlp_norm)
    if norm is not None:
        s.hook("mlp_in", norm, "post", post_out())
    for point, scale in (("mlp_out", 1.0), ("mlp_out_post", s.mult or 1.0)):
        branch = BranchSum()
        read, write = branch.rw(scale)
        companion = ((routed, branch.companion),)
        name = s.name(point)
        s.add(point, SiteDef(name, shared, "post", read, write, s.d_model, companions=companion))


def _family_has(architecture: str, point: str) -> bool:
    family = family_for_architecture(architecture)
    return family is not None and family.has_point(get_point(point))


def _attention(s: Sites, attn: nn.Module) -> None:
    """value, z and the q/k norms from attention's projections; scores and probabilities from
    its post-RoPE q and k, recomputed in the worker (the geometry kept in `table.attn`)."""
    inner = getattr(attn, "attn", None)
    heads = int(getattr(inner, "num_heads", 0))
    kv_heads = int(getattr(inner, "num_kv_heads", 0))
    head_dim = int(getattr(inner, "head_size", 0))
    q_size, kv_size = heads * head_dim, kv_heads * head_dim
    profile, bt = s.profile, s.profile.batched
    qkv = getattr(attn, profile.qkv, None)
    if qkv is not None and inner is not None:
        _projections(s, qkv, heads, kv_heads, head_dim)
    o_proj = getattr(attn, profile.o_proj, None)
    if o_proj is not None:
        s.hook("z", o_proj, "pre", pre_arg("input_", 0, bt), width=q_size)
    for norm_name, point, width in (("q_norm", "q", q_size), ("k_norm", "k", kv_size)):
        norm = getattr(attn, norm_name, None)
        if norm is None:
            continue
        s.hook(f"{point}_norm_in", norm, "pre", pre_arg("x", 0, bt), width=width)
        s.hook(f"{point}_norm_out", norm, "post", post_out(bt), width=width)
    if inner is None:
        return
    if bt:
        for p in ("attn_scores", "attn_probs", "q_rot", "k_rot"):
            use = " to recompute it from" if p.startswith("attn") else ""
            s.refuse(
                p,
                f"{p} is not served by hooked vLLM on {type(attn).__name__}: vLLM runs this "
                "family through its Transformers modeling backend, which calls the attention "
                f"layer's forward directly, so no hook sees the post-RoPE q and k{use}; "
                "use backend='eager'",
            )
        return
    _attention_maps(s, attn, inner, heads, kv_heads, head_dim)


def _projections(s: Sites, qkv: nn.Module, heads: int, kv_heads: int, head_dim: int) -> None:
    """q, k and value: slices of the fused projection's output, before any norm or rotary."""
    q_size, kv_size = heads * head_dim, kv_heads * head_dim
    spans = ((0, q_size), (q_size, q_size + kv_size), (q_size + kv_size, q_size + 2 * kv_size))
    per_head = s.profile.value_per_head and heads == kv_heads
    for slot, point in enumerate(("q", "k", "value")):
        if point != "value" and not _family_has(s.architecture, point):
            continue
        if per_head:
            # HF GPT-NeoX lays the fused output out as [q, k, v] per head (vLLM's Transformers
            # backend keeps HF's weights), as eager's value selector does.
            rw = head_slice(heads, 3, slot, head_dim, s.profile.batched)
        else:
            rw = column_slice(*spans[slot], s.profile.batched)
        s.hook(point, qkv, "post", rw, width=q_size if point == "q" else kv_size)


def _attention_maps(
    s: Sites, attn: nn.Module, inner: nn.Module, heads: int, kv_heads: int, head_dim: int
) -> None:
    """attn_scores / attn_probs: q and k sites read before vLLM's attention kernel, and the
    geometry the worker recomputes softmax(q k^T) with."""
    assert s.i is not None
    impl = getattr(inner, "impl", None)
    slopes = getattr(impl, "alibi_slopes", None)
    s.table.attn[s.i] = AttnGeom(
        heads=heads,
        kv_heads=kv_heads,
        head_dim=head_dim,
        scale=float(getattr(impl, "scale", head_dim**-0.5)),
        softcap=float(getattr(impl, "logits_soft_cap", 0.0) or 0.0),
        window=getattr(inner, "sliding_window", None),
        alibi=tuple(float(x) for x in slopes) if slopes is not None else (),
        sinks=_sinks(attn),
    )
    s.table.sites[s.name("attn_q")] = s.site("attn_q", inner, "pre", qkv_arg(0), heads * head_dim)
    s.table.sites[s.name("attn_k")] = s.site(
        "attn_k", inner, "pre", qkv_arg(1), kv_heads * head_dim
    )
    for p in ("attn_scores", "attn_probs"):
        s.table.widths[s.name(p)] = heads
    # q_rot / k_rot: the same arguments, as points (a write is what attention and the cache see).
    for point, arg, width in (("q_rot", 0, heads * head_dim), ("k_rot", 1, kv_heads * head_dim)):
        if _family_has(s.architecture, point):
            s.hook(point, inner, "pre", pre_arg(("query", "key")[arg], arg), width=width)


def _sinks(attn: nn.Module) -> tuple[float, ...]:
    """gpt-oss's per-head sink logits (an `nn.Parameter` on vLLM's attention module), if any."""
    sinks = getattr(attn, "sinks", None)
    return tuple(float(x) for x in sinks.detach().float().cpu()) if sinks is not None else ()


def _refuse_rest(table: PointTable, architecture: str, tp_size: int) -> None:
    """Give every point that resolved nowhere its reason: not served, family lacks it, TP shard."""
    served_names = {to_address(a).name for a in table.widths}
    for p in POINTS:
        serving = vllm_serving(p)
        if serving.service is Service.NOT_SERVED:
            table.refused[p.name] = f"{p.name} is {serving.reason}"
        elif p.name not in served_names:
            # A reason given on every layer (e.g. attention maps on the Transformers backend)
            # is the point's reason, unless the family lacks the point altogether.
            layer_reason = next(
                (r for a, r in table.refused.items() if to_address(a).name == p.name and r),
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


# One resolver per registry point (a test holds the keys to the registry). A resolver serves a
# group of points that share modules; each group runs once per layer, in first-listed order.
TRUNK_RESOLVERS: dict[str, Callable[[Sites], None]] = {
    "embeddings": _embeddings,
    "final_norm": _final_norm,
    "lm_head": _no_module,
}
LAYER_RESOLVERS: dict[str, Callable[[Sites], None]] = {
    "resid_pre": _residual,
    **dict.fromkeys(
        ("attn_in", "q", "k", "q_norm_in", "q_norm_out", "k_norm_in", "k_norm_out", "q_rot"),
        _attention_block,
    ),
    **dict.fromkeys(
        ("k_rot", "value", "attn_scores", "attn_probs", "z", "attn_out", "attn_out_post"),
        _attention_block,
    ),
    "resid_mid": _resid_mid,
    **dict.fromkeys(("mlp_in", "mlp_act", "router_logits", "mlp_out", "mlp_out_post"), _mlp),
    "resid_post": _residual,
    # Fused away or absent in every layout ie-vllm maps: refused with the registry's reason.
    **dict.fromkeys(
        ("attn_gate", "mlp_pre", "mlp_pre_linear", "expert_weights", "expert_indices"), _no_module
    ),
    **dict.fromkeys(
        (
            "resid_streams",
            "attn_stream_collapse",
            "mlp_stream_collapse",
            "attn_stream_write",
            "mlp_stream_write",
            "attn_stream_mix",
            "mlp_stream_mix",
        ),
        _no_module,
    ),
}
