"""Point resolution: each address becomes a real module, an input or output position on it, and how
to cut the tensor out (a slice of a fused projection, a head flatten), or a documented derivation
(`resid_mid` = `resid_pre` + `attn_out_post`; Granite-4.0-H's `mlp_out` = routed + shared MLP;
attention scores and probabilities recorded from the family's own softmax call)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from ie_core.errors import PointUnavailableError
from ie_core.grammar import (
    POINTS,
    Address,
    AddressLike,
    Family,
    Point,
    check_layer,
    get_point,
    to_address,
)
from torch import nn

from ie_eager import rotary
from ie_eager import structure as st
from ie_eager.resolved import Resolved, Tap
from ie_eager.resolved import block_tap as _block_tap
from ie_eager.resolved import tap_on as _tap
from ie_eager.selectors import Broadcast, Grouped, GroupSlice, LastSlice, Selector, Stream, Whole
from ie_eager.structure import Block, Structure

__all__ = [
    "ATTENTION_INTERNALS",
    "LAYER_RESOLVERS",
    "TRUNK_RESOLVERS",
    "Resolved",
    "Resolver",
    "Tap",
]

# Points inside softmax attention: refused on the linear-attention / SSM layers of hybrid families.
ATTENTION_INTERNALS = frozenset(
    {"q_norm_in", "q_norm_out", "k_norm_in", "k_norm_out", "value", "attn_scores", "attn_probs"}
    | {"z", "attn_gate", "q", "k", "q_rot", "k_rot"}
)
# Residual points that, on a multi-stream trunk, are one of n_streams copies and take a stream.
STREAM_POINTS = ("resid_pre", "resid_mid", "resid_post")
# Hyper-connection points: (module slot, output item of (write, mix, collapse), width kind).
_HC_POINTS = {
    "attn_stream_write": ("attn_hc", 0, "s"),
    "attn_stream_mix": ("attn_hc", 1, "ss"),
    "attn_stream_collapse": ("attn_hc", 2, "d"),
    "mlp_stream_write": ("mlp_hc", 0, "s"),
    "mlp_stream_mix": ("mlp_hc", 1, "ss"),
    "mlp_stream_collapse": ("mlp_hc", 2, "d"),
}


# --- resolution ------------------------------------------------------------------------------


class Resolver:
    """Resolves addresses against one model's structure and family."""

    def __init__(
        self,
        structure: Structure,
        family: Family | None,
        model: nn.Module,
        probe: Callable[[Tap, int], torch.Size] | None = None,
    ) -> None:
        self.probe = probe  # shape of a tap's raw tensor on a forward of n tokens
        self.s = structure
        self.family = family
        self.model = model
        self.config: Any = getattr(model, "config", None)  # HF's config (absent on bare modules)
        self._cache: dict[Address, Resolved] = {}
        self._router_orders: dict[type, tuple[str, ...]] = {}  # output item order per router class

    @property
    def n_layers(self) -> int:
        return len(self.s.blocks)

    def point_names(self) -> tuple[str, ...]:
        """Every point name this model offers on at least one layer (trunk points included)."""
        names = []
        for point in POINTS:
            if not point.per_layer:
                if self._try(Address(point.name)) is not None:
                    names.append(point.name)
                continue
            stream = 0 if self.s.multi_stream and point.name in STREAM_POINTS else None
            if any(
                self._try(Address(point.name, i, stream)) is not None for i in range(self.n_layers)
            ):
                names.append(point.name)
        return tuple(names)

    def _try(self, address: Address) -> Resolved | None:
        try:
            return self.resolve(address)
        except PointUnavailableError:
            return None

    def resolve(self, value: AddressLike) -> Resolved:
        address = to_address(value, check=True)
        hit = self._cache.get(address)
        if hit is not None:
            return hit
        resolved = self._resolve(address)
        self._cache[address] = resolved
        return resolved

    # -- internals --

    def _refuse(self, point: Point, why: str) -> PointUnavailableError:
        return PointUnavailableError(f"{point.name} is not available on this model: {why}", why)

    def _missing(self, point: Point, fallback: str) -> PointUnavailableError:
        if self.family is not None and not self.family.has_point(point):
            return self._refuse(point, self.family.missing_reason(point))
        return self._refuse(point, fallback)

    def _resolve(self, address: Address) -> Resolved:
        if address.is_path:
            return self._path(address)
        point = get_point(address.name)
        if (address.stream is not None or point.requires == "multi_stream") and not (
            self.s.multi_stream
        ):
            raise self._missing(
                point,
                "the model has a single residual stream, so there are no stream coordinates "
                "or hyper-connection points; use the plain residual points",
            )
        if not point.per_layer:
            if address.stream is not None:
                raise self._refuse(point, "only resid_pre, resid_mid and resid_post take a stream")
            return self._trunk(point, address)
        assert address.layer is not None
        check_layer(address, self.n_layers)
        block = self.s.blocks[address.layer]
        if self.s.multi_stream:
            found = self._multi_stream(point, address, block)
            if found is not None:
                return found
        return self._layer(point, address, block)

    def _multi_stream(self, point: Point, address: Address, b: Block) -> Resolved | None:
        """Stream-aware points of a hyper-connection trunk; None for points resolved as usual."""
        name, n, d = point.name, self.s.n_streams, self.s.shapes.d_model
        if name in _HC_POINTS:
            slot, item, kind = _HC_POINTS[name]
            owner = b.attn_hc if slot == "attn_hc" else b.mlp_hc
            if owner is None or address.stream is not None:
                raise self._refuse(
                    point, "it is per token, not per stream" if owner else f"no {slot} module"
                )
            width = {"s": n, "ss": n * n, "d": d}[kind]
            return Resolved(address, "tap", _tap(b, owner, "out", item=item), width, False)  # type: ignore[arg-type]
        if name == "resid_streams":
            if address.stream is not None:
                raise self._refuse(
                    point, f"it is all {n} streams; read one as resid_post.{b.index}.stream-N"
                )
            return Resolved(address, "tap", _block_tap(b, "out"), n * d, True)
        if name in STREAM_POINTS:
            if address.stream is None or address.stream >= n:
                raise self._refuse(
                    point,
                    f"the trunk carries {n} residual streams: name one ({name}.{b.index}.stream-0 "
                    f"to stream-{n - 1}) or read resid_streams.{b.index} for the whole stack",
                )
            if name == "resid_mid":
                tap = _tap(b, b.mlp_hc, "in")
                if tap is None:
                    raise self._refuse(point, "no hyper-connection module before the MLP")
            else:
                tap = _block_tap(b, "in" if name == "resid_pre" else "out")
            sel = Stream(address.stream)
            return Resolved(address, "tap", Tap(tap.path, tap.module, tap.io, 0, sel), d, True)
        if address.stream is not None:
            raise self._refuse(point, "only resid_pre, resid_mid and resid_post take a stream")
        return None

    def _path(self, address: Address) -> Resolved:
        path = address.module_path
        try:
            module = self.model.get_submodule(path)
        except AttributeError:
            raise PointUnavailableError(
                f"{address}: the model has no module at {path!r}; module paths look like "
                f"{self.s.blocks[0].path!r}"
            ) from None
        return Resolved(address, "tap", Tap(path, module, "out"), None, writable=True)

    def _trunk(self, point: Point, address: Address) -> Resolved:
        return TRUNK_RESOLVERS[point.name](self, point, address)

    def _embeddings(self, point: Point, address: Address) -> Resolved:
        path, mod = self.s.embed
        return Resolved(address, "tap", Tap(path, mod, "out"), self.s.shapes.d_model, True)

    def _final_norm(self, point: Point, address: Address) -> Resolved:
        if self.s.final_norm is None:
            raise self._refuse(point, "no final norm module found before the unembed")
        path, mod = self.s.final_norm
        return Resolved(address, "tap", Tap(path, mod, "out"), self.s.shapes.d_model, True)

    def _lm_head(self, point: Point, address: Address) -> Resolved:
        path, mod = self.s.lm_head
        return Resolved(address, "tap", Tap(path, mod, "out"), st.out_features(mod), False)

    def _layer(self, point: Point, address: Address, b: Block) -> Resolved:
        if b.mixer is not None and point.name in ATTENTION_INTERNALS:
            raise self._refuse(point, self._mixer_reason(b))
        return LAYER_RESOLVERS[point.name](self, point, address, b)

    def _tap(self, point: Point, address: Address, t: Tap | None, why: str) -> Resolved:
        """A d_model-wide read of `t`, or the family's reason (else `why`) when it is absent."""
        if t is None:
            raise self._missing(point, why)
        return Resolved(address, "tap", t, self.s.shapes.d_model, point.writable)

    def _resid_pre(self, point: Point, address: Address, b: Block) -> Resolved:
        return self._tap(point, address, _block_tap(b, "in"), "")

    def _resid_post(self, point: Point, address: Address, b: Block) -> Resolved:
        return self._tap(point, address, _block_tap(b, "out"), "")

    def _attn_in(self, point: Point, address: Address, b: Block) -> Resolved:
        return self._tap(
            point, address, _tap(b, b.attn, "in"), "no attention module found in the block"
        )

    def _qk_norm(self, point: Point, address: Address, b: Block) -> Resolved:
        shapes, name = self.s.shapes, point.name
        norm = b.sub(b.attn, st.Q_NORM_NAMES if name.startswith("q") else st.K_NORM_NAMES)
        heads = shapes.n_heads if name.startswith("q") else shapes.n_kv_heads
        t = self._head_layout(_tap(b, norm, "in" if name.endswith("_in") else "out"), heads)
        if t is None:
            raise self._missing(point, "the attention has no per-head query/key norm (no QK-norm)")
        return Resolved(address, "tap", t, heads * shapes.head_dim, point.writable)

    def _attention(self, point: Point, address: Address, b: Block) -> Resolved:
        if b.attn is None:
            raise self._missing(point, "no attention module in this block")
        return Resolved(address, "attention", _tap(b, b.attn, "out"), None, False)  # type: ignore[arg-type]

    def _z(self, point: Point, address: Address, b: Block) -> Resolved:
        shapes = self.s.shapes
        o_proj = b.sub(b.attn, st.O_PROJ_NAMES)
        width = st.in_features(o_proj[1]) if o_proj else None
        if o_proj is not None and o_proj[0].endswith("o_a_proj"):
            width = shapes.n_heads * shapes.head_dim  # grouped: [groups, heads*hd / groups]
        t = _tap(b, o_proj, "in")
        if t is None:
            raise self._missing(point, "no attention output projection found")
        return Resolved(address, "tap", t, width, point.writable)

    def _attn_out_point(self, point: Point, address: Address, b: Block) -> Resolved:
        return self._tap(point, address, self._attn_out(b), "no attention module found")

    def _attn_out_post(self, point: Point, address: Address, b: Block) -> Resolved:
        return self._post(point, address, b, self._attn_out(b), b.post_attn_norm)

    def _resid_mid(self, point: Point, address: Address, b: Block) -> Resolved:
        if b.parallel:
            raise self._missing(
                point,
                "attention and MLP run in parallel on this block, so there is no residual "
                "between them; use resid_pre (what both read) or resid_post",
            )
        post = self._post(point, address, b, self._attn_out(b), b.post_attn_norm)
        d = self.s.shapes.d_model
        return Resolved(address, "sum", post.tap, d, True, post.scale, _block_tap(b, "in"))

    def _mlp_in_point(self, point: Point, address: Address, b: Block) -> Resolved:
        return self._tap(point, address, self._mlp_in(b), "no MLP module found")

    def _mlp_out_point(self, point: Point, address: Address, b: Block) -> Resolved:
        if b.sibling_mlp is not None:
            return self._mlp_branch(address, b, post=False)
        return self._tap(point, address, self._mlp_out(b), "no MLP module found")

    def _mlp_out_post(self, point: Point, address: Address, b: Block) -> Resolved:
        if b.sibling_mlp is not None:
            return self._mlp_branch(address, b, post=True)
        return self._post(point, address, b, self._mlp_out(b), b.post_mlp_norm)

    def _single_stream(self, point: Point, address: Address, b: Block) -> Resolved:
        """Hyper-connection points: `_multi_stream` serves them; a single trunk has none."""
        raise self._missing(point, "no module of this model computes it")

    def _mixer_reason(self, b: Block) -> str:
        assert b.attn is not None
        kind = type(b.attn[1]).__name__
        softmax = [x.index for x in self.s.blocks if x.attn is not None and x.mixer is None]
        return (
            f"layer {b.index} mixes tokens with {kind} ({b.mixer}), a linear-attention / "
            f"state-space / convolution layer with no softmax attention, heads' scores or value "
            f"projection; its input and "
            f"output are attn_in and attn_out. Softmax-attention layers: {softmax}"
        )

    def _gate(self, point: Point, address: Address, b: Block) -> Resolved:
        """Qwen3-Next's q_proj emits [q | gate] per head; the gate multiplies the attention
        output by sigmoid(gate) before o_proj, so z = (probs @ v) * attn_gate."""
        sh = self.s.shapes
        q_proj = b.sub(b.attn, st.Q_PROJ_NAMES)
        width = sh.n_heads * sh.head_dim
        if q_proj is None or st.out_features(q_proj[1]) != 2 * width:
            raise self._missing(point, "the attention has no output gate")
        sel = GroupSlice(sh.n_heads, sh.head_dim, 2 * sh.head_dim, sigmoid=True)
        return Resolved(address, "tap", _tap(b, q_proj, "out", select=sel), width, False)  # type: ignore[arg-type]

    def _head_layout(self, t: Tap | None, heads: int) -> Tap | None:
        """Per-head norms see [b, s, heads, hd] or, after a transpose, [b, heads, s, hd]: probe."""
        if t is None or self.probe is None:
            return t
        n = heads + 3
        shape = self.probe(t, n)
        if len(shape) == 4 and shape[1] == heads and shape[2] == n:
            return Tap(t.path, t.module, t.io, t.item, Whole(heads_first=True))
        return t

    def _attn_out(self, b: Block) -> Tap | None:
        if b.attn_adds_residual:
            # BLOOM's attention module returns attention + residual; its dense projection is attn_out.
            return _tap(b, b.sub(b.attn, st.O_PROJ_NAMES), "out")
        return _tap(b, b.attn, "out")

    def _router(self, point: Point, address: Address, b: Block) -> Resolved:
        router = b.sub(b.mlp, st.ROUTER_NAMES) if b.moe else None
        if router is None:
            if self.family is not None and not self.family.has_point(point):
                raise self._missing(point, "")
            raise self._refuse(point, f"layer {b.index} has a dense MLP, not a mixture of experts")
        weight = getattr(router[1], "weight", None)
        n_experts = int(weight.shape[0]) if weight is not None else None
        top_k = getattr(router[1], "top_k", None)
        order = self._router_order(_tap(b, router, "out"), n_experts, top_k)  # type: ignore[arg-type]
        item = order.index(point.name)
        width = n_experts if point.name == "router_logits" else (int(top_k) if top_k else None)
        return Resolved(address, "tap", _tap(b, router, "out", item=item), width, point.writable)  # type: ignore[arg-type]

    def _router_order(self, t: Tap, n_experts: int | None, top_k: int | None) -> tuple[str, ...]:
        """HF 5.x routers return (logits [tokens, E], top-k weights, top-k indices), but
        Granite-4.0-H's returns (indices, weights, logits): one probe per router class says which
        (item 0 is top_k wide, not n_experts)."""
        usual = ("router_logits", "expert_weights", "expert_indices")
        cls = type(t.module)
        if cls not in self._router_orders:
            flipped = False
            if self.probe is not None and n_experts and top_k and n_experts != top_k:
                flipped = self.probe(t, 3)[-1] == top_k
            self._router_orders[cls] = usual[::-1] if flipped else usual
        return self._router_orders[cls]

    def _mlp_branch(self, address: Address, b: Block, *, post: bool) -> Resolved:
        """Granite-4.0-H adds `(block_sparse_moe(h) + shared_mlp(h)) * residual_multiplier` inline:
        mlp_out is the sum, read from both outputs (the routed MLP runs first), and a write lands
        on the shared MLP's output only, so the sum takes the written value."""
        scale = self.s.residual_multiplier if post else None
        routed, shared = _tap(b, b.mlp, "out"), _tap(b, b.sibling_mlp, "out")
        assert routed is not None and shared is not None
        return Resolved(address, "branch", shared, self.s.shapes.d_model, True, scale, routed)

    def _mlp_in(self, b: Block) -> Tap | None:
        if b.pre_mlp_norm is not None:
            return _tap(b, b.pre_mlp_norm, "out")  # both MLPs read it: a write reaches both
        if b.mlp is not None and b.mlp[1] is b.module:
            return _tap(b, b.sub(b.mlp, st.PLAIN_IN_NAMES), "in")
        return _tap(b, b.mlp, "in")

    def _mlp_out(self, b: Block) -> Tap | None:
        if b.mlp is not None and (b.mlp[1] is b.module or b.attn_adds_residual):
            return _tap(b, b.sub(b.mlp, st.DOWN_NAMES), "out")
        return _tap(b, b.mlp, "out")

    def _post(self, point: Point, address: Address, b: Block, raw: Tap | None, norm) -> Resolved:
        d = self.s.shapes.d_model
        if raw is None:
            raise self._missing(point, "no sublayer module found")
        if norm is not None:
            return Resolved(address, "tap", _tap(b, norm, "out"), d, True)  # type: ignore[arg-type]
        # Granite-style residual multipliers scale what is added to the residual.
        return Resolved(address, "tap", raw, d, True, self.s.residual_multiplier)

    def _value(self, point: Point, address: Address, b: Block) -> Resolved:
        sh = self.s.shapes
        kv_width = sh.n_kv_heads * sh.head_dim
        v_proj = b.sub(b.attn, st.V_PROJ_NAMES)
        if v_proj is not None and st.out_features(v_proj[1]) == kv_width:
            return Resolved(address, "tap", _tap(b, v_proj, "out"), kv_width, True)  # type: ignore[arg-type]
        mla = b.sub(b.attn, st.MLA_KV_NAMES)
        if mla is not None:
            return self._mla_value(address, b, mla)
        if b.sub(b.attn, st.SHARED_KV_NAMES) is not None:
            raise self._refuse(
                point,
                "keys and values are one shared single-head tensor (kv_proj, then kv_norm and RoPE "
                "on its rope slice), so there is no separate value projection; read the module "
                f"with path.{b.path}.{b.attn[0] if b.attn else 'self_attn'}.kv_norm",
            )
        fused = b.sub(b.attn, st.FUSED_QKV_NAMES)
        if fused is None:
            raise self._missing(point, "no value projection (v_proj or a fused qkv) found")
        sel = self._fused_part(point, fused, 2)
        return Resolved(address, "tap", _tap(b, fused, "out", select=sel), kv_width, True)  # type: ignore[arg-type]

    def _fused_part(self, point: Point, fused: tuple[str, nn.Module], part: int) -> Selector:
        """The selector of q (0), k (1) or v (2) in a fused projection's output."""
        sh = self.s.shapes
        total = st.out_features(fused[1])
        hd, heads, kv = sh.head_dim, sh.n_heads, sh.n_kv_heads
        if total != (heads + 2 * kv) * hd:
            raise self._refuse(
                point,
                f"fused projection {fused[0]} is {total} wide, expected (heads {heads} + 2 x kv "
                f"{kv}) x head_dim {hd}; its layout is unknown",
            )
        config = (
            self.config.get_text_config()
            if hasattr(self.config, "get_text_config")
            else self.config
        )
        name = fused[0].rsplit(".", 1)[-1]
        if name == "query_key_value" and getattr(config, "new_decoder_architecture", False):
            g = heads // kv  # Falcon: per KV group [q x g, k, v]
            index: int | slice = slice(0, g) if part == 0 else g + part - 1
            return Grouped(kv, g + 2, index, hd)
        if name == "query_key_value" and kv == heads:
            return Grouped(heads, 3, part, hd)  # GPT-NeoX / BLOOM: [q, k, v] interleaved per head
        if name == "query_key_value":
            raise self._refuse(
                point, "fused query_key_value with grouped KV heads has no known layout"
            )
        # Contiguous q | k | v (GPT-2, Phi-3, BigCode).
        bounds = (0, heads * hd, (heads + kv) * hd, total)
        return LastSlice(bounds[part], bounds[part + 1])

    def _qk(self, point: Point, address: Address, b: Block) -> Resolved:
        """Pre-rotary queries / keys: the projection's output (TransformerLens hook_q / hook_k),
        a slice of a fused one, or the query half of Qwen3-Next's per-head [q | gate]."""
        if self.family is not None and not self.family.has_point(point):
            raise self._missing(point, "")
        sh, is_q = self.s.shapes, point.name == "q"
        heads = sh.n_heads if is_q else sh.n_kv_heads
        width = heads * sh.head_dim
        proj = b.sub(b.attn, st.Q_PROJ_NAMES if is_q else st.K_PROJ_NAMES)
        if proj is not None and st.out_features(proj[1]) == width:
            return Resolved(address, "tap", _tap(b, proj, "out"), width, True)  # type: ignore[arg-type]
        if is_q and proj is not None and st.out_features(proj[1]) == 2 * width:
            sel: Selector = GroupSlice(heads, 0, sh.head_dim)
            return Resolved(address, "tap", _tap(b, proj, "out", select=sel), width, True)  # type: ignore[arg-type]
        fused = b.sub(b.attn, st.FUSED_QKV_NAMES)
        if fused is None:
            raise self._missing(
                point, f"no {point.name}_proj of width {width} (or a fused qkv) in the attention"
            )
        sel = self._fused_part(point, fused, 0 if is_q else 1)
        return Resolved(address, "tap", _tap(b, fused, "out", select=sel), width, True)  # type: ignore[arg-type]

    def _rotary(self, point: Point, address: Address, b: Block) -> Resolved:
        """Post-rotary queries / keys: the outputs of the one `apply_rotary_pos_emb(q, k, ...)`
        call the family's attention makes, read and written where the attention receives them."""
        if self.family is not None and not self.family.has_point(point):
            raise self._missing(point, "")
        if b.attn is None:
            raise self._missing(point, "no attention module in this block")
        sh, is_q = self.s.shapes, point.name == "q_rot"
        width = (sh.n_heads if is_q else sh.n_kv_heads) * sh.head_dim
        config = self.config.get_text_config() if self.config is not None else None
        encoding = getattr(config, "position_embedding_type", "rope")
        if encoding not in ("rope", "rotary") or getattr(config, "alibi", False):
            raise self._refuse(
                point,
                f"this model's attention adds no rotary embedding (position_embedding_type="
                f"{encoding!r}, alibi={getattr(config, 'alibi', False)}), so nothing is rotated; "
                f"read {point.name[0]}",
            )
        if not rotary.has_call(b.attn[1]):
            raise self._missing(
                point,
                f"{type(b.attn[1]).__name__}'s modeling module has no apply_rotary_pos_emb(q, k, "
                f"cos, sin) to observe; read {point.name[0]}",
            )
        sel: Selector = Whole(heads_first=True)
        if not is_q and getattr(config, "new_decoder_architecture", False):
            sel = Broadcast(sh.n_heads // sh.n_kv_heads)  # Falcon rotates keys already broadcast
        t = _tap(b, b.attn, "out", item=0 if is_q else 1, select=sel)
        return Resolved(address, "rotary", t, width, True)  # type: ignore[arg-type]

    def _mla_value(self, address: Address, b: Block, mla: tuple[str, nn.Module]) -> Resolved:
        """MLA (DeepSeek-V3): kv_b_proj decompresses the shared latent into per-head [k_nope | v];
        `value` is the per-head v part, n_heads x v_head_dim (what attention mixes), not the
        latent, which feeds keys as well."""
        config = self.config.get_text_config()
        heads, nope, v_dim = self.s.shapes.n_heads, config.qk_nope_head_dim, config.v_head_dim
        sel = GroupSlice(heads, nope, nope + v_dim)
        return Resolved(address, "tap", _tap(b, mla, "out", select=sel), heads * v_dim, True)  # type: ignore[arg-type]

    def _mlp_inner(self, point: Point, address: Address, b: Block) -> Resolved:
        if b.mlp is None:
            raise self._missing(point, "no MLP module found")
        if b.moe:
            if self.family is not None and not self.family.has_point(point):
                raise self._missing(point, "")
            raise self._refuse(
                point,
                f"layer {b.index} is a sparse mixture-of-experts layer: each expert has its own "
                "MLP activations over the tokens routed to it, so there is no single "
                f"[batch, seq, d_mlp] tensor; capture router_logits / expert_indices or mlp_out",
            )
        down = b.sub(b.mlp, st.DOWN_NAMES)
        gate = b.sub(b.mlp, st.GATE_NAMES)
        up = b.sub(b.mlp, st.UP_NAMES)
        fused = b.sub(b.mlp, st.FUSED_GATE_UP_NAMES)
        plain = b.sub(b.mlp, st.PLAIN_IN_NAMES)
        if down is None:
            raise self._missing(point, "no down projection found in the MLP")
        n = st.in_features(down[1])
        if point.name == "mlp_act":
            return Resolved(address, "tap", _tap(b, down, "in"), n, True)  # type: ignore[arg-type]
        if fused is not None and st.out_features(fused[1]) == 2 * n:
            # Phi-3: gate_up_proj output chunks into [gate | up].
            sel = LastSlice(0, n) if point.name == "mlp_pre" else LastSlice(n, 2 * n)
            return Resolved(address, "tap", _tap(b, fused, "out", select=sel), n, True)  # type: ignore[arg-type]
        if gate is not None and up is not None:
            target = gate if point.name == "mlp_pre" else up
            return Resolved(address, "tap", _tap(b, target, "out"), n, True)  # type: ignore[arg-type]
        if point.name == "mlp_pre_linear":
            raise self._missing(point, "the MLP is not gated (no separate up projection)")
        if plain is not None:
            return Resolved(address, "tap", _tap(b, plain, "out"), n, True)  # type: ignore[arg-type]
        raise self._missing(point, "no first MLP projection found")


# --- one resolver per point: the registry's points are exactly these keys (a test checks) ----

_LayerResolver = Callable[[Resolver, Point, Address, Block], Resolved]

TRUNK_RESOLVERS: dict[str, Callable[[Resolver, Point, Address], Resolved]] = {
    "embeddings": Resolver._embeddings,
    "final_norm": Resolver._final_norm,
    "lm_head": Resolver._lm_head,
}
LAYER_RESOLVERS: dict[str, _LayerResolver] = {
    "resid_pre": Resolver._resid_pre,
    "attn_in": Resolver._attn_in,
    **dict.fromkeys(("q", "k"), Resolver._qk),
    **dict.fromkeys(("q_norm_in", "q_norm_out", "k_norm_in", "k_norm_out"), Resolver._qk_norm),
    **dict.fromkeys(("q_rot", "k_rot"), Resolver._rotary),
    "value": Resolver._value,
    "attn_scores": Resolver._attention,
    "attn_probs": Resolver._attention,
    "z": Resolver._z,
    "attn_gate": Resolver._gate,
    "attn_out": Resolver._attn_out_point,
    "attn_out_post": Resolver._attn_out_post,
    "resid_mid": Resolver._resid_mid,
    "mlp_in": Resolver._mlp_in_point,
    **dict.fromkeys(("mlp_pre", "mlp_pre_linear", "mlp_act"), Resolver._mlp_inner),
    **dict.fromkeys(("router_logits", "expert_weights", "expert_indices"), Resolver._router),
    "mlp_out": Resolver._mlp_out_point,
    "mlp_out_post": Resolver._mlp_out_post,
    "resid_post": Resolver._resid_post,
    **dict.fromkeys(("resid_streams", *_HC_POINTS), Resolver._single_stream),
}
