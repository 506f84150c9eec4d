"""Pipeline parallelism on hooked vLLM: `pipeline_parallel_size=2` on the CPU build (two stages
over gloo, one core each), every point served from the stage holding its layer.

CI starts one PP=2 engine (ie-synthetic/llama) and compares it with eager in-process, the
cross-engine tolerance (1e-4 of max(1, |eager|)); the long form adds a PP=1 engine and compares
the two at 1e-5, the within-backend tolerance: the stages run the same kernels on the same rows,
so only the hand-over between stages differs.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
from ie_core import Additive, Patch, SamplingParams, steer_at
from ie_core.errors import PointUnavailableError
from ie_core.experiments.jacobian_lens import jacobian_lens_topk
from ie_core.experiments.lens_stream import stream_lens
from ie_core.runner import run
from vllm_parity import PROMPT_TEXT, max_abs_diffs, scaled_diffs, servable_addresses
from vllm_support import eager, requires_vllm, start, stop

pytestmark = [pytest.mark.slow, requires_vllm]

MODEL = "ie-synthetic/llama"
TOL = 1e-4  # eager vs vLLM, fp32, relative to max(1, |eager|)
WITHIN = 1e-5  # PP=2 vs PP=1, fp32
PP1_CAPS = Path(__file__).resolve().parents[2] / "ie-core/src/ie_core/data/capabilities/vllm.json"
# The llama points test_vllm_families checks on one engine.
COMMON = {
    "embeddings", "resid_pre", "attn_in", "value", "attn_scores", "attn_probs", "z", "attn_out",
    "attn_out_post", "resid_mid", "mlp_in", "mlp_act", "mlp_out", "mlp_out_post", "resid_post",
    "final_norm",
}  # fmt: skip


@pytest.fixture(scope="module")
def pp2() -> Iterator[Any]:
    model = start(MODEL, pipeline_parallel_size=2)
    yield model
    stop(model)


@pytest.fixture(scope="module")
def ref() -> Any:
    return eager(MODEL)


def _stage_layers(model: Any) -> list[tuple[int, int]]:
    return [s.layers for s in model.info.stages]


def _vector(model: Any, seed: int) -> torch.Tensor:
    return torch.randn(model.d_model, generator=torch.Generator().manual_seed(seed))


def _assert_same_stream(got: list[Any], want: list[Any], reads: list[str]) -> None:
    """Two streaming lens read-outs: the same tokens, top-k ids, and probabilities within TOL."""
    assert [s.chunk.token_id for s in got] == [s.chunk.token_id for s in want]
    for address in reads:
        got_ids = torch.cat([s.topk[address].ids for s in got])
        assert torch.equal(got_ids, torch.cat([s.topk[address].ids for s in want]))
        got_p = torch.cat([s.topk[address].probs for s in got])
        want_p = torch.cat([s.topk[address].probs for s in want])
        assert float((got_p - want_p).abs().max()) <= TOL


def test_stages_split_the_layers_and_the_view_is_whole(pp2: Any) -> None:
    (lo0, hi0), (lo1, hi1) = _stage_layers(pp2)
    assert (lo0, hi1) == (0, pp2.n_layers) and hi0 == lo1 and lo0 < hi0 < hi1
    assert pp2.info.pp_size == 2
    # Every point eager serves on this family is served, at every layer, by one of the stages.
    addresses = set(servable_addresses(pp2))
    for layer in range(pp2.n_layers):
        for name in ("resid_pre", "attn_out", "mlp_out", "resid_post", "attn_probs"):
            assert f"{name}.{layer}" in addresses
    assert {"embeddings", "final_norm"} <= addresses
    assert set(pp2.points()) >= COMMON, COMMON - set(pp2.points())
    # The merged view is PP=1's: the committed capabilities sweep of hooked vLLM on this family.
    pp1 = json.loads(PP1_CAPS.read_text())["models"][MODEL]["points"]
    for name, cap in pp2.capabilities().items():
        want = pp1[name]
        assert (cap.served, cap.writable, list(cap.layers)) == (
            want["served"], want["writable"], want["layers"],
        ), name  # fmt: skip
    # A point the family lacks keeps the family's reason on the last stage's layers too.
    with pytest.raises(PointUnavailableError, match="qk norm"):
        pp2.point_width(f"q_norm_in.{pp2.n_layers - 1}")


def test_every_servable_point_matches_eager(pp2: Any, ref: Any) -> None:
    ids = ref.to_tokens(PROMPT_TEXT)
    addresses = servable_addresses(pp2)
    got = run(pp2.capture([ids], addresses))
    want = run(ref.capture([ids], addresses))
    diffs = scaled_diffs(got, want, addresses)
    worst = max(diffs, key=diffs.__getitem__)
    print(f"PP=2 vs eager over {len(addresses)} addresses: worst {worst} {diffs[worst]:.2e}")
    assert diffs[worst] <= TOL, (worst, diffs[worst])
    # Negative control: the last stage's rows are its own, not stage 0's hand-over repeated.
    first_of_last = _stage_layers(pp2)[1][0]
    handed = got[f"resid_post.{first_of_last - 1}"]
    assert float((got[f"resid_post.{first_of_last}"] - handed).abs().max()) > 100 * TOL
    assert float(got[f"resid_post.{pp2.n_layers - 1}"].abs().max()) > 100 * TOL


@pytest.mark.parametrize("stage", [0, 1])
def test_steering_on_either_stage_matches_eager(pp2: Any, ref: Any, stage: int) -> None:
    ids = ref.to_tokens(PROMPT_TEXT)
    lo, _ = _stage_layers(pp2)[stage]
    last = f"resid_post.{pp2.n_layers - 1}"
    spec = steer_at(f"resid_pre.{lo}", Additive(_vector(pp2, 3 + stage), 8.0))
    reads = [f"mlp_out.{lo}", last]
    got = run(pp2.capture([ids], reads, steering=spec))
    want = run(ref.capture([ids], reads, steering=spec))
    assert max(scaled_diffs(got, want, reads).values()) <= TOL
    plain = run(ref.capture([ids], [last]))[last]
    assert float((got[last] - plain).abs().max()) > 100 * TOL  # negative control: it steered
    params = SamplingParams(max_new_tokens=6, stop_at_eos=False)
    want_ids = run(ref.generate(ids, params, steering=spec)).token_ids
    assert run(pp2.generate(ids, params, steering=spec)).token_ids == want_ids


def test_concurrent_steered_and_plain_requests_keep_their_own_rows(pp2: Any, ref: Any) -> None:
    ids = ref.to_tokens(PROMPT_TEXT)
    last = f"resid_post.{pp2.n_layers - 1}"
    spec = steer_at("resid_post.0", Additive(_vector(pp2, 7), 8.0))

    async def both() -> list[Any]:
        import asyncio

        return list(
            await asyncio.gather(
                pp2.capture([ids], [last], steering=spec), pp2.capture([ids], [last])
            )
        )

    steered, plain = run(both())
    want_steered = run(ref.capture([ids], [last], steering=spec))
    want_plain = run(ref.capture([ids], [last]))
    assert max(scaled_diffs(steered, want_steered, [last]).values()) <= TOL
    assert max(scaled_diffs(plain, want_plain, [last]).values()) <= TOL
    assert max(scaled_diffs(steered, want_plain, [last]).values()) > 100 * TOL


def test_lens_runs_on_the_last_stage_for_rows_of_either(pp2: Any, ref: Any) -> None:
    reads = ["resid_post.0", f"resid_post.{pp2.n_layers - 1}"]
    rows = run(ref.capture(PROMPT_TEXT, reads))
    for address in reads:
        got = run(pp2.decode_residuals_topk(rows[address][0], 5))
        want = run(ref.decode_residuals_topk(rows[address][0], 5))
        assert torch.equal(got.ids, want.ids)
        assert float((got.probs - want.probs).abs().max()) <= TOL
    kw = {"k": 4, "max_new_tokens": 4, "stop_at_eos": False}
    on_pp = list(stream_lens(pp2, PROMPT_TEXT, reads, **kw))
    on_eager = list(stream_lens(ref, PROMPT_TEXT, reads, **kw))
    _assert_same_stream(on_pp, on_eager, reads)


def test_activation_patch_on_the_later_stage_matches_eager(pp2: Any, ref: Any) -> None:
    # Patch the clean run's rows into a corrupted prompt at the first layer of stage 1: the
    # patch must be applied where that layer runs, and what follows must see it.
    clean = ref.to_tokens(PROMPT_TEXT)
    corrupt = [clean[0], *[5 if t != 5 else 6 for t in clean[1:3]], *clean[3:]]
    lo = _stage_layers(pp2)[1][0]
    site, last = f"resid_pre.{lo}", f"resid_post.{pp2.n_layers - 1}"
    source = run(ref.capture([clean], [site]))[site][0]
    spec = steer_at(site, Patch(source[1:3], positions=(1, 2)))
    got = run(pp2.capture([corrupt], [site, last], steering=spec))
    want = run(ref.capture([corrupt], [site, last], steering=spec))
    assert max(scaled_diffs(got, want, [site, last]).values()) <= TOL
    assert float((got[site][0][1:3] - source[1:3]).abs().max()) <= TOL  # the rows were set
    unpatched = run(ref.capture([corrupt], [last]))[last]
    assert float((got[last] - unpatched).abs().max()) > 100 * TOL  # negative control


def test_jacobian_lens_on_rows_of_either_stage_matches_eager(pp2: Any, ref: Any) -> None:
    from ie_eager.jacobian import jacobian_lens

    layers = [0, pp2.n_layers - 2]
    lens = jacobian_lens(ref, [[1, 5, 9, 13]], layers=layers)
    reads = [f"resid_post.{layer}" for layer in layers]
    rows = run(ref.capture(PROMPT_TEXT, reads))
    for layer, address in zip(layers, reads, strict=True):
        got = jacobian_lens_topk(pp2, lens, rows[address][0], layer, k=5)
        want = jacobian_lens_topk(ref, lens, rows[address][0], layer, k=5)
        assert torch.equal(got.ids, want.ids)
        assert float((got.probs - want.probs).abs().max()) <= TOL
    kw = {"k": 4, "lens": lens, "max_new_tokens": 4, "stop_at_eos": False}
    on_pp = list(stream_lens(pp2, PROMPT_TEXT, reads, **kw))
    on_eager = list(stream_lens(ref, PROMPT_TEXT, reads, **kw))
    _assert_same_stream(on_pp, on_eager, reads)
    # Negative control: without the transport the read-out differs (the lens was applied).
    plain = list(stream_lens(pp2, PROMPT_TEXT, reads[:1], k=4, max_new_tokens=4, stop_at_eos=False))
    assert not torch.equal(
        torch.cat([s.topk[reads[0]].probs for s in plain]),
        torch.cat([s.topk[reads[0]].probs for s in on_pp]),
    )


def test_every_stage_released_its_requests(pp2: Any) -> None:
    run(pp2.capture(PROMPT_TEXT, [f"resid_post.{pp2.n_layers - 1}", "resid_post.0"]))
    stats = run(pp2.stats())
    assert stats["registered"] == 0 and stats["hooks"] == {}


@pytest.mark.full
def test_pp2_equals_pp1_at_every_point_and_under_steering(pp2: Any) -> None:
    pp1 = start(MODEL)
    try:
        ids = pp1.to_tokens(PROMPT_TEXT)
        addresses = servable_addresses(pp1)
        assert servable_addresses(pp2) == addresses
        assert pp2.info.writable == pp1.info.writable
        got = run(pp2.capture([ids], addresses))
        want = run(pp1.capture([ids], addresses))
        diffs = max_abs_diffs(got, want, addresses)
        worst = max(diffs, key=diffs.__getitem__)
        print(f"PP=2 vs PP=1 over {len(addresses)} addresses: worst {worst} {diffs[worst]:.2e}")
        assert diffs[worst] <= WITHIN, (worst, diffs[worst])
        spec = steer_at("resid_pre.1", Additive(_vector(pp1, 5), 8.0))
        spec = [spec, steer_at(f"mlp_out.{pp1.n_layers - 1}", Additive(_vector(pp1, 6), 2.0))]
        got = run(pp2.capture([ids], addresses, steering=spec))
        want = run(pp1.capture([ids], addresses, steering=spec))
        assert max(max_abs_diffs(got, want, addresses).values()) <= WITHIN
    finally:
        stop(pp1)
