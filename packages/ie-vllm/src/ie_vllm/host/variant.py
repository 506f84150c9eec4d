"""The vLLM executor variants ie-vllm loads, and what each serves, decided once at load.

`vllm` runs eagerly with the worker extension's hooks: every servable point, chosen per request.
`vllm-generate` runs vLLM untouched (its compiled forward, no hooks), so it serves no point: every
capture, steer, lens stream and dictionary read-out is refused here, with one wording, before a
request reaches the engine. A backend built on ie-vllm's seam (ie-static's `vllm-static`) gets
the hooked defaults under its own name.
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

    `unhooked` is None where the worker's hooks run; else the reason an operation that needs them
    is refused (the tail of `require_hooks`'s message) and `unhooked_card` the capability answer's
    reason for every point."""

    backend: str
    unhooked: str | None = None
    unhooked_card: str | None = None
    lens_stream: bool = False  # the streaming lens reads the hooked worker's captured rows
    pipeline_refusal: str | None = None  # why pipeline_parallel_size > 1 is refused, if it is

    @property
    def hooked(self) -> bool:
        """Whether the engine runs eagerly with the worker extension's hooks (`ie_setup(hooked)`)."""
        return self.unhooked is None

    def require_hooks(self, what: str) -> None:
        """Refuse `what` (an operation's name) on a variant that runs no hooks."""
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
    HOOKED: Variant(HOOKED, lens_stream=True),
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
    """ie-vllm's own variants by name; another backend on the hooked seam gets hooks, no lens
    stream (its rows live where its own worker keeps them) and its own pipeline rules."""
    return _VARIANTS.get(backend) or Variant(backend)
