"""Where a steering spec acts in time: the masked positions of one request, with an optional
prefill-only scope (every position from the prompt's end on is left alone too).

Backends test `position not in masked` row by row, on prompt and generated positions alike, so a
set that also contains every position >= `limit` is all a prefill-only scope needs on each of them.
"""

from __future__ import annotations

import numbers
from collections.abc import Iterable, Sequence
from dataclasses import replace
from typing import Any

from ie_core.ops import PositionMask, Steering
from ie_core.protocol import steering_tuple

__all__ = ["ScopedPositions", "mask_positions", "pin_prompt", "scoped"]


class ScopedPositions(frozenset[int]):
    """Explicit masked positions, plus every position >= `limit` when `limit` is set."""

    limit: int | None

    def __new__(cls, positions: Iterable[int] = (), limit: int | None = None) -> ScopedPositions:
        out = super().__new__(cls, positions)
        out.limit = limit
        return out

    def __contains__(self, position: object) -> bool:
        # Any integer, numpy's too: vLLM's batch layout hands positions as np.int64.
        limit = self.limit
        if limit is not None and isinstance(position, numbers.Integral) and int(position) >= limit:
            return True
        return super().__contains__(position)

    def __bool__(self) -> bool:
        return self.limit is not None or len(self) > 0

    def __repr__(self) -> str:
        return f"ScopedPositions({sorted(self)}, limit={self.limit})"


def scoped(positions: Iterable[int], limit: int | None) -> frozenset[int]:
    """A plain frozenset when there is no limit (what every backend had before), else scoped."""
    return frozenset(positions) if limit is None else ScopedPositions(positions, limit)


def mask_positions(
    mask: PositionMask, prompt_ids: Sequence[int], special_ids: Iterable[int] = ()
) -> frozenset[int]:
    """`mask.masked(...)` plus the BOS skip and the prefill-only scope of `mask`."""
    special = set(special_ids)
    out = set(mask.masked(prompt_ids, special))
    if mask.skip_bos and prompt_ids and prompt_ids[0] in special:
        out.add(0)
    return scoped(out, len(prompt_ids) if mask.prefill_only else None)


def pin_prompt(steering: Any, prompt_len: int, total_len: int) -> Any:
    """Specs for a re-run forward over prompt + generated tokens (eager's capture_generation):
    a prefill-only scope becomes explicit masked positions prompt_len..total_len-1, since the
    re-run sees the generated tokens as part of its prompt."""

    specs = steering_tuple(steering)
    if not any(s.mask.prefill_only for s in specs):
        return steering
    out: list[Steering] = []
    for s in specs:
        if s.mask.prefill_only:
            extra = tuple(range(prompt_len, total_len))
            mask = replace(s.mask, positions=s.mask.positions + extra, prefill_only=False)
            s = replace(s, mask=mask)
        out.append(s)
    return tuple(out)
