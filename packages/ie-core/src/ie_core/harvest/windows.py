"""Documents to fixed context windows: the BOS policy and packing, stated in the manifest.

`bos="window"` starts every window with the tokenizer's own BOS (what `to_tokens("",
prepend_bos=None)` returns: nothing for a tokenizer that adds none), `bos="none"` never adds one.
`packing="packed"` concatenates documents' tokens (no separator) and cuts windows of `context`
rows; `packing="document"` starts a new window at each document (the last one of a document may
be shorter). Documents are tokenized without special tokens.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass

from ie_core.harvest.errors import HarvestError

__all__ = ["BOS_POLICIES", "PACKINGS", "Window", "bos_tokens", "make_windows"]

BOS_POLICIES = ("window", "none")
PACKINGS = ("packed", "document")

Tokenize = Callable[..., list[int]]


@dataclass(frozen=True)
class Window:
    """One forward's rows: token ids and, per row, the index of the document it came from
    (-1 for an added BOS). Row `i` sits at position `i` of the forward."""

    tokens: tuple[int, ...]
    documents: tuple[int, ...]


def bos_tokens(to_tokens: Tokenize, bos: str) -> tuple[int, ...]:
    if bos not in BOS_POLICIES:
        raise HarvestError(f"bos policy {bos!r} unknown; choose one of {BOS_POLICIES}")
    return tuple(to_tokens("", prepend_bos=None)) if bos == "window" else ()


def _document_tokens(
    documents: Iterable[str], to_tokens: Tokenize
) -> Iterator[tuple[int, list[int]]]:
    for index, text in enumerate(documents):
        ids = to_tokens(text, prepend_bos=False)
        if ids:
            yield index, ids


def _windows(
    documents: Iterable[str], to_tokens: Tokenize, body: int, head: tuple[int, ...], packing: str
) -> Iterator[Window]:
    tokens: list[int] = []
    owners: list[int] = []
    for index, ids in _document_tokens(documents, to_tokens):
        if packing == "document" and tokens:
            yield Window(head + tuple(tokens), (-1,) * len(head) + tuple(owners))
            tokens, owners = [], []
        tokens.extend(ids)
        owners.extend([index] * len(ids))
        while len(tokens) >= body:
            yield Window(head + tuple(tokens[:body]), (-1,) * len(head) + tuple(owners[:body]))
            del tokens[:body], owners[:body]
    if tokens:
        yield Window(head + tuple(tokens), (-1,) * len(head) + tuple(owners))


def make_windows(
    documents: Iterable[str],
    to_tokens: Tokenize,
    *,
    context: int,
    bos: str = "window",
    packing: str = "packed",
    max_tokens: int | None = None,
) -> Iterator[Window]:
    """Windows of at most `context` rows, in corpus order, `max_tokens` rows in all at most."""
    if packing not in PACKINGS:
        raise HarvestError(f"packing {packing!r} unknown; choose one of {PACKINGS}")
    head = bos_tokens(to_tokens, bos)
    if context <= len(head):
        raise HarvestError(f"context {context} leaves no room after the BOS {list(head)}; raise it")
    left = max_tokens
    for window in _windows(documents, to_tokens, context - len(head), head, packing):
        if left is not None:
            if left <= len(head):
                return
            window = Window(window.tokens[:left], window.documents[:left])
            left -= len(window.tokens)
        yield window
