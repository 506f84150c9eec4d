"""`ModelFront`: the protocol's request methods written once, over a backend's executor.

Each call (capture, capture_attention, capture_generation, generate, generate_stream, the lens on
given rows: decode_residuals, decode_residuals_topk, and the read-outs reduced where the rows
live: final_token_logits, probe_scores, dictionary_features) becomes a `Plan`; a backend subclasses the front and supplies `execute` (run a plan whole, its
reductions included), `execute_stream` (a GENERATE plan token by token) and `attention_layers` (a
fact). The streamed read-outs (`lens_generation_stream`, `dictionary_generation_stream`) are a
GENERATE plan with reductions, each step's outputs in `StreamChunk.reduced`. The rest of `InterpModel` (tokens, points,
the lens, lifecycle) is the backend's own, as httpx leaves I/O to a transport.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Mapping, Sequence
from typing import TYPE_CHECKING, Any, ClassVar, cast

from ie_core.cache import ActivationCache
from ie_core.errors import UnsupportedOperationError
from ie_core.experiments.lens_stream import LensStep
from ie_core.experiments.probes import Probe
from ie_core.grammar import AddressLike, to_address
from ie_core.lora import LoraSpec
from ie_core.plan import CAPTURE, CAPTURE_GENERATION, DECODE, GENERATE, Outcome, Plan
from ie_core.protocol import (
    Generation,
    GenerationCapture,
    Prompt,
    SamplingParams,
    SteeringArg,
    StreamChunk,
    TopK,
    renamed_sampling,
    sampling_params,
)
from ie_core.reduce import DictionaryFeatures, LensTopK, ProbeScores, Reduction, TokenLogits
from ie_core.tl_weights import TLFacts

if TYPE_CHECKING:
    from torch import Tensor

__all__ = ["ModelFront"]

_GREEDY = SamplingParams()


class ModelFront(TLFacts):
    """The request half of `InterpModel`, the same on every backend (and, from `TLFacts`,
    `model.cfg` and the weights by TransformerLens's names)."""

    # Whether a dictionary may be named by a string (`ie serve --sae NAME=SOURCE`, resolved by
    # the server: backend 'remote'); elsewhere a name is refused before any request.
    serves_named_dictionaries: ClassVar[bool] = False

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

    def point_width(self, address: AddressLike) -> int:
        """The width of `address`'s rows on this model."""
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
        lora: LoraSpec | None = None,
        row_lora: Sequence[LoraSpec | None] | None = None,
    ) -> ActivationCache:
        """Activations at `addresses` as `[batch, seq, ...]` (attention `[batch, heads, q, k]`).

        `steering` applies to every prompt; `row_steering` (one entry a prompt) adds each prompt's
        own, so one call runs many configurations (a patching sweep's cells) in one batch.
        `lora` runs every prompt under a LoRA adapter, `row_lora` each prompt under its own (or
        None: the base model). `grad=True` keeps the autograd graph where the backend has one."""
        plan = Plan.of(
            CAPTURE, tokens, addresses, steering, None, grad, row_steering, (), lora, row_lora
        )
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
        lora: LoraSpec | None = None,
    ) -> Generation:
        sampled = _sampling(sampling, sampling_params)
        plan = Plan.of(GENERATE, tokens, (), steering, sampled, lora=lora)
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
        lora: LoraSpec | None = None,
    ) -> AsyncIterator[StreamChunk]:
        sampled = _sampling(sampling, sampling_params)
        plan = Plan.of(GENERATE, tokens, (), steering, sampled, lora=lora)
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
        lora: LoraSpec | None = None,
    ) -> GenerationCapture:
        """Generate, reading `addresses` over prompt + generated[:-1]."""
        sampling = _sampling(sampling, sampling_params)
        plan = Plan.of(CAPTURE_GENERATION, tokens, addresses, steering, sampling, lora=lora)
        outcome = await self.execute(plan)
        assert outcome.generation is not None and outcome.cache is not None
        return GenerationCapture(outcome.generation, outcome.cache)

    # --- the lens on given rows (a decode plan) ------------------------------------------------

    async def decode_residuals(self, rows: Any, *, grad: bool = False) -> Tensor:
        """Logits `[..., vocab]` of residual rows `[..., d_model]` through the final norm and the
        unembed (the family's scale and softcap); `grad=True` keeps autograd where the backend
        has it (eager)."""
        return (await self.execute(Plan(DECODE, rows, grad=grad))).reduced[DECODE]["logits"]

    async def decode_residuals_topk(self, rows: Any, k: int = 10) -> TopK:
        """The lens's top-k token ids and their full-vocabulary probabilities, `[..., k]`."""
        lens = Reduction("", LensTopK(k), "lens")
        got = (await self.execute(Plan(DECODE, rows, reductions=(lens,)))).reduced["lens"]
        return TopK(got["ids"], got["probs"])

    # --- read-outs reduced where the rows live (`ie_core.reduce`) ---------------------------------

    async def reduce(
        self,
        tokens: Any,
        reductions: Sequence[Reduction],
        *,
        steering: SteeringArg = None,
        row_steering: Sequence[SteeringArg] | None = None,
    ) -> Mapping[str, Mapping[str, Tensor]]:
        """Per reduction label its outputs, over one capture plan that reads nothing else."""
        plan = Plan.of(CAPTURE, tokens, (), steering, None, False, row_steering, reductions)
        return (await self.execute(plan)).reduced

    async def final_token_logits(
        self, prompts: Sequence[Prompt], steerings: Sequence[SteeringArg], token_ids: Any
    ) -> tuple[Tensor, Tensor]:
        """For each (prompt, steering) request, the last position's logits of `token_ids`
        `[n, k]` and the logsumexp over the vocabulary `[n]`, fp32 (`TokenLogits` on the last
        layer's final row, through the model's lens)."""
        if len(steerings) != len(prompts):
            raise ValueError(
                f"{len(prompts)} prompts but {len(steerings)} steerings; give one each"
            )
        last = f"resid_post.{cast(Any, self).n_layers - 1}"
        reduction = Reduction(last, TokenLogits(tuple(token_ids)), "final", last=True)
        got = await self.reduce(list(prompts), [reduction], row_steering=list(steerings))
        return got["final"]["selected"].float(), got["final"]["lse"].float()

    async def probe_scores(
        self,
        tokens: Prompt | Sequence[Sequence[int]],
        address: AddressLike,
        weight: Any,
        bias: Any = 0.0,
        activation: str = "linear",
        *,
        steering: SteeringArg = None,
    ) -> Tensor:
        """activation(h @ weight + bias) per token of each prompt at `address`: `[batch, seq]`
        for a `[width]` weight, `[batch, seq, n]` for `[width, n]`; checked before any forward."""
        point = str(to_address(address, check=True))
        probe = Probe.build(weight, bias, activation, width=self.point_width(point), point=point)
        got = await self.reduce(tokens, [Reduction(point, ProbeScores(probe), "probe")],
                                steering=steering)  # fmt: skip
        return got["probe"]["scores"]

    async def dictionary_features(
        self,
        tokens: Prompt | Sequence[Sequence[int]],
        saes: Mapping[str, Any],
        *,
        k: int | None = None,
        stats: bool = False,
        steering: SteeringArg = None,
    ) -> dict[str, dict[str, Tensor]]:
        """Per name, its dictionary's outputs `[batch, seq, ...]` (`DictionaryFeatures`): a
        loaded `SAE`, or a served dictionary's name where the backend resolves names."""
        reductions = []
        for name, sae in saes.items():
            if isinstance(sae, str):
                if not self.serves_named_dictionaries:
                    raise UnsupportedOperationError(
                        f"{type(self).__name__} serves no named dictionaries (a name is resolved "
                        "by an `ie serve --sae NAME=SOURCE` server, backend 'remote'); load the "
                        "dictionary here with ie_core.experiments.saes.load_sae and pass the SAE"
                    )
                reducer = DictionaryFeatures(sae, k, stats)
                address = ""  # the served dictionary's own point, put there by the server
            else:
                reducer, address = DictionaryFeatures(sae.key, k, stats, sae), sae.address
            reductions.append(Reduction(address, reducer, name))
        got = await self.reduce(tokens, reductions, steering=steering)
        return {name: dict(got[name]) for name in saes}

    # --- read-outs streamed per generated token (a GENERATE plan with reductions) ------------------

    async def reduce_stream(
        self,
        tokens: Prompt,
        reductions: Sequence[Reduction],
        sampling: SamplingParams = _GREEDY,
        *,
        steering: SteeringArg = None,
    ) -> AsyncIterator[StreamChunk]:
        """Each generated token with, per reduction label, its outputs over the rows computed
        since the previous token (`StreamChunk.reduced`; the first token: the prompt's rows)."""
        plan = Plan.of(GENERATE, tokens, (), steering, sampling, False, None, reductions)
        stream = self.execute_stream(plan)
        try:
            async for chunk in stream:
                yield chunk
        finally:
            await _close(stream)

    async def lens_generation_stream(
        self,
        tokens: Prompt,
        addresses: Sequence[AddressLike],
        params: SamplingParams,
        *,
        k: int,
        transports: Mapping[str, Any],
        steering: SteeringArg = None,
    ) -> AsyncIterator[Any]:
        """Each generated token with, per address, the lens top-k of its new rows (`LensStep`),
        each row carried first by its address's transport where one is given (a Jacobian lens)."""
        points = [str(to_address(a, check=True)) for a in addresses]
        reductions = [Reduction(a, LensTopK(k, transports.get(a)), a) for a in points]
        async for chunk in self.reduce_stream(tokens, reductions, params, steering=steering):
            tops = {a: TopK(chunk.reduced[a]["ids"], chunk.reduced[a]["probs"]) for a in points}
            yield LensStep(chunk, tops)

    async def dictionary_generation_stream(
        self,
        prompt: Prompt,
        saes: Mapping[str, Any],
        params: SamplingParams,
        *,
        k: int,
        steering: SteeringArg = None,
    ) -> AsyncIterator[tuple[StreamChunk, dict[str, dict[str, Tensor]]]]:
        """Each generated token with, per name, its dictionary's top-k features (`ids`,
        `values`) of the new rows."""
        reductions = [
            Reduction(s.address, DictionaryFeatures(s.key, k, False, s), n) for n, s in saes.items()
        ]
        async for chunk in self.reduce_stream(prompt, reductions, params, steering=steering):
            yield chunk, {n: dict(chunk.reduced[n]) for n in saes}


def _sampling(sampling: SamplingParams, old: SamplingParams | None) -> SamplingParams:
    return sampling_params(renamed_sampling(sampling, old, _GREEDY))


async def _close(stream: Any) -> None:
    aclose = getattr(stream, "aclose", None)
    if aclose is not None:
        await aclose()
