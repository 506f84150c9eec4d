"""The checks an eager request passes before its forward: prompt ids and steering to writes.

`EagerModel`, its decode loop and the streaming lens admit a request here, so each refuses bad
input with the same words and none reaches into the model's internals.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, replace
from typing import Any

import torch
from ie_core.admission import admit_writes, check_row_steering
from ie_core.errors import BadPromptError, SteeringSpecError
from ie_core.grammar import Address, to_address
from ie_core.ops import Steering
from ie_core.protocol import Prompt, SteeringArg, prompt_batch, prompt_ids
from ie_core.steer_scope import mask_positions

from ie_eager.hooks import Write
from ie_eager.resolve import Resolver
from ie_eager.resolved import Resolved

__all__ = ["EagerAdmission"]


@dataclass(frozen=True)
class EagerAdmission:
    """One eager model's request checks: vocabulary, position limit, resolver, dtype."""

    tokenizer: Any
    resolver: Resolver
    vocab: int
    max_positions: int | None
    dtype: torch.dtype
    check_open: Callable[[], None]  # a shut-down model refuses every request first
    eos_sources: tuple[Any, ...]  # generation config, model config, tokenizer

    def prompt_ids(self, tokens: Prompt) -> list[int]:
        self.check_open()
        return list(prompt_ids(tokens, self._to_tokens, self.vocab, self.max_positions))

    def batch_ids(self, tokens: Any) -> list[list[int]]:
        """Rows of one length: the eager backend does not pad (padding changes positions)."""
        self.check_open()
        batch = prompt_batch(tokens, self._to_tokens, self.vocab, self.max_positions)
        rows = [list(r) for r in batch]
        lengths = {len(r) for r in rows}
        if len(lengths) > 1:
            raise BadPromptError(
                f"batch rows have different lengths {sorted(lengths)}; the eager backend does not "
                "pad (padding changes positions); use ie_core.experiments.ragged.capture_ragged (right-padded,"
                " true lengths recorded), capture rows of equal length, or one at a time"
            )
        return rows

    def writes(self, steering: SteeringArg, prompts: list[list[int]]) -> list[Write]:
        """Each steering address admitted (`ie_core.admission`), its positions per prompt."""
        special = set(getattr(self.tokenizer, "all_special_ids", []) or [])
        return [
            Write(
                w.site,
                w.spec.ops,
                tuple(mask_positions(w.spec.mask, p, special) for p in prompts),
                w.spec.width,
                conditions=w.conditions,
            )
            for w in admit_writes(steering, self, self.dtype)
        ]

    def row_writes(
        self, row_steering: Sequence[SteeringArg], prompts: list[list[int]]
    ) -> list[Write]:
        """Each prompt's own steering, admitted as `writes`, applied to its batch row only."""
        check_row_steering(row_steering, len(prompts))
        return [
            replace(w, batch_rows=(b,))
            for b, steering in enumerate(row_steering)
            for w in self.writes(steering, prompts)
        ]

    def check_spec(self, spec: Steering) -> None:
        """Eager runs every op, a `Hook` included."""

    def writable_site(self, address: Address) -> tuple[Resolved, int | None]:
        r = self.resolver.resolve(address)
        if not r.writable or r.kind == "attention":
            raise SteeringSpecError(f"{address} is capture-only and cannot be steered")
        return r, r.width

    def readable_site(self, address: str) -> tuple[Resolved, int]:
        r = self.resolver.resolve(to_address(address))
        if r.kind == "attention" or r.width is None:
            raise SteeringSpecError(
                f"{address} has no one row per token of a fixed width, so no probe reads it"
            )
        return r, r.width

    def eos_ids(self) -> set[int]:
        """Every end-of-sequence id the generation config, model config or tokenizer names."""
        return set(_ids(getattr(s, "eos_token_id", None) for s in self.eos_sources))

    def _to_tokens(self, text: str) -> list[int]:
        if not isinstance(text, str):
            raise BadPromptError(f"to_tokens takes a string, got {type(text).__name__}")
        return list(self.tokenizer(text, add_special_tokens=True)["input_ids"])


def _ids(values: Iterable[Any]) -> Iterable[int]:
    for value in values:
        if isinstance(value, int):
            yield value
        elif isinstance(value, list | tuple):
            yield from (int(v) for v in value)
