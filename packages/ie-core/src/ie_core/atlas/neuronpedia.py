"""An atlas as Neuronpedia feature JSON: one object per feature, in the shape its feature API
returns (`modelId`, `layer` (the source id), `index`, `activations` each with `tokens`, `values`,
`maxValue`, `maxValueTokenIndex`, `minValue`; `frac_nonzero`; `pos_str` / `pos_values` and
`neg_str` / `neg_values` for the decoder logits; `freq_hist_data_bar_heights` /
`freq_hist_data_bar_values` for the histogram; `maxActApprox`). Field names from Neuronpedia's
public feature API and SAEDashboard's `neuronpedia_converter.py` (facts, not code).

Activations list the top contexts, then the band samples (marked with `binMin` / `binMax`: the
band's activation range, SAEDashboard's interval bins). Tokens are shown decoded one by one.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from ie_core.atlas.reader import AtlasData, open_atlas
from ie_core.harvest.storage import write_atomic

__all__ = ["export_neuronpedia", "neuronpedia_features"]

Decode = Callable[[int], str]


def _activation(context: dict[str, Any], decode: Decode, band: tuple[float, float] | None) -> dict:
    values = [float(v) for v in context["acts"]]
    out: dict[str, Any] = {
        "tokens": [decode(t) for t in context["tokens"]], "values": values,
        "maxValue": context["value"], "maxValueTokenIndex": context["position"],
        "minValue": min(values) if values else 0.0,
    }  # fmt: skip
    if band is not None:
        out["binMin"], out["binMax"] = band
    return out


def _band_range(data: AtlasData, band: int, top: float) -> tuple[float, float]:
    """A band's activation range (the band above 2**high ends at the feature's max)."""
    b = data.state.binning
    if band == 0:
        return 0.0, 2.0**b.low
    if band == b.bands - 1:
        return 2.0**b.high, top
    low = b.low + band - 1
    return 2.0**low, 2.0 ** (low + 1)


def neuronpedia_features(
    data: AtlasData, decode: Decode, *, model_id: str, source: str
) -> Iterator[dict[str, Any]]:
    """Each feature of `data` as a Neuronpedia feature object."""
    edges = data.state.binning.edges().tolist()
    for f in range(data.d_sae):
        page = data.feature(f)
        activations = [_activation(c, decode, None) for c in page["top"]]
        for band, contexts in enumerate(page["bands"]):
            activations += [
                _activation(c, decode, _band_range(data, band, page["max"])) for c in contexts
            ]
        heights = page["histogram"]
        feature: dict[str, Any] = {
            "modelId": model_id, "layer": source, "index": str(f), "activations": activations,
            "frac_nonzero": page["density"], "maxActApprox": page["max"],
            # A bar per bin with any count, at its lower edge (0 for the bin below 2**low).
            "freq_hist_data_bar_values": [([0.0, *edges])[i] for i, h in enumerate(heights) if h],
            "freq_hist_data_bar_heights": [h for h in heights if h],
        }  # fmt: skip
        for side, key in (("top", "pos"), ("bottom", "neg")):
            pairs = page.get(f"{side}_logits", [])
            feature[f"{key}_str"] = [decode(t) for t, _ in pairs]
            feature[f"{key}_values"] = [v for _, v in pairs]
        yield feature


def export_neuronpedia(
    folder: str | Path, out: str | Path, decode: Decode, *, model_id: str, source: str
) -> Path:
    """Write every feature of the atlas at `folder` as one JSON object per line of `out`."""
    data = open_atlas(folder)
    lines = (json.dumps(f, allow_nan=False) + "\n" for f in
             neuronpedia_features(data, decode, model_id=model_id, source=source))  # fmt: skip
    path = Path(out)
    write_atomic(path, "".join(lines).encode())
    return path
