"""Which addresses a vLLM backend serves and writes, and how a steering request is bounded.

`VLLMModel` runs every address through its own checks (grammar, layer range, what the worker
resolved) and then through its `SitePolicy`. The hooked backend's policy (`SitePolicy` itself)
adds nothing; vllm-static subclasses it to narrow reads and writes to its declared taps and to
bound ops and masks per request. The hooks are public and declared here, so a backend never
overrides the model's private methods.
"""

from __future__ import annotations

from collections.abc import Iterable

from ie_vllm.specs import SteerSpec


class SitePolicy:
    """Serve what the worker resolved; write where the worker can write back."""

    def __init__(self, writable: Iterable[str]) -> None:
        self.writable = frozenset(writable)

    def check_read(self, address: str) -> None:
        """Raise if `address` (already resolved by the worker) is not served; hooked serves all."""

    def can_write(self, address: str) -> bool:
        return address in self.writable

    def write_reason(self, address: str) -> str:
        """Why a writable point cannot be written at `address` here (capture-only is the model's)."""
        return (
            "on this family's vLLM layer the residual is kept outside the hooked module, so a "
            "write would not reach it; steer resid_pre or resid_post, or use backend='eager'"
        )

    def check_steering(self, specs: tuple[SteerSpec, ...]) -> None:
        """Raise if one request's steering exceeds what the backend can hold; hooked has no limit."""


__all__ = ["SitePolicy"]
