"""The checks every request passes before vLLM sees it: addresses, prompt ids, length, steering.

`VLLMModel`, the lens stream, the dictionary ops, the HTTP plugin and the capability probe all
admit a request here, so each refuses bad input with the same words and none of them reaches
into the model's internals.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import torch
from ie_core.admission import admit_writes
from ie_core.errors import (
    PointUnavailableError,
    PromptTooLongError,
    SteeringSpecError,
    UnsupportedOperationError,
)
from ie_core.grammar import Address, AddressLike, check_layer, get_point, to_address
from ie_core.model_info import ModelInfo
from ie_core.ops import Steering
from ie_core.protocol import Prompt, SteeringArg, prompt_batch, prompt_ids
from ie_core.steer_scope import mask_positions

from ie_vllm.host.policy import SitePolicy
from ie_vllm.host.variant import Variant
from ie_vllm.row_budget import check_request
from ie_vllm.specs import SteerSpec

__all__ = ["Admission", "Admitted"]


class _Limits(Protocol):
    @property
    def max_model_len(self) -> int: ...

    @property
    def dtype(self) -> torch.dtype: ...


@dataclass(frozen=True)
class Admitted:
    """A request that passed: its prompt ids, the addresses it captures and its write specs."""

    ids: tuple[int, ...]
    captures: tuple[str, ...]
    steer: tuple[SteerSpec, ...]


class Admission:
    """One model's request checks, from its executor variant (what it serves at all), its
    `ModelInfo`, tokenizer, write policy and engine."""

    def __init__(
        self,
        variant: Variant,
        info: ModelInfo,
        tokenizer: Any,
        policy: SitePolicy,
        engine: _Limits,
        row_limit: int | None = None,
    ) -> None:
        self.variant = variant
        self.backend = variant.backend
        self.info = info
        self.tokenizer = tokenizer
        self.policy = policy
        self.engine = engine  # read lazily: max_model_len is the running engine's
        self.row_limit = row_limit  # bytes of rows a worker holds on its device (row_budget)

    def request(
        self,
        tokens: Prompt,
        new_tokens: int,
        addresses: Sequence[AddressLike] = (),
        steering: SteeringArg = None,
    ) -> Admitted:
        """Prompt ids, length, captures and steering of one generation, checked in that order."""
        ids = self.prompt_ids(tokens)
        self.check_length(ids, new_tokens)
        captures = self.captures(addresses)
        self.check_rows(ids, new_tokens, captures)
        return Admitted(ids, captures, self.steer_specs(steering, ids))

    def require_points(self, what: str) -> None:
        """Refuse `what` where the variant serves no point (`Variant.require_points`)."""
        self.variant.require_points(what)

    def check(self, address: AddressLike) -> str:
        """Validate an address for this model; returns its string form or raises with the reason."""
        addr = to_address(address, check=True)
        if addr.is_path:
            raise PointUnavailableError(
                f"{addr} addresses a raw module, which backend {self.backend!r} does not hook; "
                "use backend='eager' for path addresses"
            )
        if addr.stream is not None:
            arch = self.info.architecture
            raise PointUnavailableError(f"{addr}: {arch} has a single residual stream")
        check_layer(addr, self.info.n_layers)
        text = str(addr)
        if text in self.info.widths:
            self.policy.check_read(text)
            return text
        reason = self.info.refusal(text)
        if reason is None:
            reason = f"{addr.name} does not exist at layer {addr.layer} of {self.info.architecture}"
        raise PointUnavailableError(
            f"{text} is unavailable on backend {self.backend!r}: {reason}", reason
        )

    def captures(self, addresses: Sequence[AddressLike]) -> tuple[str, ...]:
        if isinstance(addresses, str):
            addresses = [addresses]
        return tuple(dict.fromkeys(self.check(a) for a in addresses))

    def vocab(self) -> int:
        return max(len(self.tokenizer), self.info.vocab_size)

    def prompt_ids(self, tokens: Prompt) -> tuple[int, ...]:
        return prompt_ids(tokens, self._to_tokens, self.vocab())

    def prompts(self, tokens: Prompt | Sequence[Sequence[int]]) -> list[tuple[int, ...]]:
        """A batch of prompts (a string, ids, rows of ids, a 2-D tensor) as id tuples."""
        return list(prompt_batch(tokens, self._to_tokens, self.vocab()))

    def check_length(self, ids: Sequence[int], new_tokens: int) -> None:
        """Refuse up front what vLLM would cut short silently at max_model_len."""
        limit = self.engine.max_model_len
        if len(ids) + new_tokens > limit:
            raise PromptTooLongError(
                f"{len(ids)} prompt tokens + {new_tokens} new tokens = {len(ids) + new_tokens} "
                f"exceed this engine's max_model_len={limit}, so vLLM would stop early; shorten "
                f"the prompt, ask for at most {max(limit - len(ids), 0)} new tokens, or load the "
                "model with a larger max_model_len"
            )

    def check_rows(self, ids: Sequence[int], new_tokens: int, captures: Sequence[str]) -> None:
        """Refuse a request whose captured rows alone exceed what a worker holds on its device."""
        if self.row_limit is not None and captures:
            rows = len(ids) + new_tokens
            limit, dtype = self.row_limit, self.engine.dtype
            info = self.info
            check_request(info.widths, info.d_model, captures, rows, dtype, limit, self.backend)

    def steer_specs(
        self, steering: SteeringArg, prompt_ids: Sequence[int]
    ) -> tuple[SteerSpec, ...]:
        """The write specs the workers register: each address admitted (`ie_core.admission`:
        writable here, of its width, its ops' values within the activations' dtype, the same
        checks as eager's), its positions in this prompt."""
        special = self.tokenizer.all_special_ids
        specs: list[SteerSpec] = []
        for w in admit_writes(steering, self, self.engine.dtype):
            masked = mask_positions(w.spec.mask, prompt_ids, special)
            until = len(prompt_ids) if w.spec.mask.prefill_only else None
            specs.append(SteerSpec(w.site, w.spec.ops, tuple(sorted(masked)), until))
        self.policy.check_steering(tuple(specs))
        return tuple(specs)

    def check_spec(self, spec: Steering) -> None:
        if any(op.kind == "hook" for op in spec.ops):
            raise UnsupportedOperationError(
                f"a Hook at {spec.point} runs a Python function, and backend {self.backend!r} "
                "runs its forward in vLLM's worker processes, where ie-vllm does not ship "
                "your callables (they would run outside this process's state and locks); "
                "express the intervention as ops (Patch, Scale, Additive, ...), which every "
                "backend runs, or use backend='eager' for your own hooks"
            )

    def writable_site(self, address: Address) -> tuple[str, int]:
        text = self.check(address)
        if not self.policy.can_write(text):
            raise SteeringSpecError(
                f"{text} cannot be written on backend {self.backend!r}: {self.write_reason(text)}"
            )
        return text, self.info.widths[text]

    def readable_site(self, address: str) -> tuple[str, int]:
        text = self.check(address)
        return text, self.info.widths[text]

    def write_reason(self, address: str) -> str:
        point = get_point(to_address(address).name)
        if not point.writable:
            return f"{point.name} is a capture-only point"
        return self.policy.write_reason(address)

    def _to_tokens(self, text: str) -> list[int]:
        return list(self.tokenizer(text, add_special_tokens=True)["input_ids"])
