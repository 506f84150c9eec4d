"""TransformerLens 4.x: `TransformerBridge.boot_transformers(folder)`, one `run_with_cache`.

Token ids go in as a tensor, so the bridge prepends nothing (its `to_tokens` would add a BOS).
"""

from __future__ import annotations

from collections.abc import Sequence

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


class TransformerLensEngine:
    name = "transformer-lens"
    tier = Tier.FUSED

    def capture(self, model: ModelSpec, ids: Sequence[int], requests: Sequence[Request]) -> Capture:
        import torch
        from transformer_lens.model_bridge import TransformerBridge

        try:
            bridge = TransformerBridge.boot_transformers(
                str(model.path), device="cpu", dtype=torch.float32
            )
        except Exception as exc:
            raise EngineError(
                f"TransformerBridge.boot_transformers failed: {type(exc).__name__}: {exc}"
            ) from exc
        names = {req.hook for req in requests}
        try:
            with torch.no_grad():
                _, cache = bridge.run_with_cache(
                    torch.tensor([list(ids)]), names_filter=lambda n: n in names
                )
        except Exception as exc:
            raise EngineError(
                f"TransformerBridge forward failed: {type(exc).__name__}: {exc}"
            ) from exc
        out: Capture = {}
        for req in requests:
            if req.hook in cache:
                try:
                    out[req.key] = canonical(req.address.name, cache[req.hook], req.layout)
                except TypeError as exc:
                    out[req.key] = CaptureFailure(f"TransformerLens {req.hook}: {exc}")
            else:
                out[req.key] = Gap(f"TransformerLens exposes no {req.hook} on this model")
        return out
