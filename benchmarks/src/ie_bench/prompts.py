"""Prompts normalized to an exact token count, so every model and backend prefills the same length."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

PASSAGE = (
    "The history of astronomy is a long conversation between careful observers and bold theorists. "
    "Ancient sky watchers in Babylon recorded the positions of planets on clay tablets, and Greek "
    "geometers tried to explain those motions with circles upon circles. Centuries later, Copernicus "
    "placed the Sun at the centre, Kepler found that orbits are ellipses, and Galileo turned a small "
    "telescope towards Jupiter and saw four moons circling it. Newton then showed that one law of "
    "gravitation governs a falling apple and the orbit of the Moon. Modern observatories measure the "
    "light of galaxies billions of years old, and spacecraft have visited every planet in the solar "
    "system. Each discovery raised new questions: what dark matter is made of, why the expansion of "
    "the universe is accelerating, and whether life exists anywhere beyond the Earth. "
)


class Tokenizes(Protocol):
    def to_tokens(self, text: str, *, prepend_bos: bool | None = None) -> list[int]: ...


def normalized_prompts(model: Tokenizes, length: int, count: int = 1) -> list[list[int]]:
    """`count` distinct prompts of exactly `length` ids each (BOS included when the model uses one).

    Prompt i starts `i * 13` tokens further into the passage, so concurrent requests never share
    a prefix even if a backend ignored the request to turn prefix caching off.
    """
    if length < 2:
        raise ValueError(f"prompt length must be >= 2 tokens, got {length}")
    bos = list(model.to_tokens("", prepend_bos=None))  # the tokenizer's own
    need = length - len(bos) + 13 * count
    body: list[int] = []
    text = PASSAGE
    while len(body) < need:
        body = list(model.to_tokens(text, prepend_bos=False))
        text += PASSAGE
    body_len = length - len(bos)
    return [bos + body[13 * i : 13 * i + body_len] for i in range(count)]


def check_lengths(prompts: Sequence[Sequence[int]], length: int) -> None:
    bad = [len(p) for p in prompts if len(p) != length]
    if bad:
        raise ValueError(f"prompt normalization produced lengths {bad}, expected {length}")
