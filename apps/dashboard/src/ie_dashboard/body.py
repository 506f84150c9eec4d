"""Strict JSON for what is ingested: size and nesting depth bounded before parsing, finite numbers.

Python's `json` accepts `NaN` and `Infinity`, turns `1e999` into infinity, recurses once per
nesting level and refuses integers past 4,300 digits with a bare ValueError; each of those used to
reach the database or end in a 500. A NUL character (U+0000) is refused too: PostgreSQL text
cannot hold it, and one rule for both databases keeps what is accepted the same on either.
Everything here fails with a `BodyError` that says why.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import AsyncIterator
from typing import Any

MAX_BODY = 20 * 2**20  # a full validator sweep result is ~100 KB; this only stops runaway posts
MAX_DEPTH = 64  # the deepest ingested shape nests ~6 levels; free-form detail gets the rest
MAX_INT_DIGITS = 64

# A JSON string literal, unrolled so a long string is one linear scan.
_STRING = re.compile(rb'"[^"\\]*(?:\\.[^"\\]*)*"', re.S)
_BRACKET = re.compile(rb"[\[\]{}]")


class BodyError(ValueError):
    """A body the ingest API refuses: `status` is the HTTP code, `kind` a machine-readable tag."""

    def __init__(self, status: int, kind: str, message: str) -> None:
        super().__init__(message)
        self.status, self.kind, self.message = status, kind, message


async def read_limited(chunks: AsyncIterator[bytes], declared: str | None) -> bytes:
    """The body, refused (413) as soon as it is known to pass MAX_BODY, before it is all read."""
    if declared is not None and declared.isdigit() and int(declared) > MAX_BODY:
        raise BodyError(413, "body_too_large", _too_large(int(declared)))
    parts: list[bytes] = []
    size = 0
    async for chunk in chunks:
        size += len(chunk)
        if size > MAX_BODY:
            raise BodyError(413, "body_too_large", _too_large(size, at_least=True))
        parts.append(chunk)
    return b"".join(parts)


def _too_large(size: int, at_least: bool = False) -> str:
    more = "at least " if at_least else ""
    return f"body is {more}{size:,} bytes; the limit is {MAX_BODY:,}"


def nesting_depth(raw: bytes, limit: int = MAX_DEPTH) -> int:
    """How deep arrays and objects nest in `raw` (string contents ignored); stops past `limit`."""
    depth = peak = 0
    for m in _BRACKET.finditer(_STRING.sub(b'""', raw)):
        depth += 1 if m.group() in (b"[", b"{") else -1
        if depth > peak:
            peak = depth
            if peak > limit:
                break
    return peak


def _constant(name: str) -> Any:
    raise BodyError(
        422, "json_not_finite", f"{name} is not a number JSON allows; send a finite value or null"
    )


def _float(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):
        raise BodyError(422, "json_not_finite", f"{text[:40]} overflows a 64-bit float")
    return value


def _int(text: str) -> int:
    digits = len(text.lstrip("-"))
    if digits > MAX_INT_DIGITS:
        raise BodyError(
            422,
            "json_int_too_long",
            f"an integer of {digits:,} digits; at most {MAX_INT_DIGITS} are accepted",
        )
    return int(text)


def parse_json(raw: bytes) -> Any:
    """Parse `raw` strictly; raises BodyError (422) naming the first problem."""
    if nesting_depth(raw) > MAX_DEPTH:
        raise BodyError(
            422, "json_too_deep", f"arrays and objects nest deeper than {MAX_DEPTH} levels"
        )
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise BodyError(422, "json_invalid", f"body is not UTF-8 ({exc})") from None
    try:
        data = json.loads(text, parse_constant=_constant, parse_float=_float, parse_int=_int)
    except json.JSONDecodeError as exc:
        raise BodyError(422, "json_invalid", f"body is not JSON ({exc})") from None
    try:
        # A lone UTF-16 surrogate escape (\ud800) decodes to a str that cannot be stored as UTF-8.
        json.dumps(data, ensure_ascii=False).encode("utf-8")
    except UnicodeEncodeError:
        raise BodyError(
            422,
            "json_invalid",
            "body holds a lone UTF-16 surrogate escape (such as \\ud800), which is not a character",
        ) from None
    if _holds_nul(data):
        raise BodyError(
            422,
            "json_invalid",
            "a string holds U+0000 (NUL), which PostgreSQL cannot store; remove the character",
        )
    return data


def _holds_nul(value: Any) -> bool:
    """Any key or string value containing U+0000 (nesting is already bounded by MAX_DEPTH)."""
    if isinstance(value, str):
        return "\x00" in value
    if isinstance(value, dict):
        return any(_holds_nul(k) or _holds_nul(v) for k, v in value.items())
    if isinstance(value, list):
        return any(_holds_nul(v) for v in value)
    return False
