"""nnsight 0.8: `LanguageModel(path, dispatch=True)`, one trace per point.

Eager attention, like the reference and TransformerLens: HF's sdpa path drops Gemma 2's attention
softcap (transformers warns), which would make nnsight compute a different function.
One trace per point keeps every request trivially in execution order (nnsight raises
`OutOfOrderError` otherwise) at the price of a forward each, which is cheap on these models.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from ie_validator.engines.accessor import parse_accessor
from ie_validator.engines.base import (
    Capture,
    CaptureFailure,
    EngineError,
    ModelSpec,
    Request,
    canonical,
)
from ie_validator.mappings import Gap
from ie_validator.scoring import Tier


def _envoy(root: Any, parts: list[str]) -> Any:
    node = root
    for part in parts:
        node = node[int(part)] if part.isdigit() else getattr(node, part)
        if node is None:  # HF hybrid layers set the mixer they lack to None (Granite-4.0-H)
            raise AttributeError(part)
    return node


class NNsightEngine:
    name = "nnsight"
    tier = Tier.RAW_HF

    def capture(self, model: ModelSpec, ids: Sequence[int], requests: Sequence[Request]) -> Capture:
        import torch
        from nnsight import LanguageModel

        try:
            lm = LanguageModel(
                str(model.path), dispatch=True, dtype=torch.float32, attn_implementation="eager"
            )
        except Exception as exc:
            raise EngineError(
                f"nnsight could not load the model: {type(exc).__name__}: {exc}"
            ) from exc
        batch = torch.tensor([list(ids)])
        out: Capture = {}
        torch.set_grad_enabled(False)
        for req in requests:
            acc = parse_accessor(req.hook)
            try:
                module = _envoy(lm, acc.parts)
            except (AttributeError, IndexError):
                out[req.key] = Gap(f"no module {acc.module} on this model")
                continue
            try:
                with lm.trace(batch):
                    value = module.input if acc.io == "input" else module.output
                    if acc.index is not None:
                        value = value[acc.index]
                    # Clone in the trace: HF may modify an output in place after the module
                    # returns (Falcon: mlp_output += attention_output); save() keeps a reference.
                    saved = value.clone().save()
                out[req.key] = canonical(req.address.name, saved, req.layout)
            except Exception as exc:  # recorded as this point's failure, the sweep goes on
                out[req.key] = CaptureFailure(f"nnsight: {type(exc).__name__}: {exc}"[:400])
        return out
