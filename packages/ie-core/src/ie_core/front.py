"""`ModelFront`: the protocol's request methods written once, over a backend's executor.

Each call (capture, capture_attention, capture_generation, generate, generate_stream) becomes a
`Plan`; a backend subclasses the front and supplies `execute` (run a plan whole), `execute_stream`
(a GENERATE plan token by token) and `attention_layers` (a fact). The rest of `InterpModel`
(tokens, points, the lens, lifecycle) is the backend's own, as httpx leaves I/O to a transport.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Sequence
from typing import Any

from ie_core.cache import ActivationCache
from ie_core.grammar import AddressLike
from ie_core.plan import CAPTURE, CAPTURE_GENERATION, GENERATE, Outcome, Plan
from ie_core.protocol import (
    Generation,
    GenerationCapture,
    Prompt,
    SamplingParams,
    SteeringArg,
    StreamChunk,
    renamed_sampling,
    sampling_params,
)
from ie_core.tl_weights import TLFacts

__all__ = ["ModelFront"]

_GREEDY = SamplingParams()


class ModelFront(TLFacts):
    """The request half of `InterpModel`, the same on every backend (and, from `TLFacts`,
    `model.cfg` and the weights by TransformerLens's names)."""

    # --- what a backend supplies ---------------------------------------------------------------

    async def execute(self, plan: Plan) -> Outcome:
        """Run `plan` to its end; refuse what this backend cannot do, before any forward."""
        raise NotImplementedError

    def execute_stream(self, plan: Plan) -> AsyncIterator[StreamChunk]:
        """Run a GENERATE plan, yielding each token as it is sampled."""
        raise NotImplementedError

    def attention_layers(self) -> Sequence[int]:
        """The layers `capture_attention()` reads when none are named."""
        raise NotImplementedError

    # --- the protocol's requests ---------------------------------------------------------------

    async def capture(
        self,
        tokens: Prompt | Sequence[Sequence[int]],
        addresses: Sequence[AddressLike],
        *,
        steering: SteeringArg = None,
        grad: bool = False,
        row_steering: Sequence[SteeringArg] | None = None,
    ) -> ActivationCache:
        """Activations at `addresses` as `[batch, seq, ...]` (attention `[batch, heads, q, k]`).

        `steering` applies to every prompt; `row_steering` (one entry a prompt) adds each prompt's
        own, so one call runs many configurations (a patching sweep's cells) in one batch.
        `grad=True` keeps the autograd graph where the backend has one (eager)."""
        plan = Plan.of(CAPTURE, tokens, addresses, steering, None, grad, row_steering)
        outcome = await self.execute(plan)
        assert outcome.cache is not None
        return outcome.cache

    async def capture_attention(
        self, tokens: Prompt, layers: Sequence[int] | None = None
    ) -> ActivationCache:
        """Attention probabilities `[batch, heads, q, k]` at `layers` (default: every served one)."""
        chosen = self.attention_layers() if layers is None else layers
        return await self.capture(tokens, [f"attn_probs.{layer}" for layer in chosen])

    async def generate(
        self,
        tokens: Prompt,
        sampling: SamplingParams = _GREEDY,
        *,
        steering: SteeringArg = None,
        sampling_params: SamplingParams | None = None,
    ) -> Generation:
        plan = Plan.of(GENERATE, tokens, (), steering, _sampling(sampling, sampling_params))
        outcome = await self.execute(plan)
        assert outcome.generation is not None
        return outcome.generation

    async def generate_stream(
        self,
        tokens: Prompt,
        sampling: SamplingParams = _GREEDY,
        *,
        steering: SteeringArg = None,
        sampling_params: SamplingParams | None = None,
    ) -> AsyncIterator[StreamChunk]:
        plan = Plan.of(GENERATE, tokens, (), steering, _sampling(sampling, sampling_params))
        stream = self.execute_stream(plan)
        try:
            async for chunk in stream:
                yield chunk
        finally:
            await _close(stream)  # an abandoned stream aborts its request now, not at GC

    async def capture_generation(
        self,
        tokens: Prompt,
        addresses: Sequence[AddressLike],
        sampling: SamplingParams = _GREEDY,
        *,
        steering: SteeringArg = None,
        sampling_params: SamplingParams | None = None,
    ) -> GenerationCapture:
        """Generate, reading `addresses` over prompt + generated[:-1]."""
        sampling = _sampling(sampling, sampling_params)
        plan = Plan.of(CAPTURE_GENERATION, tokens, addresses, steering, sampling)
        outcome = await self.execute(plan)
        assert outcome.generation is not None and outcome.cache is not None
        return GenerationCapture(outcome.generation, outcome.cache)


def _sampling(sampling: SamplingParams, old: SamplingParams | None) -> SamplingParams:
    return sampling_params(renamed_sampling(sampling, old, _GREEDY))


async def _close(stream: Any) -> None:
    aclose = getattr(stream, "aclose", None)
    if aclose is not None:
        await aclose()
