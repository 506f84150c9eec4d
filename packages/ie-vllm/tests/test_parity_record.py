"""The committed value digests of the capability sweeps (docs/notes/vllm_parity.json and
vllm_static_parity.json, written by scripts/family_sweep.py): per family and point, the worst
max |backend - eager| over the served layers, eager being HF's model on the same synthetic
weights. No engine here: the test checks the record, and recomputes its cheap side (eager's
scales) for one family per structural group.

Tolerances: a served point's digest within 1e-4 of max(1, max |eager|) (eager against vLLM, fp32
CPU); eager's recomputed scale within 1e-5 relative of the committed one (one backend)."""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pytest
from vllm_parity import eager_scales, served_layers

ROOT = Path(__file__).resolve().parents[3]
CAPS = ROOT / "packages/ie-core/src/ie_core/data/capabilities"
NOTES = ROOT / "docs/notes"
BACKENDS = ("vllm", "vllm-static")
TOL = 1e-4
# Families with no value digest, because the backend serves none of their points: vLLM 0.32
# (CPU) cannot run the checkpoint, so `family_sweep.py` stops at load with the refusal the
# capability file records for every point. Each maps to a phrase of that refusal; the test fails
# when the list is stale either way, or when a listed family serves a point (it then needs a
# digest: `family_sweep.py --backend B --family F`).
_REFUSED = {
    "deepseek-v3": "e_score_correction_bias",  # router bias transformers 5.19 does not write
    "deepseek-v4": "mlp_layer_types entries must be in ('sparse', 'dense')",
    "lfm2": "'Lfm2Config' object has no attribute 'conv_dim'",
    "qwen3-next": "CPU GDN attention requires BF16",
}
UNDIGESTED = {"vllm": _REFUSED, "vllm-static": _REFUSED}
# One family per structure vLLM's tree lays out differently: fused residual add-norm with GQA,
# unfused layers with learned positions, sandwich norms with softcaps, ALiBi with per-head fused
# QKV (and eager aligned to vLLM's exact GELU), sparse MoE.
REPRESENTATIVES = ("llama", "gpt2", "gemma2", "bloom", "mixtral")


def _load(backend: str) -> tuple[dict[str, Any], dict[str, Any]]:
    caps = json.loads((CAPS / f"{backend}.json").read_text())
    record = json.loads((NOTES / f"{backend.replace('-', '_')}_parity.json").read_text())
    return caps, record


def problems(
    caps: dict[str, Any], record: dict[str, Any], undigested: Mapping[str, str]
) -> list[str]:
    """Every way the record fails to back the capability file's served points with a value."""
    out = []
    families = {e["family"] for e in caps["models"].values()}
    if families - set(record) != set(undigested):
        out.append(f"families without a digest: {sorted(families - set(record))}")
    for family, phrase in sorted(undigested.items()):
        if f"ie-synthetic/{family}" not in caps["models"]:
            continue
        if served := sorted(served_layers(caps, family)):
            out.append(f"{family}: listed as refused but serves {served}")
        points = caps["models"][f"ie-synthetic/{family}"]["points"].values()
        if not all(phrase in p.get("reason", "") for p in points if not p["served"]):
            out.append(f"{family}: a refusal does not name {phrase!r}")
    for family in sorted(families & set(record)):
        row = record[family]
        worst, scale = row["worst_max_abs"], row.get("eager_max_abs", {})
        for point in sorted(served_layers(caps, family)):
            d = worst.get(point)
            if not isinstance(d, int | float):
                out.append(f"{family} {point}: served, digest {d!r}")
            elif point not in scale:
                out.append(f"{family} {point}: no eager scale")
            elif not d <= TOL * max(1.0, scale[point]):
                out.append(
                    f"{family} {point}: {d:.3g} beyond {TOL:g} of max(1, {scale[point]:.3g})"
                )
        if not row["greedy_tokens_equal"]:
            out.append(f"{family}: greedy tokens differ from eager")
    return out


@pytest.mark.parametrize("backend", BACKENDS)
def test_every_served_point_has_a_digest_within_tolerance(backend: str) -> None:
    caps, record = _load(backend)
    assert problems(caps, record, UNDIGESTED[backend]) == []


def test_a_doctored_record_is_caught() -> None:
    """Negative control: a digest past the tolerance, a served point without one, a missing scale,
    a stale family list, a listed family that serves and a wrong refusal each show up."""
    caps, record = _load("vllm")
    bad = json.loads(json.dumps(record))
    bad["llama"]["worst_max_abs"]["resid_post"] = 1.0
    del bad["gpt2"]["worst_max_abs"]["mlp_out"]
    del bad["gemma2"]["eager_max_abs"]["attn_in"]
    found = problems(caps, bad, {**UNDIGESTED["vllm"], "llama": "refused"})
    assert any(p.startswith("llama resid_post: 1 beyond") for p in found), found
    assert "gpt2 mlp_out: served, digest None" in found
    assert "gemma2 attn_in: no eager scale" in found
    assert any(p.startswith("families without a digest") for p in found)
    # A family listed as refused that serves points (llama), or whose refusal is another one.
    assert any(p.startswith("llama: listed as refused but serves ['attn_in'") for p in found)
    other = {**UNDIGESTED["vllm"], "lfm2": "CPU GDN attention requires BF16"}
    assert problems(caps, record, other) == [
        "lfm2: a refusal does not name 'CPU GDN attention requires BF16'"
    ]


@pytest.mark.parametrize("family", REPRESENTATIVES)
def test_eager_scales_are_todays(family: str) -> None:
    """The record's eager side, recomputed: a change to eager or to the synthetic weights since
    the sweep shows here, so the committed digests describe the code and weights in this tree."""
    caps, record = _load("vllm")
    committed = record[family]["eager_max_abs"]
    layers = {n: ls for n, ls in served_layers(caps, family).items() if n in committed}
    fresh = eager_scales(family, layers)
    assert set(fresh) == set(committed)
    for point, scale in committed.items():
        assert abs(fresh[point] - scale) <= 1e-5 * max(1.0, scale), (point, fresh[point], scale)
