"""vllm-static on synthetic families (compiled CPU engine) against the eager HF backend.

Five families chosen for what differs in vLLM's decoder layers: Llama (GQA), GPT-2 (layers return
one tensor, learned positions), Qwen3 (QK-norm), Gemma 2 (sandwich norms, softcaps, embedding
scale, sliding window) and Mixtral (MoE block, router). One engine per family declares every point
(`static_points="all"`) and a few write sites; several checks share it. A short max_model_len
keeps compile and KV small. Tolerance: eager vs vLLM fp32, 1e-4 absolute on rows of norm ~1 (the
project's cross-backend bound; hooked `vllm` is held to the same bound against eager).
"""

from __future__ import annotations

import asyncio

import pytest
import torch
from ie_core.ops import Additive, Orthogonal, PositionMask, steer_at
from ie_core.protocol import SamplingParams
from ie_core.runner import run

pytestmark = [pytest.mark.slow, pytest.mark.timeout(1800)]  # engine start: compile on a busy CPU

# CI compiles gemma2 (sandwich norms, softcaps, window: the most tap sites off Llama's); SmolLM2
# and test_static_outputs compile Llamas. The other four are long form only (IE_FULL_SUITE=1).
FAMILIES = [
    *(pytest.param(f, marks=pytest.mark.full) for f in ("llama", "gpt2", "qwen3")), "gemma2",
    pytest.param("mixtral", marks=pytest.mark.full),
]  # fmt: skip
TOL = 1e-4
# Longer than the synthetic sliding window (8), so Gemma 2's windowed attention maps matter.
PROMPT = [1, 17, 42, 99, 7, 250, 3, 64, 11, 5, 180, 23]
# Write sites new to vllm-static (beyond resid_post / attn_out), per family.
NEW_WRITES = {
    "llama": ["attn_in.1", "z.1", "mlp_act.1", "resid_mid.1"],
    "gpt2": ["attn_in.1", "z.1", "mlp_act.1"],
    "qwen3": ["attn_in.1", "z.1", "mlp_act.1", "k_norm_out.1"],
    "gemma2": ["attn_in.1", "z.1", "mlp_act.1", "attn_out_post.1", "q.1", "k_rot.1"],
    "mixtral": ["attn_in.1", "z.1", "value.1"],
}
OLD_WRITES = ["resid_post.1", "attn_out.1"]


@pytest.fixture(scope="module", params=FAMILIES)
def pair(request):
    from ie_core.loading import load_model

    family = request.param
    model_id = f"ie-synthetic/{family}"
    eager = load_model(model_id, backend="eager")
    static = load_model(
        model_id,
        backend="vllm-static",
        static_points="all",
        static_writes=[*OLD_WRITES, *NEW_WRITES[family]],
        max_model_len=128,
    )
    yield family, static, eager
    run(static.shutdown())


def _diff(address: str, a: torch.Tensor, b: torch.Tensor) -> float:
    """max |a - b|; masked attention scores (dtype min in both) compare as equal."""
    assert a.shape == b.shape, (address, a.shape, b.shape)
    x, y = a.float(), b.float()
    if address.startswith("attn_scores"):
        both = (x < torch.finfo(torch.float32).min / 2) & (y < torch.finfo(torch.float32).min / 2)
        x, y = x.masked_fill(both, 0), y.masked_fill(both, 0)
    return float((x - y).abs().max())


def _by_point(diffs: dict[str, float]) -> dict[str, float]:
    out: dict[str, float] = {}
    for address, d in diffs.items():
        name = address.split(".")[0]
        out[name] = max(out.get(name, 0.0), d)
    return out


def test_every_hooked_point_is_tapped_and_equals_eager(pair) -> None:
    family, static, eager = pair
    # The hooked backend's resolver table (static.info) is what `vllm` serves on this family.
    hooked_points = {a.split(".")[0] for a in static.info.widths}
    assert set(static.points()) == hooked_points, (family, static.static_info.refused)
    assert set(static.reads) == set(static.info.widths)
    reads = list(static.reads)
    got = run(static.capture(PROMPT, reads))
    want = run(eager.capture([PROMPT], reads))
    diffs = {a: _diff(a, got[a], want[a]) for a in reads}
    print(f"\n{family} static vs eager, worst |diff| per point: {_by_point(diffs)}")
    assert max(diffs.values()) <= TOL, (family, {a: d for a, d in diffs.items() if d > TOL})
    # Negative control: resid_pre.1 is resid_post.0, not resid_post.1.
    assert _diff("", got["resid_pre.1"], want["resid_post.1"]) > 1e-2
    probs = run(static.capture_attention(PROMPT, [1]))["attn_probs.1"]
    assert _diff("attn_probs.1", probs, want["attn_probs.1"]) <= TOL


def test_steering_at_each_new_write_site_equals_eager(pair) -> None:
    family, static, eager = pair
    last = f"resid_post.{static.n_layers - 1}"
    specs = {}
    for i, site in enumerate(NEW_WRITES[family]):
        g = torch.Generator().manual_seed(10 + i)
        v = torch.randn(static.point_width(site), generator=g)
        specs[site] = steer_at(site, Additive(v / v.norm(), 3.0), mask=PositionMask((0,)))

    async def steered_all():  # every site's request in flight together on the static engine
        return await asyncio.gather(
            *(static.capture(PROMPT, [site, last], steering=specs[site]) for site in specs)
        )

    got = dict(zip(specs, run(steered_all()), strict=True))
    plain = run(static.capture(PROMPT, [last]))[last]
    for site, spec in specs.items():
        want = run(eager.capture([PROMPT], [site, last], steering=spec))
        for a in (site, last):
            assert _diff(a, got[site][a], want[a]) <= TOL, (family, site, a)
        # Negative control: an engine that dropped this write would read the unsteered rows.
        moved = _diff(last, plain, want[last])
        print(f"{family} write at {site}: moved {last} by {moved:.3g}")
        assert moved > 1e-3, (family, site, moved)


def test_generation_steered_at_old_and_new_sites_equals_eager(pair) -> None:
    family, static, eager = pair
    width = static.d_model
    g = torch.Generator().manual_seed(3)
    new = NEW_WRITES[family][1]  # z: per-head mixed values, read in decode steps too
    specs = [
        steer_at("resid_post.1", Additive(torch.randn(width, generator=g), 2.0),
                 mask=PositionMask((0,))),
        steer_at("attn_out.1", Orthogonal(torch.randn(width, generator=g), 0.0)),
        steer_at(new, Orthogonal(torch.randn(static.point_width(new), generator=g), 0.0)),
    ]  # fmt: skip
    sp = SamplingParams(max_new_tokens=4, stop_at_eos=False)
    last = f"resid_post.{static.n_layers - 1}"
    sites = ["resid_post.1", new, last]
    got = run(static.capture_generation(PROMPT, sites, sp, steering=specs))
    want = run(eager.capture_generation(PROMPT, sites, sp, steering=specs))
    plain = run(static.capture(PROMPT, [last]))[last]
    assert got.generation.token_ids == want.generation.token_ids
    for a in sites:
        assert _diff(a, got.cache[a], want.cache[a]) <= TOL, (family, a)
    assert _diff(last, got.cache[last][:, : len(PROMPT)], plain) > 1e-3
