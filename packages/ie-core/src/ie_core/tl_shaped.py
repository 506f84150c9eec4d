"""TransformerLens-shaped conveniences on `SyncModel`: `model(ids)` -> logits, `run_with_cache`
-> `(logits, cache)`, batched `to_tokens`, `to_str_tokens`, `to_single_token`, `to_string` of a
row or a batch. Side by side with TransformerLens and nnsight: docs/COMING_FROM.md.

Logits are the logit lens of the last block's output (`decode_residuals`: final norm, unembed,
multiplier, softcap), so they are the model's real logits on every backend, steering included.
"""

from __future__ import annotations

import numbers
import warnings
from collections.abc import Callable, Sequence
from typing import Any, NamedTuple

from ie_core.cache import ActivationCache
from ie_core.errors import BadPromptError, PointUnavailableError
from ie_core.grammar import (
    POINTS,
    POINTS_BY_NAME,
    Address,
    AddressLike,
    Width,
    point_name,
    tl_name,
    to_address,
)
from ie_core.prompts import prompt_batch

# What an everything-cache (`run_with_cache` without names) may hold before it is refused.
MAX_CACHE_BYTES = 2 * 1024**3
NamesFilter = Callable[[str], bool] | Sequence[AddressLike] | None


class LogitsAndCache(NamedTuple):
    """What `run_with_cache` returns, the free function and the method alike: `(logits, cache)`,
    as TransformerLens's `run_with_cache`. `capture(model, ...)` is the cache alone."""

    logits: Any
    cache: ActivationCache

    def __getitem__(self, key: Any) -> Any:  # type: ignore[override]
        if isinstance(key, int | slice):
            return tuple.__getitem__(self, key)
        # The free run_with_cache returned the cache alone before; its callers indexed it.
        warnings.warn(
            "run_with_cache(...) returns (logits, cache), as TransformerLens's does: unpack it "
            "(`logits, cache = run_with_cache(...)`) or call capture(...) for the cache alone; "
            "indexing the pair by address is removed in 0.3.0",
            DeprecationWarning,
            stacklevel=2,
        )
        return self.cache[key]


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


def _keeps(names_filter: NamesFilter) -> Callable[[Address], bool]:
    """The filter as a test of one address: a callable is asked with our name and, where there is
    one, the TransformerLens name (either True keeps it); a list names addresses in any spelling,
    or whole points (`"resid_post"`, `"hook_z"`: every layer)."""
    if names_filter is None:
        return lambda _: True
    if callable(names_filter):
        fn = names_filter

        def ask(address: Address) -> bool:
            tl = tl_name(address)
            return bool(fn(str(address))) or (tl is not None and bool(fn(tl)))

        return ask
    if isinstance(names_filter, str):
        names_filter = [names_filter]
    points: set[str] = set()
    addresses: set[Address] = set()
    for name in names_filter:
        if isinstance(name, str) and "{" not in name and (point := _point_or_none(name)):
            points.add(point)
        else:
            addresses.add(to_address(name, check=True))
    return lambda address: address.name in points or address in addresses


def _point_or_none(name: str) -> str | None:
    try:
        return point_name(name)
    except ValueError:
        return None


def every_address(model: Any, names_filter: NamesFilter = None) -> list[Address]:
    """Every address the model serves for reading, in forward order (its own `capabilities()`:
    each served point at each layer it serves), kept by `names_filter`."""
    capabilities = model.capabilities()
    keep = _keeps(names_filter)
    out: list[Address] = []
    for point in POINTS:
        cap = capabilities.get(point.name)
        if cap is None or not cap.served:
            continue
        layers: tuple[int | None, ...] = cap.layers if point.per_layer else (None,)
        out.extend(a for a in (Address(point.name, layer) for layer in layers) if keep(a))
    return out


def cache_bytes(model: Any, tokens: Any, addresses: Sequence[Address]) -> int:
    """An estimate, before any forward, of what capturing `addresses` over `tokens` holds: rows x
    width per address (heads x seq x seq for the attention maps), at the model's dtype (4 bytes
    where it states none)."""
    batch = prompt_batch(tokens, model.to_tokens, 1 << 62)
    rows, seq = len(batch) * max(map(len, batch)), max(map(len, batch))
    itemsize = int(getattr(getattr(model, "dtype", None), "itemsize", 4) or 4)
    n_heads = head_counts(model)[0] or 1
    total = 0
    for address in addresses:
        if POINTS_BY_NAME[address.name].width is Width.HQK:
            heads = getattr(getattr(model, "info", None), "attn_heads", {}).get(address.layer)
            total += rows * (heads or n_heads) * seq
            continue
        try:
            width = model.point_width(address)
        except PointUnavailableError:
            width = model.d_model
        # Expert indices are int64 whatever the model's dtype.
        total += rows * width * (8 // itemsize if address.name == "expert_indices" else 1)
    return total * itemsize


def checked_everything(
    model: Any, tokens: Any, names_filter: NamesFilter, max_cache_bytes: int
) -> list[Address]:
    """`every_address`, refused (before the run) when the estimate exceeds `max_cache_bytes`."""
    addresses = every_address(model, names_filter)
    if not addresses:
        raise BadPromptError("names_filter keeps none of the points this model serves")
    size = cache_bytes(model, tokens, addresses)
    if size > max_cache_bytes:
        raise BadPromptError(
            f"caching every point ({len(addresses)} addresses) over these tokens would hold about "
            f"{size} bytes ({size / 1024**3:.2f} GiB), over max_cache_bytes={max_cache_bytes}; "
            "keep fewer with names_filter=, pass fewer tokens, or raise max_cache_bytes"
        )
    return addresses


class TLShaped:
    """Mixed into `SyncModel`; builds on its `capture`, `decode_residuals` and tokenizer calls."""

    model: Any

    def __call__(self, tokens: Any, **kw: Any) -> Any:
        """Logits `[batch, seq, vocab]` for a prompt (text or ids) or a batch, as TL's `model(ids)`."""
        logits, _ = self.run_with_cache(tokens, [], **kw)
        return logits

    def run_with_cache(
        self,
        tokens: Any,
        names: Sequence[AddressLike] | None = None,
        *,
        names_filter: NamesFilter = None,
        max_cache_bytes: int = MAX_CACHE_BYTES,
        **kw: Any,
    ) -> LogitsAndCache:
        """`(logits, cache)` from one forward. `names` are our addresses or TL / nnterp names; the
        cache holds them under our names (`cache["resid_post.3"]`), and any spelling indexes it.
        Without `names`, every point the model serves (`names_filter` keeps some, as TL's), refused
        before the run when its estimated size passes `max_cache_bytes` (2 GiB)."""
        if names is None:
            wanted = checked_everything(self.model, tokens, names_filter, max_cache_bytes)
        else:
            if names_filter is not None:
                raise BadPromptError("give names or names_filter, not both")
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
        return LogitsAndCache(logits, kept.with_heads(*head_counts(self.model)))

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
