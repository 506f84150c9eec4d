"""`SyncModel`, the blocking mirror of a model for scripts and notebooks, and `ModelLike`: what
every public free function accepts (a model or its mirror)."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any

from ie_core.active_steering import with_active
from ie_core.cache import ActivationCache
from ie_core.grammar import AddressLike
from ie_core.protocol import (
    Generation,
    GenerationCapture,
    InterpModel,
    Prompt,
    StreamChunk,
    TopK,
    sampling_keywords,
)
from ie_core.runner import iterate, run
from ie_core.tl_shaped import TLShaped


class SyncModel(TLShaped):
    """Synchronous mirror of an InterpModel: the same methods, blocking, for scripts and notebooks.

    TransformerLens-shaped conveniences come from `TLShaped` (`model(ids)` -> logits,
    `run_with_cache` -> `(logits, cache)`, `to_str_tokens`, ...; see `ie_core.tl_shaped`).

    Coroutines run on ie-core's background event loop (see `runner`), so this also works inside
    Jupyter, whose own loop is already running. Steering active through `ie_core.steer` (on this
    mirror or on the model it wraps) applies here as it does to the free functions.
    """

    def __init__(self, model: InterpModel) -> None:
        self.model = model

    @property
    def mirrors(self) -> InterpModel:
        """The model this mirrors (its steering context is the model's)."""
        return self.model

    def __getattr__(self, name: str) -> Any:
        return getattr(self.model, name)

    def _steering(self, kw: dict[str, Any]) -> dict[str, Any]:
        return {**kw, "steering": with_active(self.model, kw.get("steering"))}

    def capture(self, tokens: Any, addresses: Sequence[AddressLike], **kw: Any) -> ActivationCache:
        return run(self.model.capture(tokens, addresses, **self._steering(kw)))

    def capture_generation(
        self, tokens: Prompt, addresses: Sequence[AddressLike], *args: Any, **kw: Any
    ) -> GenerationCapture:
        args, kw = sampling_keywords(args, kw)
        return run(self.model.capture_generation(tokens, addresses, *args, **self._steering(kw)))

    def capture_attention(
        self, tokens: Prompt, layers: Sequence[int] | None = None
    ) -> ActivationCache:
        return run(self.model.capture_attention(tokens, layers))

    def generate(self, tokens: Prompt, *args: Any, **kw: Any) -> Generation:
        """As the model's `generate`; sampling fields may also be keywords (`max_new_tokens=5`)."""
        args, kw = sampling_keywords(args, kw)
        return run(self.model.generate(tokens, *args, **self._steering(kw)))

    def generate_stream(self, tokens: Prompt, *args: Any, **kw: Any) -> Iterator[StreamChunk]:
        args, kw = sampling_keywords(args, kw)
        return iterate(self.model.generate_stream(tokens, *args, **self._steering(kw)))

    def decode_residuals(self, rows: Any) -> Any:
        return run(self.model.decode_residuals(rows))

    def decode_residuals_topk(self, rows: Any, k: int = 10) -> TopK:
        return run(self.model.decode_residuals_topk(rows, k))

    def final_token_logits(self, prompts: Any, steerings: Any, token_ids: Any) -> Any:
        return run(self.model.final_token_logits(prompts, steerings, token_ids))

    def probe_scores(self, tokens: Any, address: AddressLike, weight: Any, **kw: Any) -> Any:
        return run(self.model.probe_scores(tokens, address, weight, **self._steering(kw)))

    def dictionary_features(self, tokens: Any, saes: Any, **kw: Any) -> Any:
        return run(self.model.dictionary_features(tokens, saes, **self._steering(kw)))

    def warmup(self) -> None:
        run(self.model.warmup())

    def shutdown(self) -> None:
        run(self.model.shutdown())


ModelLike = InterpModel | SyncModel
"""What every public free function accepts: the async model or its blocking mirror."""


def unwrap(model: ModelLike) -> InterpModel:
    """The async model behind a `SyncModel` (or the model itself): every free function starts here,
    so `f(SyncModel(m), ...)` and `f(m, ...)` run the same coroutines."""
    return model.model if isinstance(model, SyncModel) else model


__all__ = ["ModelLike", "SyncModel", "unwrap"]
