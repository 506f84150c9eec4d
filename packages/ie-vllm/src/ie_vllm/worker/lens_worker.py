"""Worker-side streaming lens read-out: a request's captured rows for positions [start, stop),
optionally carried by a transport matrix (the Jacobian lens), through the final norm and
compute_logits, reduced to top-k in the worker so only `[rows, k]` crosses to the host."""

from __future__ import annotations

from typing import Any

import torch
from ie_core.reduce import LensTopK

from ie_vllm import payload

__all__ = ["LensWorkerMixin"]


class LensWorkerMixin:
    """Mixed into `IEWorkerExtension`; `self._ie` is its WorkerState, `self._ie_rows` its rows of a
    request and `self._ie_logits` its lens."""

    def ie_lens_collect_topk(
        self, key: str, start: int, stop: int, k: int, transports: dict[str, Any]
    ) -> dict[str, Any]:
        state = self._ie  # type: ignore[attr-defined]
        entry = state.registry.get(key)
        if entry is None or not state.capture_rank:
            return payload.encode({})
        mats = payload.decode(transports) if transports else {}
        out: dict[str, torch.Tensor] = {}
        for address, rows in self._ie_rows(entry, start, stop).items():  # type: ignore[attr-defined]
            if address in mats:
                rows = rows.float() @ mats[address].to(rows.device).T
            logits = self._ie_logits(payload.encode({"rows": rows}))  # type: ignore[attr-defined]
            if logits is None:
                return payload.encode({})
            out.update((f"{address}|{n}", t) for n, t in LensTopK(k).of_logits(logits).items())
        return payload.encode(out)
