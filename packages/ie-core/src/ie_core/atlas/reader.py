"""Reading a finished atlas folder: `open_atlas(folder)` and one feature's page data."""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property
from pathlib import Path
from typing import Any

import torch

from ie_core.atlas.errors import AtlasError
from ie_core.atlas.state import AtlasState
from ie_core.atlas.storage import (
    CONTEXTS,
    LOGITS,
    AtlasManifest,
    read_checkpoint,
    read_manifest,
    read_tensors,
)

__all__ = ["AtlasData", "open_atlas"]


@dataclass(frozen=True, eq=False)
class AtlasData:
    folder: Path
    manifest: AtlasManifest
    state: AtlasState
    contexts: dict[str, torch.Tensor]
    logits: dict[str, torch.Tensor]

    @property
    def d_sae(self) -> int:
        return self.state.d_sae

    @cached_property
    def _rows(self) -> dict[int, int]:
        """Each kept window's row in `contexts`, found once (a page reads dozens of windows, an
        import or export every feature's)."""
        rows: dict[int, int] = {}
        for row, sequence in enumerate(self.contexts["window_sequence"].tolist()):
            rows.setdefault(int(sequence), row)
        return rows

    def _tokens(self, sequence: int) -> list[int]:
        row = self._rows.get(sequence)
        if row is None:
            raise AtlasError(f"window {sequence} is not among {self.folder}'s kept contexts")
        tokens = self.contexts["window_tokens"][row]
        return [int(t) for t in tokens[tokens >= 0].tolist()]

    def _context(self, seq: int, pos: int, value: float, acts: torch.Tensor) -> dict[str, Any]:
        tokens = self._tokens(seq)
        return {"sequence": seq, "position": pos, "value": value, "tokens": tokens,
                "acts": acts[: len(tokens)].tolist()}  # fmt: skip

    def feature(self, f: int) -> dict[str, Any]:
        """Feature `f`'s page: top contexts, band samples, counts, histogram and logits."""
        s = self.state
        if not 0 <= f < s.d_sae:
            raise AtlasError(f"feature {f} is outside 0..{s.d_sae - 1}")
        top = [
            self._context(int(q), int(p), float(v), self.contexts["top_acts"][f, j])
            for j, (v, q, p) in enumerate(
                zip(s.top_values[f], s.top_sequence[f], s.top_position[f], strict=True)
            )
            if int(q) >= 0
        ]
        bands = []
        for b in range(s.binning.bands):
            bands.append([
                self._context(int(q), int(p), float(v), self.contexts["sample_acts"][f, b, j])
                for j, (v, q, p) in enumerate(zip(
                    s.sample_values[f, b], s.sample_sequence[f, b], s.sample_position[f, b],
                    strict=True,
                ))
                if int(q) >= 0
            ])  # fmt: skip
        page: dict[str, Any] = {
            "feature": f, "count": int(s.count[f]), "tokens": s.tokens,
            "density": int(s.count[f]) / s.tokens if s.tokens else 0.0,
            "mean": float(s.total[f]) / int(s.count[f]) if int(s.count[f]) else 0.0,
            "max": top[0]["value"] if top else 0.0, "histogram": s.histogram[f].tolist(),
            "bin_edges": s.binning.edges().tolist(), "top": top, "bands": bands,
        }  # fmt: skip
        if self.logits:
            for side in ("top", "bottom"):
                page[f"{side}_logits"] = list(zip(
                    self.logits[f"{side}_ids"][f].tolist(),
                    self.logits[f"{side}_values"][f].tolist(), strict=True,
                ))  # fmt: skip
        return page


def open_atlas(folder: str | Path) -> AtlasData:
    folder = Path(folder)
    manifest = read_manifest(folder)
    if manifest is None or not manifest.complete:
        why = "no atlas.json" if manifest is None else "the pass did not finish"
        raise AtlasError(
            f"{folder} holds no finished atlas ({why}); run (or rerun, to resume) `ie atlas` "
            "into it"
        )
    point = read_checkpoint(folder)
    if point is None:
        raise AtlasError(f"{folder} has no state.safetensors; the folder is incomplete")
    contexts, _ = read_tensors(folder / CONTEXTS)
    logits = read_tensors(folder / LOGITS)[0] if (folder / LOGITS).exists() else {}
    return AtlasData(folder, manifest, point.state, contexts, logits)
