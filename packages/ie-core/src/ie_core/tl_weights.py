"""`model.cfg` and weights by TransformerLens's names (`W_U`, `W_E`, `W_Q`, `W_O[layer]`, ...).

Every backend derives `TLFacts` (through `ModelFront`). A backend that holds weights answers
`weight_parts(part)` with Hugging Face / torch layouts (a linear layer's weight is `[out, in]`,
embedding and unembedding `[d_vocab, d_model]`, per-layer parts one tensor per layer); this
module rearranges them into TransformerLens's shapes once for all backends. Those shapes, stacked
over layers as TransformerLens's `model.W_Q` is (TransformerLens 4.3's TransformerBridge, with no
weight processing: no folded norms, no centring):

    W_E [d_vocab, d_model]          W_U [d_model, d_vocab]          b_U [d_vocab]
    W_Q [n_layers, n_heads, d_model, d_head]        b_Q [n_layers, n_heads, d_head]
    W_K, W_V [n_layers, n_key_value_heads, d_model, d_head]   (grouped-query: the KV heads)
    W_O [n_layers, n_heads, d_head, d_model]        b_O [n_layers, d_model]
    W_in, W_gate [n_layers, d_model, d_mlp]         W_out [n_layers, d_mlp, d_model]

A bias the checkpoint does not have is refused by name, as TransformerLens does, except `b_U`,
which TransformerLens gives as zeros. A part a backend cannot give (a fused layout it does not
split, weights sharded over tensor-parallel ranks, a remote model) is refused with why.
"""

from __future__ import annotations

from typing import Any

from ie_core.errors import UnsupportedOperationError
from ie_core.tl_config import TLConfig, tl_config

__all__ = ["PARTS", "TL_WEIGHTS", "TLFacts"]

# Our raw part names, each in torch's layout, that a backend's `weight_parts` answers.
PARTS = (
    "embed", "unembed", "unembed_bias", "q", "k", "v", "o", "q_bias", "k_bias", "v_bias",
    "o_bias", "gate", "up", "down", "up_bias", "down_bias", "pos_embed",
)  # fmt: skip

# TransformerLens name -> (our part, how it is rearranged).
TL_WEIGHTS: dict[str, tuple[str, str]] = {
    "W_E": ("embed", "as_is"),
    "W_pos": ("pos_embed", "as_is"),
    "W_U": ("unembed", "transpose"),
    "b_U": ("unembed_bias", "as_is"),
    "W_Q": ("q", "heads_in"),
    "W_K": ("k", "kv_heads_in"),
    "W_V": ("v", "kv_heads_in"),
    "W_O": ("o", "heads_out"),
    "b_Q": ("q_bias", "heads_bias"),
    "b_K": ("k_bias", "kv_heads_bias"),
    "b_V": ("v_bias", "kv_heads_bias"),
    "b_O": ("o_bias", "stack"),
    "W_in": ("up", "transpose_stack"),
    "W_gate": ("gate", "transpose_stack"),
    "W_out": ("down", "transpose_stack"),
    "b_in": ("up_bias", "stack"),
    "b_out": ("down_bias", "stack"),
}


class TLFacts:
    """`cfg` and the `W_*` / `b_*` properties; a backend supplies `weight_parts` and
    `tl_source_config` (both refuse or say None by default)."""

    # --- what a backend supplies ---------------------------------------------------------------

    def weight_parts(self, part: str) -> Any:
        """`part` (one of `PARTS`) in torch's layout: a tensor, or one per layer; None where the
        checkpoint has no such part. This backend holds no weights."""
        raise UnsupportedOperationError(
            f"{type(self).__name__} holds no weights in this process, so {part} cannot be read "
            "here; load the model on backend='eager' (or 'vllm') to read weights by name"
        )

    def tl_source_config(self) -> Any | None:
        """The HF (text) config the backend loaded, or None where it has none."""
        return None

    # --- TransformerLens's names ---------------------------------------------------------------

    @property
    def cfg(self) -> TLConfig:
        """The model's shape under TransformerLens's names (`cfg.n_layers`, `cfg.d_head`, ...)."""
        me: Any = self
        info = getattr(me, "info", None)
        source = self.tl_source_config()
        vocab = int(getattr(info, "vocab_size", 0) or _vocab(source) or len(me.tokenizer))
        heads = set(getattr(info, "attn_heads", {}).values())
        return tl_config(
            source,
            n_layers=int(me.n_layers),
            d_model=int(me.d_model),
            d_vocab=vocab,
            architecture=str(getattr(me, "architecture", "") or _architecture(source)),
            model_name=str(getattr(me, "model_id", "") or ""),
            n_heads=heads.pop() if len(heads) == 1 else None,
        )

    def tl_weight(self, name: str) -> Any:
        """The weight TransformerLens calls `name` (`"W_Q"`, `"b_U"`, ...), in its shape."""
        if name not in TL_WEIGHTS:
            known = ", ".join(TL_WEIGHTS)
            raise UnsupportedOperationError(f"{name!r} is not a weight name; known: {known}")
        part, how = TL_WEIGHTS[name]
        try:
            got = self.weight_parts(part)
        except UnsupportedOperationError as error:
            raise UnsupportedOperationError(f"{name}: {error}") from error
        if got is None or (isinstance(got, list) and any(t is None for t in got)):
            if name == "b_U":  # TransformerLens's b_U is zeros where the unembed has no bias
                unembed = self.weight_parts("unembed")
                return unembed.new_zeros(unembed.shape[0])
            raise UnsupportedOperationError(
                f"{name} does not exist on this model (its checkpoint has no {part} parameter: "
                "a bias-free projection, or no learned positions); TransformerLens refuses it too"
            )
        return _arrange(got, how, self.cfg)

    W_E = property(lambda self: self.tl_weight("W_E"), doc="`[d_vocab, d_model]`")
    W_pos = property(lambda self: self.tl_weight("W_pos"), doc="`[n_ctx, d_model]`")
    W_U = property(lambda self: self.tl_weight("W_U"), doc="`[d_model, d_vocab]`")
    b_U = property(lambda self: self.tl_weight("b_U"), doc="`[d_vocab]`")
    W_Q = property(lambda self: self.tl_weight("W_Q"), doc="`[n_layers, n_heads, d_model, d_head]`")
    W_K = property(lambda self: self.tl_weight("W_K"), doc="`[n_layers, n_kv, d_model, d_head]`")
    W_V = property(lambda self: self.tl_weight("W_V"), doc="`[n_layers, n_kv, d_model, d_head]`")
    W_O = property(lambda self: self.tl_weight("W_O"), doc="`[n_layers, n_heads, d_head, d_model]`")
    b_Q = property(lambda self: self.tl_weight("b_Q"), doc="`[n_layers, n_heads, d_head]`")
    b_K = property(lambda self: self.tl_weight("b_K"), doc="`[n_layers, n_kv, d_head]`")
    b_V = property(lambda self: self.tl_weight("b_V"), doc="`[n_layers, n_kv, d_head]`")
    b_O = property(lambda self: self.tl_weight("b_O"), doc="`[n_layers, d_model]`")
    W_in = property(lambda self: self.tl_weight("W_in"), doc="`[n_layers, d_model, d_mlp]`")
    W_gate = property(lambda self: self.tl_weight("W_gate"), doc="`[n_layers, d_model, d_mlp]`")
    W_out = property(lambda self: self.tl_weight("W_out"), doc="`[n_layers, d_mlp, d_model]`")
    b_in = property(lambda self: self.tl_weight("b_in"), doc="`[n_layers, d_mlp]`")
    b_out = property(lambda self: self.tl_weight("b_out"), doc="`[n_layers, d_model]`")


def _architecture(config: Any) -> str:
    classes = getattr(config, "architectures", None) if config is not None else None
    return str(classes[0]) if classes else ""


def _vocab(config: Any) -> int:
    return int(getattr(config, "vocab_size", 0) or 0) if config is not None else 0


def _arrange(got: Any, how: str, cfg: TLConfig) -> Any:
    """torch's layout to TransformerLens's (see the module docstring for each shape)."""
    if how == "as_is":
        return got
    if how == "transpose":
        return got.T.contiguous()
    import torch  # a backend that holds weights has torch; ie-core itself does not import it

    if how == "stack":
        return torch.stack(list(got))
    if how == "transpose_stack":
        return torch.stack([w.T for w in got])
    heads = _count(cfg.n_heads, "n_heads")
    kv = cfg.n_key_value_heads or heads
    d_head = _count(cfg.d_head, "d_head")
    if how in ("heads_in", "kv_heads_in"):  # [h * d_head, d_model] -> [h, d_model, d_head]
        n = heads if how == "heads_in" else kv
        return torch.stack([w.reshape(n, d_head, w.shape[-1]).transpose(1, 2) for w in got])
    if how == "heads_out":  # [d_model, h * d_head] -> [h, d_head, d_model]
        return torch.stack([w.reshape(w.shape[0], heads, d_head).permute(1, 2, 0) for w in got])
    n = heads if how == "heads_bias" else kv  # [h * d_head] -> [h, d_head]
    return torch.stack([b.reshape(n, d_head) for b in got])


def _count(value: int | None, name: str) -> int:
    if not value:
        raise UnsupportedOperationError(f"this model's config does not give {name}")
    return value
