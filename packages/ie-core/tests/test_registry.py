"""The points and family registries, and the generated SUPPORTED_POINTS.md."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from ie_core import FAMILIES, POINTS, get_family, get_point
from ie_core.capabilities import declared_serving
from ie_core.grammar import Scope, Service
from ie_core.tooling.docs import render_supported_points

ROOT = Path(__file__).resolve().parents[3]


def test_there_are_38_points_with_unique_names() -> None:
    assert len(POINTS) == 38
    assert len({p.name for p in POINTS}) == 38


def test_vllm_is_declared_to_serve_32_and_refuse_the_rest_with_a_reason() -> None:
    """From the committed record of the vllm plugin's declarations (ie-vllm need not be here)."""
    declared = {p.name: declared_serving("vllm", p.name) for p in POINTS}
    assert None not in declared.values()
    served = [name for name, s in declared.items() if s is not None and s.served]
    assert len(served) == 32
    for name, s in declared.items():
        assert s is not None
        if not s.served:
            assert "use backend='eager'" in s.reason, name
    probs = declared_serving("vllm", "attn_probs")
    assert probs is not None and probs.service is Service.RECOMPUTE
    assert declared_serving("vllm", "no-such-point") is None
    assert declared_serving("no-such-backend", "resid_post") is None


def test_trunk_points() -> None:
    trunk = {p.name for p in POINTS if p.scope is Scope.TRUNK}
    assert trunk == {"embeddings", "final_norm", "lm_head"}


def test_family_points_follow_traits() -> None:
    llama, neox, qwen3, gemma2 = (get_family(s) for s in ("llama", "gpt-neox", "qwen3", "gemma2"))
    names = lambda f: {p.name for p in f.points}  # noqa: E731
    assert "resid_mid" in names(llama) and "resid_mid" not in names(neox)
    assert "q_norm_in" in names(qwen3) and "q_norm_in" not in names(llama)
    assert "mlp_pre_linear" in names(gemma2) and "mlp_pre_linear" not in names(neox)
    assert "router_logits" in names(get_family("mixtral"))
    assert "parallel" in neox.missing_reason(get_point("resid_mid"))
    assert neox.missing_reason(get_point("resid_post")) == ""


def test_every_family_has_the_core_points() -> None:
    core = {"embeddings", "resid_pre", "attn_out", "mlp_out", "resid_post", "final_norm", "lm_head"}
    for family in FAMILIES:
        assert core <= {p.name for p in family.points}, family.slug


def test_supported_points_doc_matches_the_registry() -> None:
    doc = ROOT / "docs" / "SUPPORTED_POINTS.md"
    assert doc.read_text() == render_supported_points(), (
        "docs/SUPPORTED_POINTS.md drifted; run `uv run ie points --write docs/SUPPORTED_POINTS.md`"
    )


def test_importing_ie_core_does_not_import_torch() -> None:
    code = "import sys, ie_core, ie_core.tooling.cli, ie_core.tooling.docs; print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"
