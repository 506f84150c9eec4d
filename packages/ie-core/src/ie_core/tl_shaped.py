"""TransformerLens-shaped conveniences on `SyncModel`: `model(ids)` -> logits, `run_with_cache`
-> `(logits, cache)`, batched `to_tokens`, `to_str_tokens`, `to_single_token`, `to_string` of a
row or a batch. Side by side with TransformerLens and nnsight: docs/COMING_FROM.md.

Logits are the logit lens of the last block's output (`decode_residuals`: final norm, unembed,
multiplier, softcap), so they are the model's real logits on every backend, steering included.
"""

from __future__ import annotations

import numbers
from collections.abc import Sequence
from typing import Any

from ie_core.address import AddressLike, to_address
from ie_core.cache import ActivationCache
from ie_core.errors import BadPromptError


def head_counts(model: Any) -> tuple[int | None, int | None]:
    """(n_heads, n_kv_heads) where the backend exposes its attention shapes, else (None, None)."""
    shapes = getattr(getattr(model, "structure", None), "shapes", None)
    if shapes is not None:
        return int(shapes.n_heads), int(shapes.n_kv_heads)
    per_layer = set(getattr(getattr(model, "info", None), "attn_heads", {}).values())
    n_heads = per_layer.pop() if len(per_layer) == 1 else getattr(model, "n_heads", None)
    return n_heads, getattr(model, "n_kv_heads", None)


def last_residual(model: Any) -> str:
    """The point whose decoded rows are the logits: the last block's output (all its streams)."""
    last = model.n_layers - 1
    return f"resid_streams.{last}" if "resid_streams" in model.points() else f"resid_post.{last}"


class TLShaped:
    """Mixed into `SyncModel`; builds on its `capture`, `decode_residuals` and tokenizer calls."""

    model: Any

    def __call__(self, tokens: Any, **kw: Any) -> Any:
        """Logits `[batch, seq, vocab]` for a prompt (text or ids) or a batch, as TL's `model(ids)`."""
        logits, _ = self.run_with_cache(tokens, [], **kw)
        return logits

    def run_with_cache(
        self, tokens: Any, names: Sequence[AddressLike] | None = None, **kw: Any
    ) -> tuple[Any, ActivationCache]:
        """`(logits, cache)` from one forward. `names` are our addresses or TL / nnterp names; the
        cache holds them under our names (`cache["resid_post.3"]`), and any spelling indexes it."""
        if names is None:
            raise BadPromptError(
                "run_with_cache needs the points to keep, e.g. ['resid_post.3', "
                "'blocks.3.hook_resid_post']: this engine does not cache every hook by default "
                "(model.points() lists them)"
            )
        if isinstance(names, str):
            names = [names]
        wanted = [to_address(n) for n in names]
        residual = to_address(last_residual(self.model))
        sync: Any = self  # a SyncModel: its blocking capture and decode
        cache = sync.capture(tokens, [*wanted, residual], **kw)
        rows = cache[residual]
        logits = sync.decode_residuals(rows.reshape(-1, rows.shape[-1]))
        logits = logits.reshape(*rows.shape[:-1], logits.shape[-1])
        kept = ActivationCache({a: cache[a] for a in wanted})
        return logits, kept.with_heads(*head_counts(self.model))

    def to_tokens(
        self, text: str | Sequence[str], *, prepend_bos: bool | None = None, batch: bool = False
    ) -> Any:
        """Ids of one text (`batch=True`: as a batch of one, `[[...]]`) or of a list of texts.
        `prepend_bos=True` puts the tokenizer's BOS first, as TransformerLens does; the default
        (None) keeps the tokenizer's own special tokens; False adds none."""
        if isinstance(text, str):
            ids = self.model.to_tokens(text, prepend_bos=prepend_bos)
            return [ids] if batch else ids
        if not isinstance(text, Sequence) or not all(isinstance(t, str) for t in text):
            raise BadPromptError(
                f"to_tokens takes a string or a list of strings, got {text!r}"[:120]
            )
        return [self.model.to_tokens(t, prepend_bos=prepend_bos) for t in text]

    def to_str_tokens(self, text: Any, *, prepend_bos: bool | None = None) -> list[str]:
        """Each token of a text (or of a row of ids) as its own string."""
        ids = self.to_tokens(text, prepend_bos=prepend_bos) if isinstance(text, str) else text
        return [self.model.to_string([i]) for i in _row(ids)]

    def to_single_token(self, text: str) -> int:
        """The id of a text that is exactly one token (no BOS); refused otherwise."""
        ids = self.model.to_tokens(text, prepend_bos=False)
        if len(ids) != 1:
            raise BadPromptError(f"{text!r} is {len(ids)} tokens, not one: {ids}")
        return int(ids[0])

    def to_string(self, ids: Any) -> str | list[str]:
        """Text of one id, a row of ids (str) or a batch of rows (list of str)."""
        ndim = getattr(ids, "ndim", None)
        if ndim == 0 or isinstance(ids, numbers.Integral):
            return self.model.to_string([int(ids)])
        if ndim == 2 or (ndim is None and len(ids) and not _is_id(ids[0])):
            return [self.model.to_string(_row(r)) for r in ids]
        return self.model.to_string(_row(ids))


def _is_id(x: Any) -> bool:
    return isinstance(x, numbers.Integral) or getattr(x, "ndim", None) == 0


def _row(ids: Any) -> list[int]:
    values = ids.tolist() if hasattr(ids, "tolist") else list(ids)
    if not isinstance(values, list) or not all(
        isinstance(i, numbers.Integral) and not isinstance(i, bool) for i in values
    ):
        raise BadPromptError(f"expected one row of integer token ids, got {ids!r}"[:120])
    return [int(i) for i in values]
