"""The vLLM backends' capability answer, from the same check a capture or a steer goes through
(the worker's PointTable info: widths, writable, refused; vllm-static's `SitePolicy` narrows it
to its taps)."""

from __future__ import annotations

from typing import Any

from ie_core.capabilities import Capabilities, PointCapability, probe
from ie_core.grammar import POINTS, Address

__all__ = ["capabilities"]


def capabilities(model: Any) -> Capabilities:
    """Per point of a loaded `VLLMModel` (or subclass): every address tried on `model.admission.check`."""
    why_not = model.variant.unhooked_card
    if why_not is not None:  # a variant without hooks serves no point, for one reason
        return {p.name: PointCapability(False, False, (), why_not) for p in POINTS}

    def writable(_address: Address, text: str) -> bool:
        return bool(model.policy.can_write(text))

    return probe(model.n_layers, model.admission.check, writable)
