"""A tiny InterpModel written for the harness tests: deterministic torch math, no engine.

Flags turn on the failure modes the harness must classify: refusing capture (like vllm-generate),
returning short captures, ignoring steering, and a lens top-k that disagrees with the full read-out.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Sequence
from typing import Any

import torch
from ie_core.cache import ActivationCache
from ie_core.errors import UnsupportedOperationError
from ie_core.grammar import to_address
from ie_core.ops import Additive
from ie_core.protocol import (
    Generation,
    GenerationCapture,
    SamplingParams,
    StreamChunk,
    TopK,
    steering_tuple,
)

VOCAB = 97
DEFAULT_SAMPLING = SamplingParams()


class FakeModel:
    backend = "fake"
    model_id = "fake/model"

    def __init__(
        self,
        *,
        refuse_capture: bool = False,
        short_capture: bool = False,
        ignore_steering: bool = False,
        wrong_topk: bool = False,
    ) -> None:
        self.refuse_capture = refuse_capture
        self.short_capture = short_capture
        self.ignore_steering = ignore_steering
        self.wrong_topk = wrong_topk
        gen = torch.Generator().manual_seed(1)
        self.embed = torch.randn(VOCAB, 8, generator=gen)
        self.unembed = torch.randn(8, VOCAB, generator=gen)
        self.dtype = torch.float32

    n_layers = 4
    d_model = 8

    def to_tokens(self, text: str, *, prepend_bos: bool | None = None) -> list[int]:
        ids = [3 + (sum(map(ord, w)) % (VOCAB - 3)) for w in text.split()]
        return ([1] if prepend_bos is not False else []) + ids  # its own BOS, as True gives

    def to_string(self, ids: Sequence[int]) -> str:
        return " ".join(f"t{i}" for i in ids)

    def _hidden(self, ids: Sequence[int], layer: int, steering: Any) -> torch.Tensor:
        h = self.embed[torch.tensor(list(ids))] * (layer + 1)
        for spec in steering_tuple(steering):
            if layer in spec.layers and not self.ignore_steering:
                for op in spec.ops:
                    assert isinstance(op, Additive), "the fake model applies additive ops only"
                    h = h + op.coeff * torch.as_tensor(op.vector, dtype=torch.float32)
        return h.unsqueeze(0)

    def _refuse(self) -> None:
        if self.refuse_capture:
            raise UnsupportedOperationError("fake-generate cannot capture; use backend='fake'")

    async def capture(
        self, tokens: Any, addresses: Sequence[Any], *, steering: Any = None
    ) -> ActivationCache:
        self._refuse()
        await asyncio.sleep(0)
        ids = list(tokens)[:-1] if self.short_capture else list(tokens)
        return ActivationCache(
            {a: self._hidden(ids, to_address(a).layer or 0, steering) for a in addresses}
        )

    def _next_ids(self, tokens: Sequence[int], n: int) -> list[int]:
        return [(sum(tokens) + 7 * i) % VOCAB for i in range(n)]

    async def generate(
        self, tokens: Any, sampling: SamplingParams = DEFAULT_SAMPLING, *, steering: Any = None
    ) -> Generation:
        await asyncio.sleep(0.001)
        out = self._next_ids(tokens, sampling.max_new_tokens)
        return Generation(tuple(tokens), tuple(out), self.to_string(out))

    async def generate_stream(
        self, tokens: Any, sampling: SamplingParams = DEFAULT_SAMPLING, *, steering: Any = None
    ) -> AsyncIterator[StreamChunk]:
        for t in self._next_ids(tokens, sampling.max_new_tokens):
            await asyncio.sleep(0.001)
            yield StreamChunk(t, f"t{t}")

    async def capture_generation(
        self,
        tokens: Any,
        addresses: Sequence[Any],
        sampling: SamplingParams = DEFAULT_SAMPLING,
        *,
        steering: Any = None,
    ) -> GenerationCapture:
        self._refuse()
        gen = await self.generate(tokens, sampling)
        cache = await self.capture(
            list(tokens) + list(gen.token_ids[:-1]), addresses, steering=steering
        )
        return GenerationCapture(gen, cache)

    async def decode_residuals(self, rows: Any) -> torch.Tensor:
        return torch.as_tensor(rows).float() @ self.unembed

    async def decode_residuals_topk(self, rows: Any, k: int = 10) -> TopK:
        logits = await self.decode_residuals(rows)
        probs = torch.softmax(logits, -1)
        top = torch.topk(probs, k, dim=-1)
        ids = top.indices.flip(-1) if self.wrong_topk else top.indices
        return TopK(ids, probs.gather(1, ids))

    async def warmup(self) -> None:
        return None

    async def shutdown(self) -> None:
        return None
