"""The protocol every backend implements, and the value types it returns.

The native API is async (vLLM's engine is); `SyncModel` mirrors it for scripts and notebooks.
"""

from __future__ import annotations

import math
import numbers
import warnings
from collections.abc import AsyncIterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

from ie_core.cache import ActivationCache
from ie_core.capabilities import PointCapability
from ie_core.errors import SamplingParamsError, SteeringSpecError
from ie_core.grammar import AddressLike
from ie_core.logprobs import StepLogprobs, check_logprobs
from ie_core.lora import LoraSpec
from ie_core.ops import Steering

# Re-exported: backends import the one prompt normaliser from the protocol module.
from ie_core.prompts import Prompt as Prompt
from ie_core.prompts import prompt_batch as prompt_batch
from ie_core.prompts import prompt_ids as prompt_ids


@dataclass(frozen=True)
class SamplingParams:
    """Greedy by default; `temperature > 0` samples, optionally restricted by top-k / top-p.

    `logprobs=k` (opt-in) adds per-step logprobs to the result: the chosen token's and the top-k's
    (see ie_core.logprobs for what every backend reports)."""

    max_new_tokens: int = 32
    temperature: float = 0.0
    top_k: int = 0
    top_p: float = 1.0
    seed: int | None = None
    stop_at_eos: bool = True
    logprobs: int | None = None

    def __post_init__(self) -> None:
        check_logprobs(self.logprobs)
        _int_field(self.max_new_tokens, "max_new_tokens", 1)
        _int_field(self.top_k, "top_k", 0, "(0 = off)")
        temperature = _real_field(self.temperature, "temperature")
        if temperature < 0:
            raise SamplingParamsError(f"temperature must be >= 0 (0 = greedy), got {temperature}")
        top_p = _real_field(self.top_p, "top_p")
        if not 0 < top_p <= 1:
            raise SamplingParamsError(f"top_p must be in (0, 1] (1 = off), got {top_p}")
        if self.seed is not None:
            _int_field(self.seed, "seed", 0)
            if self.seed >= 2**63:
                raise SamplingParamsError(f"seed must be below 2**63, got {self.seed}")
        if not isinstance(self.stop_at_eos, bool):
            raise SamplingParamsError(
                f"stop_at_eos must be True or False, got {self.stop_at_eos!r}"
            )
        object.__setattr__(self, "temperature", temperature)
        object.__setattr__(self, "top_p", top_p)

    @property
    def greedy(self) -> bool:
        return self.temperature == 0


def _int_field(value: Any, label: str, low: int, note: str = "") -> None:
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise SamplingParamsError(
            f"{label} must be an int, got {type(value).__name__} {value!r}; strings and floats "
            "are not converted"
        )
    if value < low:
        raise SamplingParamsError(
            f"{label} must be >= {low} {note}, got {value}".replace("  ", " ")
        )


def _real_field(value: Any, label: str) -> float:
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise SamplingParamsError(f"{label} must be a number, got {type(value).__name__} {value!r}")
    if not math.isfinite(value):
        raise SamplingParamsError(f"{label} must be finite, got {value}")
    return float(value)


def sampling_params(value: Any) -> SamplingParams:
    """`value` if it is a SamplingParams; anything else is refused with how to build one."""
    if not isinstance(value, SamplingParams):
        raise SamplingParamsError(
            f"sampling parameters must be a SamplingParams, got {type(value).__name__} "
            f"{value!r}; pass SamplingParams(max_new_tokens=..., temperature=...)"
        )
    return value


def renamed_sampling(
    sampling: SamplingParams, old: SamplingParams | None, default: SamplingParams
) -> SamplingParams:
    """`sampling=` is every backend's name; `sampling_params=` (eager's old name) still works,
    with a DeprecationWarning, so a keyword call means the same on every backend."""
    if old is None:
        return sampling
    if sampling is not default:
        raise TypeError("pass the sampling parameters once, as sampling= (not sampling_params=)")
    warnings.warn(
        "sampling_params= is deprecated; pass sampling= (the protocol's name on every backend)",
        DeprecationWarning,
        stacklevel=3,
    )
    return old


@dataclass(frozen=True)
class Generation:
    prompt_ids: tuple[int, ...]
    token_ids: tuple[int, ...]
    text: str
    # One entry per generated token when `SamplingParams(logprobs=k)` asked; else None.
    logprobs: tuple[StepLogprobs, ...] | None = field(default=None, compare=False)


@dataclass(frozen=True)
class StreamChunk:
    """One generated token as it arrives; `reduced`: per reduction label of a streamed plan, its
    outputs over the rows computed since the previous token (the first token: the prompt's)."""

    token_id: int
    text: str
    logprobs: StepLogprobs | None = field(default=None, compare=False)
    reduced: Mapping[str, Mapping[str, Any]] = field(
        default_factory=dict, compare=False, repr=False
    )


@dataclass(frozen=True)
class GenerationCapture:
    """Generated tokens plus activations over prompt + generated[:-1] (one row per position)."""

    generation: Generation
    cache: ActivationCache = field(compare=False)


@dataclass(frozen=True)
class TopK:
    """Top-k token ids and probabilities (full-vocab softmax) per row: both `[rows, k]`."""

    ids: Any
    probs: Any


_SAMPLING_FIELDS = frozenset(SamplingParams.__dataclass_fields__)


def sampling_keywords(
    args: tuple[Any, ...], kw: dict[str, Any]
) -> tuple[tuple[Any, ...], dict[str, Any]]:
    """`generate(p, max_new_tokens=5)` as the free functions take it: the SamplingParams fields
    among `kw` become `sampling=`; mixing them with a SamplingParams is refused."""
    fields = {k: kw.pop(k) for k in list(kw) if k in _SAMPLING_FIELDS}
    if not fields:
        return args, kw
    if args or "sampling" in kw:
        raise SamplingParamsError(
            f"pass either a SamplingParams or its fields as keywords, not both ({', '.join(fields)})"
        )
    return args, {**kw, "sampling": SamplingParams(**fields)}


SteeringArg = Steering | Sequence[Steering] | None


def steering_tuple(steering: SteeringArg) -> tuple[Steering, ...]:
    if steering is None:
        return ()
    if isinstance(steering, Steering):
        return (steering,)
    items = tuple(steering)
    for s in items:
        if not isinstance(s, Steering):
            raise SteeringSpecError(f"expected Steering specs, got {type(s).__name__}")
    return items


@runtime_checkable
class InterpModel(Protocol):
    """What every backend offers. Tokens are plain int sequences; tensors are torch tensors."""

    backend: str
    model_id: str

    @property
    def n_layers(self) -> int: ...
    @property
    def d_model(self) -> int: ...

    def to_tokens(self, text: str, *, prepend_bos: bool | None = None) -> list[int]: ...
    def to_string(self, ids: Sequence[int]) -> str: ...
    def apply_chat_template(
        self, messages: Sequence[dict[str, str]], *, add_generation_prompt: bool = True
    ) -> str: ...
    def points(self) -> tuple[str, ...]: ...
    def point_width(self, address: AddressLike) -> int: ...
    def capabilities(self) -> dict[str, PointCapability]:
        """Per point name: served layers, writability and the backend's own refusal reason."""
        ...

    async def capture(
        self,
        tokens: Prompt | Sequence[Sequence[int]],
        addresses: Sequence[AddressLike],
        *,
        steering: SteeringArg = None,
        grad: bool = False,
        row_steering: Sequence[SteeringArg] | None = None,
        lora: LoraSpec | None = None,
        row_lora: Sequence[LoraSpec | None] | None = None,
    ) -> ActivationCache: ...
    async def capture_generation(
        self,
        tokens: Prompt,
        addresses: Sequence[AddressLike],
        sampling: SamplingParams = SamplingParams(),
        *,
        steering: SteeringArg = None,
        lora: LoraSpec | None = None,
    ) -> GenerationCapture: ...
    async def capture_attention(
        self, tokens: Prompt, layers: Sequence[int] | None = None
    ) -> ActivationCache: ...
    async def generate(
        self,
        tokens: Prompt,
        sampling: SamplingParams = SamplingParams(),
        *,
        steering: SteeringArg = None,
        lora: LoraSpec | None = None,
    ) -> Generation: ...
    def generate_stream(
        self,
        tokens: Prompt,
        sampling: SamplingParams = SamplingParams(),
        *,
        steering: SteeringArg = None,
        lora: LoraSpec | None = None,
    ) -> AsyncIterator[StreamChunk]: ...
    async def decode_residuals(self, rows: Any) -> Any: ...
    async def decode_residuals_topk(self, rows: Any, k: int = 10) -> TopK: ...
    # Read-outs reduced where the rows live (`ie_core.front.ModelFront`, `ie_core.reduce`).
    async def final_token_logits(
        self, prompts: Sequence[Prompt], steerings: Sequence[SteeringArg], token_ids: Any
    ) -> tuple[Any, Any]: ...
    async def probe_scores(
        self,
        tokens: Prompt | Sequence[Sequence[int]],
        address: AddressLike,
        weight: Any,
        bias: Any = 0.0,
        activation: str = "linear",
        *,
        steering: SteeringArg = None,
    ) -> Any: ...
    async def dictionary_features(
        self,
        tokens: Prompt | Sequence[Sequence[int]],
        saes: Any,
        *,
        k: int | None = None,
        stats: bool = False,
        steering: SteeringArg = None,
    ) -> dict[str, dict[str, Any]]: ...
    def lens_generation_stream(
        self, tokens: Prompt, addresses: Any, params: SamplingParams, **kw: Any
    ) -> AsyncIterator[Any]: ...
    def dictionary_generation_stream(
        self, prompt: Prompt, saes: Any, params: SamplingParams, **kw: Any
    ) -> AsyncIterator[Any]: ...
    async def warmup(self) -> None: ...
    async def shutdown(self) -> None: ...
