"""A request as one value: what to run (capture, generate, or both), on which prompt, reading which
addresses, reducing which rows where they live (`ie_core.reduce`), under which steering. `ModelFront` turns every protocol call into a `Plan`; a backend
executes plans; over HTTP the plan's JSON is the request body, written and read here alone.

Prompts stay as the caller gave them (text, ids, rows of ids): the executor owns the tokenizer
(a remote one lives on the server). An embedded prompt (`ie_core.embedded`) is lowered here to
its ids and a write of its vectors, so every executor runs it as a token prompt. Addresses stay
as given too: each backend resolves them.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, cast

from ie_core.cache import ActivationCache
from ie_core.embedded import EMBEDDINGS, lowered
from ie_core.errors import SteeringSpecError, UnsupportedOperationError
from ie_core.grammar import AddressLike, to_address
from ie_core.lora import LoraError, LoraSpec, lora_from_wire
from ie_core.ops import Steering
from ie_core.protocol import Generation, SamplingParams, SteeringArg, steering_tuple
from ie_core.reduce.base import Reduction
from ie_core.reduce.kinds import reduction_from_dict
from ie_core.reduce.lens_topk import LensTopK
from ie_core.wire import (
    sampling_from_wire,
    sampling_to_wire,
    steering_from_wire,
    steering_to_wire,
)

__all__ = [
    "CAPTURE",
    "CAPTURE_GENERATION",
    "DECODE",
    "GENERATE",
    "KINDS",
    "Outcome",
    "Plan",
    "PlanWireError",
    "plain_prompt",
]

CAPTURE = "capture"  # one forward over a batch of prompts, reading addresses
GENERATE = "generate"  # sampled tokens (run whole, or streamed token by token)
CAPTURE_GENERATION = "capture_generation"  # generate, reading over prompt + generated[:-1]
# Residual rows (the plan's prompt, `[..., d_model]`) through the model's lens, in no forward:
# full logits (`Outcome.reduced[DECODE]["logits"]`), or a `LensTopK` reduction's top-k.
DECODE = "decode_residuals"
KINDS = (CAPTURE, GENERATE, CAPTURE_GENERATION, DECODE)


class PlanWireError(ValueError):
    """A plan's JSON lacks a field or holds one of the wrong type (HTTP 400)."""


@dataclass(frozen=True)
class Plan:
    """One request. `prompt` is a batch for CAPTURE and a single prompt otherwise."""

    kind: str
    prompt: Any
    captures: tuple[AddressLike, ...] = ()
    steering: tuple[Steering, ...] = ()
    sampling: SamplingParams | None = None
    grad: bool = False
    # CAPTURE only: each prompt's own steering, after the shared `steering` (one entry a prompt).
    row_steering: tuple[tuple[Steering, ...], ...] = ()
    # Rows reduced where they live: CAPTURE (`Outcome.reduced` holds each label's outputs) and
    # GENERATE streamed (each `StreamChunk.reduced`, the rows computed since the previous token).
    reductions: tuple[Reduction, ...] = ()
    # The LoRA adapter every prompt runs under (`ie_core.lora`), or None: the base model.
    lora: LoraSpec | None = None
    # CAPTURE only: each prompt's own adapter or None (one entry a prompt), instead of `lora`.
    row_lora: tuple[LoraSpec | None, ...] = ()

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise ValueError(f"unknown plan kind {self.kind!r}; known: {', '.join(KINDS)}")
        _check_lora(self)
        if self.kind == DECODE:
            _check_decode(self)
        elif self.reductions and self.kind not in (CAPTURE, GENERATE):
            raise ValueError("reductions ride a capture plan or a streamed generate plan")
        labels = [r.label for r in self.reductions]
        if len(set(labels)) != len(labels):
            raise ValueError(f"reduction labels must differ, got {labels}")
        unsampled = self.kind in (CAPTURE, DECODE)
        if (self.sampling is None) != unsampled:
            raise ValueError(f"a {self.kind} plan {'takes no' if unsampled else 'needs'} sampling")
        _lower_embedded(self)

    @classmethod
    def of(
        cls,
        kind: str,
        prompt: Any,
        captures: Sequence[AddressLike] | AddressLike = (),
        steering: SteeringArg = None,
        sampling: SamplingParams | None = None,
        grad: bool = False,
        row_steering: Sequence[SteeringArg] | None = None,
        reductions: Sequence[Reduction] = (),
        lora: LoraSpec | None = None,
        row_lora: Sequence[LoraSpec | None] | None = None,
    ) -> Plan:
        """A plan from protocol arguments: one address may be given bare, steering as one spec."""
        listed = (captures,) if isinstance(captures, str) else tuple(cast(Any, captures))
        rows = tuple(steering_tuple(s) for s in row_steering or ())
        steer = steering_tuple(steering)
        adapters = tuple(row_lora or ())
        return cls(
            kind, prompt, listed, steer, sampling, grad, rows, tuple(reductions), lora, adapters
        )

    def lora_of(self, row: int) -> LoraSpec | None:
        """Prompt `row`'s adapter: its own where `row_lora` is given, else the shared one."""
        return self.row_lora[row] if self.row_lora else self.lora

    def adapters(self) -> tuple[LoraSpec, ...]:
        """Every adapter the plan names, once each."""
        named = [a for a in (self.lora, *self.row_lora) if a is not None]
        return tuple(dict.fromkeys(named))

    def refuse_streamed_reductions(self) -> None:
        """A GENERATE plan's reductions are per generated token, carried only by its stream
        (`execute_stream`); a backend running it whole refuses them rather than drop them."""
        if self.reductions and self.kind == GENERATE:
            raise UnsupportedOperationError(
                "a generate plan's reductions are per generated token; stream it "
                "(execute_stream, ModelFront.reduce_stream), or reduce a capture plan"
            )

    def steering_of(self, row: int) -> tuple[Steering, ...]:
        """Prompt `row`'s steering: the shared specs, then its own."""
        return self.steering + (self.row_steering[row] if self.row_steering else ())

    def with_prompt(self, prompt: Any) -> Plan:
        """The same plan on a normalised prompt (token ids, once the executor has tokenized)."""
        return replace(self, prompt=prompt)

    # --- the HTTP body -----------------------------------------------------------------------

    def to_wire(self) -> dict[str, Any]:
        """The JSON body of the plan's route (`ie_core.wire.ROUTES[kind]`, or generate_stream)."""
        body: dict[str, Any] = {_prompt_field(self.kind): plain_prompt(self.prompt)}
        if self.kind != GENERATE:
            body["addresses"] = [str(to_address(a)) for a in self.captures]
        if self.sampling is not None:
            body["sampling"] = sampling_to_wire(self.sampling)
        body["steering"] = steering_to_wire(self.steering)
        if self.row_steering:
            body["row_steering"] = [steering_to_wire(s) for s in self.row_steering]
        if self.reductions:
            body["reductions"] = [r.to_wire() for r in self.reductions]
        if self.lora is not None:
            body["lora"] = self.lora.to_wire()
        if self.row_lora:
            body["row_lora"] = [None if a is None else a.to_wire() for a in self.row_lora]
        return body

    @classmethod
    def from_wire(
        cls,
        kind: str,
        data: Any,
        resolve: Callable[[list[Any]], list[Any]] = lambda specs: specs,
    ) -> Plan:
        """A plan from its JSON body; `resolve` rewrites the raw steering specs first (a server
        turns the dictionary features it serves by name into ops)."""
        if not isinstance(data, dict):
            raise PlanWireError("the request body must be a JSON object")
        prompt = _field(data, _prompt_field(kind), (list, str, dict))
        captures: tuple[str, ...] = ()
        if kind != GENERATE:
            addresses = _field(data, "addresses", list)
            if not all(isinstance(a, str) for a in addresses):
                raise PlanWireError("'addresses' must be a list of strings such as 'resid_post.3'")
            captures = tuple(addresses)
        sampling = None if kind == CAPTURE else sampling_from_wire(data.get("sampling"))
        steering = steering_from_wire(resolve(data.get("steering") or []))
        rows = data.get("row_steering") or []
        if rows and (not isinstance(rows, list) or kind != CAPTURE):
            raise PlanWireError(
                "'row_steering' is a list (one steering list per prompt) of capture"
            )
        row_steering = tuple(steering_from_wire(resolve(r or [])) for r in rows)
        reductions = _reductions(data.get("reductions") or [])
        lora, row_lora = _lora_fields(data)
        return cls(
            kind, prompt, captures, steering, sampling, False, row_steering, reductions, lora,
            row_lora,
        )  # fmt: skip


@dataclass(frozen=True)
class Outcome:
    """What executing a plan returned: the generation (GENERATE kinds), the cache (reads), and
    per reduction label its outputs (`ie_core.reduce.host.Reduced`)."""

    generation: Generation | None = None
    cache: ActivationCache | None = None
    reduced: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)


def _lower_embedded(plan: Plan) -> None:
    """An embedded prompt (`ie_core.embedded`) as ids and the write of its vectors, which runs
    before the plan's other steering: shared for one prompt, the row's own in a batch. A decode
    plan's prompt is residual rows, never a prompt of tokens."""
    if plan.kind == DECODE:
        return
    single = plan.kind != CAPTURE or not isinstance(plan.prompt, list | tuple)
    if single:
        ids, write = lowered(plan.prompt)
        if write is not None:
            prompt = ids if plan.kind != CAPTURE else [ids]
            object.__setattr__(plan, "prompt", prompt)
            object.__setattr__(plan, "steering", (write, *plan.steering))
        return
    rows = [lowered(p) for p in plan.prompt]
    if all(write is None for _, write in rows):
        return
    if any(s.point == EMBEDDINGS for s in plan.steering):
        raise SteeringSpecError(
            "a batch with embedded prompts writes each row's vectors at 'embeddings' first; "
            "steering every row there too would run after them: give that steering per row "
            "(row_steering) or steer another point"
        )
    own = plan.row_steering or tuple(() for _ in rows)
    if len(own) != len(rows):
        raise SteeringSpecError(
            f"{len(own)} row steerings for {len(rows)} prompts; give one per prompt"
        )
    object.__setattr__(plan, "prompt", [ids for ids, _ in rows])
    object.__setattr__(
        plan,
        "row_steering",
        tuple(((w,) if w else ()) + tuple(r) for (_, w), r in zip(rows, own, strict=True)),
    )


def _reductions(data: Any) -> tuple[Reduction, ...]:
    if not isinstance(data, list):
        raise PlanWireError("'reductions' is a list of {address, label, last, reducer} objects")
    try:
        return tuple(reduction_from_dict(r) for r in data)
    except ValueError as exc:
        raise PlanWireError(str(exc)) from None


def _lora_fields(data: dict[str, Any]) -> tuple[LoraSpec | None, tuple[LoraSpec | None, ...]]:
    rows = data.get("row_lora") or []
    if not isinstance(rows, list):
        raise PlanWireError("'row_lora' is a list (one adapter or null per prompt)")
    try:
        return lora_from_wire(data.get("lora")), tuple(lora_from_wire(r) for r in rows)
    except LoraError as exc:
        raise PlanWireError(str(exc)) from None


def _check_lora(plan: Plan) -> None:
    """Adapters run on the model's forwards: none on a decode; per-prompt ones on a capture,
    one each, and not beside a shared one; one name, one folder."""
    if plan.row_lora and (plan.kind != CAPTURE or plan.lora is not None):
        raise ValueError("'row_lora' rides a capture plan, instead of 'lora'")
    if plan.kind == DECODE and plan.lora is not None:
        raise ValueError("a decode plan runs no forward: no LoRA adapter")
    folders: dict[str, str] = {}
    for a in plan.adapters():
        if folders.setdefault(a.name, a.path) != a.path:
            raise LoraError(f"LoRA adapter name {a.name!r} names two folders in one plan")


def _check_decode(plan: Plan) -> None:
    """A decode plan reads given rows: no addresses, no steering, at most one `LensTopK`."""
    if plan.captures or plan.steering or plan.row_steering:
        raise ValueError("a decode plan reads the rows it is given: no addresses or steering")
    if len(plan.reductions) > 1 or any(
        not isinstance(r.reducer, LensTopK) for r in plan.reductions
    ):
        raise ValueError("a decode plan reduces its rows by one LensTopK at most")


def _prompt_field(kind: str) -> str:
    return "prompts" if kind == CAPTURE else "prompt"


def _field(data: dict[str, Any], name: str, kind: type | tuple[type, ...]) -> Any:
    if name not in data:
        raise PlanWireError(f"the request lacks the field {name!r}")
    value = data[name]
    if not isinstance(value, kind):
        raise PlanWireError(f"{name!r} has the wrong type ({type(value).__name__})")
    return value


def plain_prompt(value: Any) -> Any:
    """Prompts as JSON: tensors and arrays become lists; the receiver normalises the rest."""
    if hasattr(value, "tolist"):
        return value.tolist()
    if isinstance(value, str | int):
        return value
    if isinstance(value, dict):
        return value
    return [plain_prompt(v) for v in value]
