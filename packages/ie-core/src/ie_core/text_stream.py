"""Incremental text for streamed tokens, shared by every backend's `generate_stream`.

A multi-byte character can span tokens, so decoding a prefix may end in U+FFFD; only text that is
complete so far is emitted, and the rest arrives with the token that completes it.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence


class TextStream:
    """`push(token)` returns the new complete text since the previous push."""

    def __init__(self, decode: Callable[[Sequence[int]], str]) -> None:
        self.decode = decode
        self.ids: list[int] = []
        self.emitted = ""

    def push(self, token: int) -> str:
        self.ids.append(token)
        text = self.decode(self.ids)
        ok = text.startswith(self.emitted) and not text.endswith("\ufffd")
        chunk = text[len(self.emitted) :] if ok else ""
        self.emitted += chunk
        return chunk


__all__ = ["TextStream"]
