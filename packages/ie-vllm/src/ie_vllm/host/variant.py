"""The vLLM executor variants ie-vllm loads, and what each serves, decided once at load.

`vllm` runs eagerly with the worker extension's hooks: every servable point, chosen per request.
`vllm-generate` runs vLLM untouched (its compiled forward, no hooks), so it serves no point: every
capture, steer, lens stream and dictionary read-out is refused here, with one wording, before a
request reaches the engine. A backend built on ie-vllm's seam (ie-static's `vllm-static`) serves
points through its own worker under its own name.
"""

from __future__ import annotations

from dataclasses import dataclass

from ie_core.errors import UnsupportedOperationError

__all__ = ["GENERATE", "HOOKED", "Variant", "variant_for"]

HOOKED = "vllm"
GENERATE = "vllm-generate"


@dataclass(frozen=True)
class Variant:
    """How one backend runs vLLM's executor, and why it refuses what it does not serve.

    `hooked`: the engine runs eagerly with the worker extension's hooks (`Engine.start(hooked=)`,
    `ie_setup(hooked)`); a compiled engine with its own taps (vllm-static) is not hooked but still
    serves points. `unhooked` is None where points are served; else the reason an operation that
    needs them is refused (the tail of `require_points`'s message) and `unhooked_card` the
    capability answer's reason for every point."""

    backend: str
    hooked: bool = False
    unhooked: str | None = None
    unhooked_card: str | None = None
    lens_stream: bool = False  # the streaming lens reads the hooked worker's captured rows
    pipeline_refusal: str | None = None  # why pipeline_parallel_size > 1 is refused, if it is

    @property
    def serves_points(self) -> bool:
        """Whether any point can be captured or steered (every variant but vllm-generate)."""
        return self.unhooked is None

    def require_points(self, what: str) -> None:
        """Refuse `what` (an operation's name) on a variant that serves no point."""
        if self.unhooked is not None:
            raise UnsupportedOperationError(
                f"{what} is not available on backend {self.backend!r}, {self.unhooked}"
            )

    def require_lens_stream(self) -> None:
        if not self.lens_stream:
            raise UnsupportedOperationError(
                f"the streaming lens read-out is not available on backend {self.backend!r}: it "
                "reads the hooked worker's captured rows; load the model with backend='vllm' or "
                "'eager'"
            )


_VARIANTS = {
    HOOKED: Variant(HOOKED, hooked=True, lens_stream=True),
    GENERATE: Variant(
        GENERATE,
        unhooked="which runs vLLM untouched for speed; load the model with backend='vllm' (any "
        "point, chosen per request) or backend='vllm-static' (declared points, compiled) to "
        "capture or steer",
        unhooked_card="vllm-generate runs vLLM untouched; load backend='vllm' or 'vllm-static' "
        "to capture",
        pipeline_refusal="it runs vLLM's compiled forward, which was not tested across pipeline "
        "stages on this build (only the hooked, eager one was)",
    ),
}


def variant_for(backend: str) -> Variant:
    """ie-vllm's own variants by name; another backend on ie-vllm's seam (vllm-static) serves
    points through its own worker, with no streaming lens (its rows live in its taps)."""
    return _VARIANTS.get(backend) or Variant(backend)
