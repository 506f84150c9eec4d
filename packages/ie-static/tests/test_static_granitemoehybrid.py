"""vllm-static on Granite-4.0-H (Mamba2 + attention layers, routed experts plus a shared MLP)
against eager, compiled CPU engine, fp32, 1e-4 as in test_static_families.

Every point the hooked backend serves is tapped except mlp_out / mlp_out_post, which hooked vLLM
reads from two modules' outputs (`SiteDef.companions`); vllm-static refuses those with the reason.
Long form only (IE_FULL_SUITE=1): one more compiled engine; the committed vllm-static answers for
the family come from `ie points --sweep --backend vllm-static`, which confirms each claim by capture.
"""

from __future__ import annotations

import pytest
import torch
from ie_core.errors import PointUnavailableError
from ie_core.ops import Additive, Orthogonal, steer_at
from ie_core.runner import run
from ie_static.declared import TAPPABLE

pytestmark = [pytest.mark.slow, pytest.mark.full, pytest.mark.timeout(1800)]

MODEL = "ie-synthetic/granitemoehybrid"
TOL = 1e-4
PROMPT = [1, 17, 42, 99, 7, 250, 3, 64, 11, 5, 180, 23]
WRITES = ["resid_post.1", "attn_out.0", "z.1", "mlp_in.2", "attn_in.2"]
TWO_MODULE = ("mlp_out", "mlp_out_post")


@pytest.fixture(scope="module")
def pair():
    from ie_core.loading import load_model

    eager = load_model(MODEL, backend="eager")
    static = load_model(
        MODEL, backend="vllm-static", static_points="all", static_writes=WRITES, max_model_len=128
    )
    yield static, eager
    run(static.shutdown())


def test_every_tapped_point_equals_eager_and_the_summed_mlp_is_refused(pair) -> None:
    static, eager = pair
    hooked = {a.split(".")[0] for a in static.info.widths}
    assert set(static.points()) == hooked - set(TWO_MODULE)
    assert hooked <= set(TAPPABLE)  # q and k too: slices of the fused qkv output (#47)
    for name in TWO_MODULE:
        with pytest.raises(PointUnavailableError, match="two modules"):
            run(static.capture(PROMPT, [f"{name}.1"]))
    reads = list(static.reads)
    got = run(static.capture(PROMPT, reads))
    want = run(eager.capture([PROMPT], reads))
    diffs = {a: float((got[a].float() - want[a].float()).abs().max()) for a in reads}
    print(f"\ngranitemoehybrid static vs eager, worst |diff|: {max(diffs.values()):.3g}")
    assert max(diffs.values()) <= TOL, {a: d for a, d in diffs.items() if d > TOL}
    # Negative control: resid_pre.1 is resid_post.0, not resid_post.1.
    assert float((got["resid_pre.1"] - want["resid_post.1"]).abs().max()) > 1e-2


@pytest.mark.parametrize("site", WRITES)
def test_steering_each_write_site_equals_eager(pair, site: str) -> None:
    static, eager = pair
    g = torch.Generator().manual_seed(5)
    v = torch.randn(static.point_width(site), generator=g)
    last = "resid_post.3"
    plain = run(static.capture(PROMPT, [last]))[last]
    for op in (Additive(v / v.norm(), 3.0), Orthogonal(v)):
        spec = steer_at(site, op)
        got = run(static.capture(PROMPT, [site, last], steering=spec))
        want = run(eager.capture([PROMPT], [site, last], steering=spec))
        for a in (site, last):
            assert float((got[a].float() - want[a].float()).abs().max()) <= TOL, (site, op, a)
    assert float((got[last] - plain).abs().max()) > 1e-3  # the write moved the last layer
