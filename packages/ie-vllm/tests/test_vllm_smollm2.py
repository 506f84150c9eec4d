"""The hooked vLLM backend on SmolLM2-135M (real weights, fp32, CPU), one engine for the module.

Reference: the eager backend (HF transformers with hooks). Tolerances: 1e-4 between engines
(different kernels: vLLM's CPU attention and fused add-norm against HF eager); 1e-5 within vLLM.
"""

from __future__ import annotations

import asyncio
import json
import os
from pathlib import Path
from typing import Any

import pytest
import torch
from ie_core import Additive, Orthogonal, PositionMask, ProjectionCap, SamplingParams, steer_at
from ie_core.embedded import EmbeddedPrompt
from ie_core.errors import (
    BadPromptError,
    LayerOutOfRangeError,
    PointUnavailableError,
    SteeringSpecError,
    UnsupportedOperationError,
)
from ie_core.experiments.patching import logit_diff, patch_sweep, patch_sweep_async
from ie_core.experiments.user_hooks import run_with_hooks
from ie_core.ops import Patch, Scale
from ie_core.runner import run
from ie_core.sync import SyncModel
from vllm_embedded_checks import (
    all_layer_reads_in_one_batch_match_eager,
    embedded_generation_and_rows_match,
)
from vllm_parity import PROMPT_TEXT, by_point, max_abs_diffs, scaled_diffs, servable_addresses
from vllm_support import check_released, registered_keys, requires_vllm

pytestmark = [pytest.mark.slow, requires_vllm]

# Tolerances are on max|diff| / max(1, max|reference|): SmolLM2 has massive activations (hundreds
# at the first positions), where an fp32 sum in another order differs by 1e-2 absolute.
CROSS = 1e-4  # vLLM against eager
WITHIN = 1e-5  # vLLM against itself (batched vs alone)


def test_every_servable_point_matches_eager(smollm2: Any, smollm2_eager: Any) -> None:
    ids = smollm2.to_tokens(PROMPT_TEXT)
    assert ids == smollm2_eager.to_tokens(PROMPT_TEXT)
    addresses = servable_addresses(smollm2)
    names = {a.split(".")[0] for a in addresses}
    assert len(names) == 20  # Llama: the 32 vLLM points less QK-norm (4), router, streams (7)
    got = run(smollm2.capture([ids], addresses))
    want = run(smollm2_eager.capture([ids], addresses))
    diffs = scaled_diffs(got, want, addresses)
    if out := os.environ.get("IE_VLLM_PARITY_OUT"):  # the parity table of the closing note
        table = {"abs": by_point(max_abs_diffs(got, want, addresses)), "scaled": by_point(diffs)}
        Path(out).write_text(json.dumps(table, indent=1))
    worst = max(diffs, key=diffs.__getitem__)
    assert diffs[worst] <= CROSS, f"{worst}: {diffs[worst]}"
    # Negative control: a neighbouring layer is far off, so the comparison can fail.
    assert (got["resid_post.10"] - want["resid_post.11"]).abs().max() > 1e-2


def test_greedy_generation_matches_eager(smollm2: Any, smollm2_eager: Any) -> None:
    params = SamplingParams(max_new_tokens=6)
    ids = smollm2.to_tokens("The capital of France is")
    got = run(smollm2.generate(ids, params))
    want = run(smollm2_eager.generate(ids, params))
    assert got.token_ids == want.token_ids
    assert "Paris" in got.text


def test_capture_generation_rows_match_eager(smollm2: Any, smollm2_eager: Any) -> None:
    params = SamplingParams(max_new_tokens=5, stop_at_eos=False)
    ids = smollm2.to_tokens("Count with me: one, two,")
    points = ["resid_post.3", "attn_probs.2", "mlp_out.29", "embeddings"]
    got = run(smollm2.capture_generation(ids, points, params))
    want = run(smollm2_eager.capture_generation(ids, points, params))
    assert got.generation.token_ids == want.generation.token_ids
    n = len(ids) + len(got.generation.token_ids) - 1
    assert got.cache["resid_post.3"].shape == (1, n, smollm2.d_model)
    diffs = scaled_diffs(got.cache, want.cache, points)
    assert max(diffs.values()) <= CROSS, diffs


def test_a_capture_over_the_workers_row_limit_is_refused_up_front(smollm2: Any) -> None:
    """The limit is the workers' own (`ie_row_limit`: the CPU default here); a request whose rows
    alone exceed it is refused before it is submitted, with the bytes; one that fits runs."""
    from ie_core.sync import unwrap
    from ie_vllm.row_budget import CPU_LIMIT_BYTES

    admission = unwrap(smollm2).admission
    assert admission.row_limit == CPU_LIMIT_BYTES
    ids = smollm2.to_tokens("Count with me: one, two,")
    params = SamplingParams(max_new_tokens=5, stop_at_eos=False)
    points = [f"resid_post.{i}" for i in range(smollm2.n_layers)]
    need = (len(ids) + 5) * len(points) * smollm2.d_model * 4  # float32 rows, every layer
    try:
        admission.row_limit = need - 1
        with pytest.raises(UnsupportedOperationError, match=f"{need:,} bytes"):
            run(smollm2.capture_generation(ids, points, params))
        admission.row_limit = len(ids) * len(points) * smollm2.d_model * 4 - 1
        with pytest.raises(UnsupportedOperationError, match="worker holds before the drain"):
            run(smollm2.capture([ids], points))
        admission.row_limit = need  # negative control: exactly what it needs
        got = run(smollm2.capture_generation(ids, points, params))
        assert got.cache["resid_post.0"].shape[1] == len(ids) + 4
    finally:
        admission.row_limit = CPU_LIMIT_BYTES


def test_streaming_capture_yields_rows_as_tokens_arrive(smollm2: Any) -> None:
    params = SamplingParams(max_new_tokens=4, stop_at_eos=False)
    ids = smollm2.to_tokens("Once upon a time")
    points = ["resid_post.7", "attn_scores.1"]
    whole = run(smollm2.capture_generation(ids, points, params))

    async def collect() -> list[Any]:
        return [item async for item in smollm2.capture_generation_stream(ids, points, params)]

    items = run(collect())
    tokens = tuple(chunk.token_id for chunk, _ in items)
    assert tokens == whole.generation.token_ids
    sizes = [cache["resid_post.7"].shape[1] for _, cache in items]
    assert sizes == [len(ids), 1, 1, 1]
    rows = torch.cat([cache["resid_post.7"] for _, cache in items], dim=1)
    scale = max(1.0, float(whole.cache["resid_post.7"].abs().max()))
    assert (rows - whole.cache["resid_post.7"]).abs().max() <= WITHIN * scale
    # Streamed attention rows are the query rows of the full map.
    full = whole.cache["attn_scores.1"]
    last = items[-1][1]["attn_scores.1"]
    assert last.shape == (1, full.shape[1], 1, full.shape[-1])
    scale = max(1.0, float(full[0, :, -1].masked_fill(full[0, :, -1] < -1e30, 0).abs().max()))
    assert (last[0, :, 0] - full[0, :, -1]).abs().max() <= WITHIN * scale


def _unit(width: int, seed: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    v = torch.randn(width, generator=g)
    return v / v.norm()


def _specs(d: int, i: int) -> list[Any]:
    """A different steering set per request index (none for some)."""
    kind = i % 4
    if kind == 0:
        return []
    if kind == 1:
        return [steer_at(f"resid_post.{i % 6}", Additive(_unit(d, i), 8.0))]
    if kind == 2:
        return [
            steer_at(
                f"mlp_out.{i % 5}",
                Orthogonal(_unit(d, i), 0.0),
                ProjectionCap(_unit(d, i + 1), max=0.5),
            )
        ]
    return [steer_at("resid_pre.4", Additive(_unit(d, i), 5.0), mask=PositionMask((0, 1)))]


def test_sixteen_concurrent_requests_each_equal_their_serial_run(smollm2: Any) -> None:
    d = smollm2.d_model
    words = [
        "alpha",
        "beta",
        "gamma",
        "delta",
        "epsilon",
        "zeta",
        "eta",
        "theta",
        "iota",
        "kappa",
        "lambda",
        "mu",
        "nu",
        "xi",
    ]
    prompts = [smollm2.to_tokens(" ".join(words[: 3 + i % 9]) + f" {i}") for i in range(16)]
    point_sets = [
        [
            f"resid_post.{i % 30}",
            f"attn_out.{(i * 7) % 30}",
            "final_norm" if i % 3 == 0 else f"z.{i % 30}",
        ]
        for i in range(16)
    ]
    specs = [_specs(d, i) for i in range(16)]

    async def together() -> list[Any]:
        return list(
            await asyncio.gather(
                *(
                    smollm2.capture([p], pts, steering=s)
                    for p, pts, s in zip(prompts, point_sets, specs, strict=True)
                )
            )
        )

    batched = run(together())
    for i in range(16):
        alone = run(smollm2.capture([prompts[i]], point_sets[i], steering=specs[i]))
        diffs = scaled_diffs(batched[i], alone, point_sets[i])
        assert max(diffs.values()) <= WITHIN, (i, diffs)
    # Negative control: steering changed what it touched (request 1 steers resid_post.1).
    plain = run(smollm2.capture([prompts[1]], ["resid_post.1"]))
    assert (plain["resid_post.1"] - batched[1]["resid_post.1"]).abs().max() > 1.0
    stats = run(smollm2.stats())
    assert stats["registered"] == 0 and stats["hooks"] == {}


def test_requests_sharing_a_long_prefix_do_not_bleed(smollm2: Any) -> None:
    prefix = smollm2.to_tokens(" ".join(["the shared prefix is long and identical"] * 6))
    a = [*prefix, *smollm2.to_tokens(" apples", prepend_bos=False)]
    b = [*prefix, *smollm2.to_tokens(" pears", prepend_bos=False)]
    points = ["resid_post.12", "resid_post.25"]
    # Seed the prefix cache with plain generation (which keeps prefix caching).
    run(smollm2.generate(b, SamplingParams(max_new_tokens=2)))
    alone = run(smollm2.capture([b], points))
    assert alone["resid_post.12"].shape[1] == len(b)  # salted: every position ran, none cached
    steer = steer_at("resid_post.3", Additive(_unit(smollm2.d_model, 3), 20.0))

    async def together() -> tuple[Any, Any]:
        sa, sb = await asyncio.gather(
            smollm2.capture([a], points, steering=steer), smollm2.capture([b], points)
        )
        return sa, sb

    steered_a, plain_b = run(together())
    diffs = scaled_diffs(plain_b, alone, points)
    assert max(diffs.values()) <= WITHIN, diffs
    # A's steered prefix really differs from B's (so B would show a bleed).
    n = len(prefix)
    gap = (steered_a["resid_post.12"][:, :n] - plain_b["resid_post.12"][:, :n]).abs().max()
    assert gap > 1.0
    # And a steered generation leaves no steered KV behind for a later plain request.
    run(smollm2.generate(a, SamplingParams(max_new_tokens=2), steering=steer))
    again = run(smollm2.capture([b], points))
    assert max(scaled_diffs(again, alone, points).values()) <= WITHIN


def test_steering_matches_eager_tokens_and_post_steer_tensors(
    smollm2: Any, smollm2_eager: Any
) -> None:
    d = smollm2.d_model
    ids = smollm2.to_tokens("My favourite food is")
    steering = [
        steer_at("resid_post.8", Additive(_unit(d, 11), 6.0), mask=PositionMask((0,))),
        steer_at(
            "mlp_out.12",
            Orthogonal(_unit(d, 12), 0.0),
            ProjectionCap(_unit(d, 13), min=-0.2, max=0.2),
        ),
    ]
    params = SamplingParams(max_new_tokens=6, stop_at_eos=False)
    points = ["resid_post.8", "mlp_out.12", "resid_post.29"]
    got = run(smollm2.capture_generation(ids, points, params, steering=steering))
    want = run(smollm2_eager.capture_generation(ids, points, params, steering=steering))
    assert got.generation.token_ids == want.generation.token_ids
    diffs = scaled_diffs(got.cache, want.cache, points)
    assert max(diffs.values()) <= CROSS, diffs
    # Post-steer: the masked position 0 is untouched, later positions moved.
    plain = run(smollm2.capture([ids], ["resid_post.8"]))
    steered = got.cache["resid_post.8"][:, : len(ids)]
    assert (steered[:, 0] - plain["resid_post.8"][:, 0]).abs().max() == 0
    delta = steered[:, 1:] - plain["resid_post.8"][:, 1:]
    scale = max(1.0, float(plain["resid_post.8"].abs().max()))
    want_delta = (6.0 * _unit(d, 11)).expand(1, len(ids) - 1, d)
    assert (delta - want_delta).abs().max() <= 1e-5 * scale


def test_queries_and_keys_read_and_steer_as_on_eager(smollm2: Any, smollm2_eager: Any) -> None:
    """q / k from the fused projection, q_rot / k_rot from attention's own arguments (#47): each
    read equals eager, and writes at q and k_rot move the attention pattern as eager's do."""
    ids = smollm2.to_tokens("My favourite food is")
    reads = ["q.3", "k.3", "q_rot.3", "k_rot.3", "attn_probs.3", "attn_probs.7", "resid_post.29"]
    plain = run(smollm2.capture([ids], reads))
    diffs = scaled_diffs(plain, run(smollm2_eager.capture([ids], reads)), reads)
    assert max(diffs.values()) <= CROSS, diffs
    # Negative control: after the rotary embedding the rows past position 0 differ.
    moved = (plain["q_rot.3"][:, 1:] - plain["q.3"][:, 1:]).abs().max()
    assert float(moved) > 1e-2 * float(plain["q.3"].abs().max())
    # One vector added to every key shifts each query's scores by a constant (no softmax moves),
    # so position 0's key is held out: then the write at k_rot.7 alone moves layer 7's pattern.
    k_write = steer_at(
        "k_rot.7", Additive(_unit(smollm2.point_width("k_rot.7"), 22), 8.0), mask=PositionMask((0,))
    )
    only_k = run(smollm2.capture([ids], reads, steering=k_write))
    assert (only_k["attn_probs.7"] - plain["attn_probs.7"]).abs().max() > 1e-2
    assert (only_k["attn_probs.3"] - plain["attn_probs.3"]).abs().max() == 0  # upstream: untouched
    steering = [steer_at("q.3", Additive(_unit(smollm2.point_width("q.3"), 21), 8.0)), k_write]
    got = run(smollm2.capture([ids], reads, steering=steering))
    want = run(smollm2_eager.capture([ids], reads, steering=steering))
    diffs = scaled_diffs(got, want, reads)
    assert max(diffs.values()) <= CROSS, diffs
    assert max(scaled_diffs(only_k, run(smollm2_eager.capture([ids], reads, steering=k_write)),
                            reads).values()) <= CROSS  # fmt: skip
    for address in ("attn_probs.3", "attn_probs.7"):  # the writes really moved each pattern
        assert (got[address] - plain[address]).abs().max() > 1e-3
    params = SamplingParams(max_new_tokens=4, stop_at_eos=False)
    tokens = run(smollm2.generate(ids, params, steering=steering)).token_ids
    assert tokens == run(smollm2_eager.generate(ids, params, steering=steering)).token_ids


def test_lens_topk_in_the_worker_matches_eager(smollm2: Any, smollm2_eager: Any) -> None:
    ids = smollm2.to_tokens("The capital of France is")
    rows = run(smollm2.capture([ids], ["resid_post.29", "resid_post.15"]))
    h = torch.cat([rows["resid_post.29"][0], rows["resid_post.15"][0]])
    got = run(smollm2.decode_residuals_topk(h, 5))
    want = run(smollm2_eager.decode_residuals_topk(h, 5))
    assert got.ids.shape == (h.shape[0], 5)
    assert torch.equal(got.ids, want.ids)
    assert (got.probs - want.probs).abs().max() <= CROSS
    logits = run(smollm2.decode_residuals(h[:3]))
    ref = run(smollm2_eager.decode_residuals(h[:3]))
    assert (logits - ref).abs().max() <= CROSS * max(1.0, float(ref.abs().max()))
    # The last layer's lens at the last position predicts the generated token.
    top = int(got.ids[len(ids) - 1, 0])
    assert top == run(smollm2.generate(ids, SamplingParams(max_new_tokens=1))).token_ids[0]


def test_sync_mirror_and_refusals_on_the_real_engine(smollm2: Any) -> None:
    sync = SyncModel(smollm2)
    cache = sync.capture("Hello there", ["resid_post.0"])
    assert cache["resid_post.0"].shape[-1] == smollm2.d_model
    chunks = list(
        sync.generate_stream("Hello", SamplingParams(max_new_tokens=3, stop_at_eos=False))
    )
    assert len(chunks) == 3
    with pytest.raises(PointUnavailableError, match="unreachable on vLLM"):
        sync.capture("Hello", ["mlp_pre.3"])
    with pytest.raises(PointUnavailableError, match="qk norm"):
        sync.capture("Hello", ["q_norm_in.3"])
    with pytest.raises(LayerOutOfRangeError):
        sync.capture("Hello", ["resid_post.30"])
    stats = run(smollm2.stats())
    assert stats["registered"] == 0 and stats["hooks"] == {}


# -- causal interventions: patching sweeps, ablation, isolation ------------------------------------

CLEAN = "The Eiffel Tower is in the city of"
CORRUPT = "The Colosseum is in the city of"


def test_patch_sweep_equals_eager_and_self_patch_is_the_identity(
    smollm2: Any, smollm2_eager: Any
) -> None:
    """Eager's sweep equals hand-written HF hooks (test_eager_patching.py); here vLLM equals it."""
    metric = logit_diff(" Paris", " Rome")
    layers = (0, 9, 29)
    got = patch_sweep(smollm2, CLEAN, CORRUPT, metric=metric, layers=layers)
    want = patch_sweep(smollm2_eager, CLEAN, CORRUPT, metric=metric, layers=layers)
    scale = float(want.values.abs().max())
    assert (got.values - want.values).abs().max() <= CROSS * scale
    assert abs(got.clean - want.clean) <= CROSS * scale
    # The clean run patched into itself (every cell batched with the others) changes nothing.
    same = patch_sweep(smollm2, CLEAN, CLEAN, metric=metric, layers=(4, 20))
    assert (same.values - same.clean).abs().max() <= WITHIN * scale
    # Negative control: patching matters (the subject token restores most of the answer).
    assert float(got.normalized()[0, 2]) > 0.5
    heads = patch_sweep(smollm2, CLEAN, CORRUPT, metric=metric, point="z", layers=(8,), heads=True)
    want_heads = patch_sweep(
        smollm2_eager, CLEAN, CORRUPT, metric=metric, point="z", layers=(8,), heads=True
    )
    assert (heads.values - want_heads.values).abs().max() <= CROSS * scale


def test_a_sweeps_control_plane_does_not_grow_with_its_cells(
    smollm2: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Each cell's spec rides in its request's extra_args and finished cells' rows come back in
    coalesced drains, so a four-times-larger grid costs about the same worker calls (it cost two
    per cell when each spec was registered and collected by its own call)."""
    from collections import Counter

    from ie_core.sync import unwrap

    llm = unwrap(smollm2).flow.engine.llm
    calls: Counter[str] = Counter()
    real = llm.collective_rpc

    async def counted(method: str, *args: Any, **kwargs: Any) -> Any:
        calls[method] += 1
        return await real(method, *args, **kwargs)

    monkeypatch.setattr(llm, "collective_rpc", counted)
    metric = logit_diff(" Paris", " Rome")
    small = patch_sweep(smollm2, CLEAN, CORRUPT, metric=metric, layers=(6,))
    few = sum(calls.values())
    calls.clear()
    big = patch_sweep(smollm2, CLEAN, CORRUPT, metric=metric, layers=(3, 6, 9, 12))
    cells = big.values.numel()
    assert cells >= 4 * 8
    assert "ie_register" not in calls and "ie_collect" not in calls, calls
    assert "ie_decode" not in calls, calls  # the metric's logits are reduced in the worker
    assert sum(calls.values()) <= max(few + 4, cells // 4), (few, dict(calls), cells)
    # The same cell computed in a small and a large batch is the same number.
    scale = float(big.values.abs().max())
    assert (big.values[1] - small.values[0]).abs().max() <= WITHIN * scale


def test_final_token_logits_in_the_worker_equal_the_decoded_last_row(smollm2: Any) -> None:
    """The terminal reducer (final norm, unembed, chosen ids, logsumexp on the last row only)
    equals the full logits of the captured last-layer row decoded by the lens, plain and
    steered; the steered request's numbers differ (a control that the steering reached them)."""
    from ie_core.sync import unwrap

    model = unwrap(smollm2)
    ids = smollm2.to_tokens(CORRUPT)
    tokens = [int(smollm2.to_tokens(t, prepend_bos=False)[0]) for t in (" Paris", " Rome")]
    spec = steer_at("resid_post.10", Additive(_unit(smollm2.d_model, 3), 40.0))
    selected, lse = run(model.final_token_logits([ids, ids], [None, spec], tokens))
    last = f"resid_post.{smollm2.n_layers - 1}"
    rows = torch.cat([run(smollm2.capture([ids], [last], steering=s))[last][:, -1]
                      for s in (None, spec)])  # fmt: skip
    logits = run(smollm2.decode_residuals(rows)).float()
    scale = float(logits.abs().max())
    assert selected.shape == (2, 2) and lse.shape == (2,)
    assert (selected - logits[:, tokens]).abs().max() <= WITHIN * scale
    assert (lse - torch.logsumexp(logits, -1)).abs().max() <= WITHIN * scale
    assert (selected[0] - selected[1]).abs().max() > 1e-2  # steered: not the plain numbers
    with pytest.raises(BadPromptError, match="vocabulary"):
        run(model.final_token_logits([ids], [None], [10**9]))
    assert run(smollm2.stats())["registered"] == 0


def _mixed(i: int, d: int, source: Any) -> tuple[list[str], Any]:
    """Request i of the isolation test: a patch, a scale, steering, or nothing."""
    kind = i % 4
    layer = 2 + i % 7
    if kind == 0:
        pos = i % 9
        patch = Patch.from_cache(source, f"resid_pre.{layer}", (pos,))
        return ["resid_post.20"], steer_at(f"resid_pre.{layer}", patch)
    if kind == 1:
        return ["resid_post.20", f"mlp_out.{layer}"], steer_at(f"mlp_out.{layer}", Scale(i / 10))
    if kind == 2:
        return ["resid_post.20"], steer_at(f"resid_post.{layer}", Additive(_unit(d, i), 6.0))
    return ["resid_post.20", f"z.{layer}"], None


def test_thirty_two_mixed_patch_requests_each_equal_their_serial_run(smollm2: Any) -> None:
    ids = smollm2.to_tokens(CORRUPT)
    source = run(smollm2.capture([smollm2.to_tokens(CLEAN)], [f"resid_pre.{i}" for i in range(30)]))
    requests = [_mixed(i, smollm2.d_model, source) for i in range(32)]

    async def together() -> list[Any]:
        return list(
            await asyncio.gather(*(smollm2.capture([ids], p, steering=s) for p, s in requests))
        )

    batched = run(together())
    for i, (points, spec) in enumerate(requests):
        alone = run(smollm2.capture([ids], points, steering=spec))
        assert max(scaled_diffs(batched[i], alone, points).values()) <= WITHIN, i
    plain = run(smollm2.capture([ids], ["resid_post.20"]))
    # Negative controls: a patch at the last position and an additive steer moved the rows.
    assert (batched[8]["resid_post.20"] - plain["resid_post.20"]).abs().max() > 1e-2
    assert (batched[2]["resid_post.20"] - plain["resid_post.20"]).abs().max() > 1e-2
    assert (batched[3]["resid_post.20"] - plain["resid_post.20"]).abs().max() == 0


def test_a_cancelled_sweep_leaves_the_worker_registry_empty(smollm2: Any) -> None:
    async def cancel_midway() -> None:
        task = asyncio.ensure_future(
            patch_sweep_async(smollm2, CLEAN, CORRUPT, metric=logit_diff(" Paris", " Rome"))
        )
        await asyncio.sleep(1.0)
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        await asyncio.sleep(0.5)

    run(cancel_midway())
    stats = run(smollm2.stats())
    assert stats["registered"] == 0 and stats["hooks"] == {}, stats
    with pytest.raises(UnsupportedOperationError, match="does not ship"):
        run_with_hooks(smollm2, "Hello", [("resid_pre.1", lambda x, a: x)])


def test_harvest_rows_match_one_window_captures_and_resume(
    smollm2: Any, smollm2_eager: Any, tmp_path: Path
) -> None:
    from ie_core.harvest import harvest
    from vllm_harvest_checks import OPTIONS, POINTS, check_resume, check_rows, corpus

    path = tmp_path / "corpus.txt"
    docs = corpus(path)
    out = tmp_path / "harvest"
    harvest(smollm2, out, POINTS, files=[path], **OPTIONS)
    worst = check_rows(smollm2, smollm2_eager, out, docs)
    assert worst["vllm"] < CROSS and worst["eager"] < CROSS, worst
    assert worst["neighbour"] > 1e-2, worst  # negative control: the next row differs
    assert check_resume(smollm2, path, out) < WITHIN


def test_the_leak_check_catches_a_request_left_registered(
    smollm2: Any, request: pytest.FixtureRequest
) -> None:
    """Negative control of conftest's `_leaves_nothing_registered` on this module's engine: a
    request whose carried spec the worker registered, never collected nor released, is named with
    the test by the same two calls the check makes."""
    from ie_core import SamplingParams
    from ie_core.sync import unwrap
    from ie_vllm.specs import RequestSpec

    assert "_leaves_nothing_registered" in request.fixturenames  # the check runs after each test
    flow = unwrap(smollm2).flow
    before = registered_keys(smollm2)

    async def leak() -> None:
        spec = RequestSpec(key="leak-probe", captures=("resid_post.1",), prompt_len=3)
        sub = await flow.submission((1, 2, 3), SamplingParams(max_new_tokens=1), spec)
        async for _ in flow.engine.stream(sub):
            pass

    run(flow.on_engine(leak()))
    try:
        leaked = registered_keys(smollm2)
        assert leaked == sorted([*before, "leak-probe"])
        with pytest.raises(AssertionError) as caught:
            check_released(request.node.nodeid, before, leaked)
        assert request.node.nodeid in str(caught.value)
        assert "'leak-probe'" in str(caught.value)
    finally:
        run(flow.on_engine(flow.release("leak-probe")))
    check_released(request.node.nodeid, before, registered_keys(smollm2))  # released: passes


def test_circuit_graph_on_vllm_equals_eager(smollm2: Any, smollm2_eager: Any) -> None:
    """ie_core.circuits.attribute with the forward on vLLM (the backward on the CPU through the
    frozen replacement, with the weights eager loaded) gives eager's graph: the same nodes, the
    adjacency and inputs within CROSS relative; completeness holds on vLLM's own capture; so does
    attribute_many's graph of each prompt of a batch."""
    from ie_core.circuits import (
        ReplacementUnsupportedError,
        TranscoderSet,
        attribute,
        attribute_many,
        random_transcoder,
    )
    from ie_core.circuits.weights import weights_for
    from ie_core.sync import unwrap

    ts = TranscoderSet.of([random_transcoder(576, 16, i, seed=300 + i) for i in range(30)])
    with pytest.raises(ReplacementUnsupportedError, match="weights="):
        attribute(smollm2, "Paris is", ts)  # the weights live in the workers: refused up front
    weights = weights_for(unwrap(smollm2_eager))
    got = attribute(smollm2, "The capital of France is", ts, weights=weights)
    want = attribute(smollm2_eager, "The capital of France is", ts)
    assert torch.equal(got.active_features, want.active_features)
    assert [t.token_id for t in got.logit_targets] == [t.token_id for t in want.logit_targets]
    scale = float(want.adjacency.abs().max())
    assert float((got.adjacency - want.adjacency).abs().max()) <= CROSS * scale
    assert float((got.node_inputs - want.node_inputs).abs().max()) <= CROSS * float(
        want.node_inputs.abs().max()
    )
    rows = torch.cat([torch.arange(got.n_features), torch.arange(got.logit_offset, got.n_nodes)])
    a, bias, inputs = got.adjacency[rows], got.node_bias[rows], got.node_inputs[rows]
    gap = (a.sum(1) + bias - inputs).abs() / (a.abs().sum(1) + bias.abs() + inputs.abs())
    assert float(gap.max()) <= WITHIN
    # Two prompts of different lengths from one batched capture: each is eager's graph.
    prompts = ["The capital of France is", "Paris is"]
    many = attribute_many(smollm2, prompts, ts, weights=weights)
    for g, prompt in zip(many, prompts, strict=True):
        ref = want if prompt == prompts[0] else attribute(smollm2_eager, prompt, ts)
        assert torch.equal(g.active_features, ref.active_features)
        scale = float(ref.adjacency.abs().max())
        assert float((g.adjacency - ref.adjacency).abs().max()) <= CROSS * scale


def test_graph_interventions_on_vllm_equal_eager(smollm2: Any, smollm2_eager: Any) -> None:
    """ie_core.circuits.intervene: each transcoder clamp judged at mlp_in.L in the worker and
    written at mlp_out.L (every later layer for a CLT) gives eager's logits (CROSS), prompt and
    greedy generation; the clamps move the logits; vllm-static's refusal is named up front."""
    from ie_core.circuits import (
        FeatureIntervention,
        TranscoderSet,
        clamp_steering,
        intervene,
        random_transcoder,
    )
    from ie_core.circuits.clt import random_clt

    prompt = "The capital of France is"
    n = len(smollm2.to_tokens(prompt))
    per_layer = TranscoderSet.of([random_transcoder(576, 16, i, seed=300 + i) for i in range(30)])
    cases = [
        (per_layer, [FeatureIntervention(3, 2, 8.0), FeatureIntervention(10, 5, 0.0, (2, 4)),
                     FeatureIntervention(20, 1, -6.0, (n - 1,))]),
        (random_clt(576, 16, 30, seed=5), [FeatureIntervention(4, 3, 5.0)]),
    ]  # fmt: skip
    for ts, ivs in cases:
        got, want = intervene(smollm2, prompt, ts, ivs), intervene(smollm2_eager, prompt, ts, ivs)
        scale = max(1.0, float(want.logits_after.abs().max()))
        for a, b in (
            (got.logits_after, want.logits_after),
            (got.logits_before, want.logits_before),
        ):
            assert float((a - b).abs().max()) <= CROSS * scale
        assert float((want.logits_after - want.logits_before).abs().max()) > 100 * CROSS * scale
    params = SamplingParams(max_new_tokens=5, stop_at_eos=False)
    steering = clamp_steering(per_layer, [FeatureIntervention(3, 2, 40.0)])
    ids = smollm2.to_tokens(prompt)
    assert (
        run(smollm2.generate(ids, params, steering=steering)).token_ids
        == run(smollm2_eager.generate(ids, params, steering=steering)).token_ids
    )
    assert run(smollm2.stats())["registered"] == 0


# -- conditional steering (#46): the worker applies the op through ie_core.ops.apply --

COND_AT = "resid_post.8"


def _midway(scores: torch.Tensor, k: int) -> float:
    """A threshold in the k-th widest gap between interior sorted scores, so that no row sits
    near it (vLLM's rows differ from eager's by 1e-4 relative) and rows fall on both sides."""
    s = scores.double().sort().values[1:-1]
    gaps = s[1:] - s[:-1]
    i = int(gaps.argsort(descending=True)[k % len(gaps)])
    return float(s[i] + s[i + 1]) / 2


def test_conditional_steering_matches_eager_with_never_and_always_controls(
    smollm2: Any, smollm2_eager: Any
) -> None:
    from ie_core.ops import Conditional

    d = smollm2.d_model
    ids = smollm2.to_tokens("My favourite food is pizza with extra cheese and basil")
    probe, vector = _unit(d, 21), 6.0 * _unit(d, 22)
    rows = run(smollm2_eager.capture([ids], [COND_AT]))[COND_AT][0]
    threshold = _midway(rows @ probe, 0)
    op = Conditional(Additive(vector, 1.0), probe, 0.0, threshold)
    held = op.holds(rows)
    assert 0 < int(held.sum()) < len(ids)
    points = [COND_AT, "resid_post.20"]
    got = run(smollm2.capture([ids], points, steering=steer_at(COND_AT, op)))
    want = run(smollm2_eager.capture([ids], points, steering=steer_at(COND_AT, op)))
    assert max(scaled_diffs(got, want, points).values()) <= CROSS
    plain = run(smollm2.capture([ids], points))
    moved = (got[COND_AT] - plain[COND_AT])[0].abs().amax(-1)
    assert (moved[~held] == 0).all() and (moved[held] > 0.1).all()  # the definition, row by row
    never = Conditional(Additive(vector, 1.0), probe, threshold=1e30)
    assert (
        max(
            scaled_diffs(
                run(smollm2.capture([ids], points, steering=steer_at(COND_AT, never))),
                plain,
                points,
            ).values()
        )
        <= WITHIN
    )
    always = Conditional(Additive(vector, 1.0), probe, threshold=-1.0, activation="sigmoid")
    uncond = run(smollm2.capture([ids], points, steering=steer_at(COND_AT, Additive(vector))))
    assert (
        max(
            scaled_diffs(
                run(smollm2.capture([ids], points, steering=steer_at(COND_AT, always))),
                uncond,
                points,
            ).values()
        )
        <= WITHIN
    )
    params = SamplingParams(max_new_tokens=5, stop_at_eos=False)
    spec = steer_at(COND_AT, op)
    assert (
        run(smollm2.generate(ids, params, steering=spec)).token_ids
        == run(smollm2_eager.generate(ids, params, steering=spec)).token_ids
    )


def test_a_condition_read_at_an_earlier_point_matches_eager(
    smollm2: Any, smollm2_eager: Any
) -> None:
    """Judged at resid_post.8, written at mlp_out.14: the rows it steers are the rows where the
    earlier point's probe held (not the written point's), as on eager, prompt and generation."""
    from ie_core.ops import Conditional

    d = smollm2.d_model
    ids = smollm2.to_tokens("My favourite food is pizza with extra cheese and basil")
    probe, vector = _unit(d, 23), 6.0 * _unit(d, 24)
    rows = run(smollm2_eager.capture([ids], [COND_AT]))[COND_AT][0]
    op = Conditional(Additive(vector, 1.0), probe, 0.0, _midway(rows @ probe, 0), read=COND_AT)
    held = op.holds(rows)
    assert 0 < int(held.sum()) < len(ids)
    at, points = "mlp_out.14", ["mlp_out.14", "resid_post.20"]
    got = run(smollm2.capture([ids], points, steering=steer_at(at, op)))
    want = run(smollm2_eager.capture([ids], points, steering=steer_at(at, op)))
    assert max(scaled_diffs(got, want, points).values()) <= CROSS
    plain = run(smollm2.capture([ids], points))
    moved = (got[at] - plain[at])[0].abs().amax(-1)
    assert (moved[~held] == 0).all() and (moved[held] > 0.1).all()  # judged at resid_post.8
    params = SamplingParams(max_new_tokens=5, stop_at_eos=False)
    assert (
        run(smollm2.generate(ids, params, steering=steer_at(at, op))).token_ids
        == run(smollm2_eager.generate(ids, params, steering=steer_at(at, op))).token_ids
    )
    # One module's pre and post hooks are ordered: judged at its input, written at its output.
    block = Conditional(Additive(vector, 1.0), probe, read="resid_pre.14")
    got = run(smollm2.capture([ids], points, steering=steer_at("resid_post.14", block)))
    ref = run(smollm2_eager.capture([ids], points, steering=steer_at("resid_post.14", block)))
    assert max(scaled_diffs(got, ref, points).values()) <= CROSS
    # Two slices of one output (q and k of the fused qkv projection) are not: refused, with why.
    kv = _unit(3 * 64, 25)
    qk = Conditional(Additive(kv, 1.0), _unit(d, 26), read="q.14")
    with pytest.raises(RuntimeError, match="same module call"):
        run(smollm2.capture([ids], points, steering=steer_at("k.14", qk)))
    assert run(smollm2.stats())["registered"] == 0


def test_sixteen_concurrent_conditions_each_equal_their_serial_run(smollm2: Any) -> None:
    from ie_core.ops import Conditional

    d = smollm2.d_model
    prompts = [
        smollm2.to_tokens(f"Request {i}: the weather today is mild and {i * 3}") for i in range(16)
    ]
    scores = [
        run(smollm2.capture([p], [COND_AT]))[COND_AT][0] @ _unit(d, 30 + i % 4)
        for i, p in enumerate(prompts)
    ]
    # Odd requests write at resid_post.12 what their condition judged at resid_post.8.
    specs = [
        steer_at(
            "resid_post.12" if i % 2 else COND_AT,
            Conditional(
                Additive(_unit(d, 40 + i), 8.0),
                _unit(d, 30 + i % 4),
                0.0,
                _midway(scores[i], i),
                read=COND_AT if i % 2 else None,
            ),
        )
        for i in range(16)
    ]
    points = [COND_AT, "resid_post.15"]

    async def together() -> list[Any]:
        return list(
            await asyncio.gather(
                *(
                    smollm2.capture([p], points, steering=s)
                    for p, s in zip(prompts, specs, strict=True)
                )
            )
        )

    batched = run(together())
    for i in range(16):
        alone = run(smollm2.capture([prompts[i]], points, steering=specs[i]))
        assert max(scaled_diffs(batched[i], alone, points).values()) <= WITHIN, i
    plain = run(smollm2.capture([prompts[0]], [COND_AT]))[COND_AT]
    moved = (batched[0][COND_AT] - plain)[0].abs().amax(-1)
    assert 0 < int((moved > 0.1).sum()) < len(prompts[0])  # steered some rows, not all
    assert run(smollm2.stats())["registered"] == 0


def test_probe_scores_in_the_worker_equal_a_hand_computation_on_captured_rows(
    smollm2: Any,
) -> None:
    from ie_core.errors import SteeringSpecError

    d, at = smollm2.d_model, "resid_post.5"
    ids = smollm2.to_tokens("The probe reads every token of this sentence")
    rows = run(smollm2.capture([ids], [at]))[at].double()
    w = _unit(d, 50)
    got = run(smollm2.probe_scores([ids], at, w, bias=0.3, activation="sigmoid"))
    assert got.shape == (1, len(ids))
    assert float((got.double() - torch.sigmoid(rows @ w.double() + 0.3)).abs().max()) <= WITHIN
    m = torch.stack([_unit(d, 51), _unit(d, 52)], 1)
    got2 = run(smollm2.probe_scores([ids], at, m, bias=[0.1, -0.1]))
    want2 = rows @ m.double() + torch.tensor([0.1, -0.1], dtype=torch.float64)
    assert got2.shape == (1, len(ids), 2)
    assert float((got2.double() - want2).abs().max()) / max(1.0, float(want2.abs().max())) <= WITHIN
    # Under steering the probe reads the steered rows (the op runs before the reducer).
    spec = steer_at(at, Additive(10.0 * w))
    steered = run(smollm2.probe_scores([ids], at, w, steering=spec)).double()
    want3 = run(smollm2.capture([ids], [at], steering=spec))[at].double() @ w.double()
    assert float((steered - want3).abs().max()) / max(1.0, float(want3.abs().max())) <= WITHIN
    assert float((steered - got.logit()).abs().min()) > 1.0  # negative control: steering moved it
    with pytest.raises(SteeringSpecError, match="7 wide"):
        run(smollm2.probe_scores([ids], at, torch.ones(7)))
    with pytest.raises(SteeringSpecError, match="finite"):
        run(smollm2.probe_scores([ids], at, w, bias=float("nan")))
    assert run(smollm2.stats())["registered"] == 0


# TransformerLens's conventions (TransformerLens 4.3, unprocessed weights; stated as facts in
# packages/ie-eager/tests/test_eager_tl_weights.py): W_E [d_vocab, d_model], W_U [d_model, d_vocab],
# b_U zeros where the unembed has no bias.


def test_cfg_and_weights_by_transformer_lens_names_on_vllm(
    smollm2: Any, smollm2_eager: Any
) -> None:
    """cfg from the engine's HF config equals eager's (TransformerLens's names and values there);
    W_E / W_U / b_U read in the worker (padded vocabulary trimmed) equal the HF modules; the
    linear layers' weights, which vLLM's CPU platform packs away at load, are refused by name."""
    assert smollm2.cfg.to_dict() == smollm2_eager.cfg.to_dict()
    assert (smollm2.cfg.n_heads, smollm2.cfg.n_key_value_heads, smollm2.cfg.d_head) == (9, 3, 64)
    assert (smollm2.cfg.d_vocab, smollm2.cfg.d_mlp, smollm2.cfg.n_ctx) == (49152, 1536, 8192)
    hf = smollm2_eager.hf_model
    w_u, w_e = smollm2.W_U, smollm2.W_E
    assert tuple(w_u.shape) == (576, 49152) and tuple(w_e.shape) == (49152, 576)
    assert torch.equal(w_u, hf.lm_head.weight.T)  # negative control below: not the untransposed
    assert torch.equal(w_e, hf.model.embed_tokens.weight)
    assert torch.count_nonzero(smollm2.b_U) == 0 and tuple(smollm2.b_U.shape) == (49152,)
    x = torch.randn(576, generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        assert torch.allclose(x @ w_u, hf.lm_head(x), atol=1e-4)
    for name in ("W_Q", "W_K", "W_O", "W_in", "W_out"):
        with pytest.raises(UnsupportedOperationError, match=f"(?s)^{name}: .*packs"):
            getattr(smollm2, name)
    with pytest.raises(UnsupportedOperationError, match="W_pos"):
        smollm2.W_pos  # noqa: B018


def test_atlas_matches_eager(smollm2: Any, smollm2_eager: Any, tmp_path: Path) -> None:
    """`ie atlas` on the hooked engine (the features encoded in the worker) against eager:
    the same top-k keys and values per feature (1e-4 of the feature's scale), counts and band
    samples' keys, and each kept context's per-token activations."""
    from ie_core.atlas import open_atlas
    from ie_core.atlas.running import atlas
    from ie_core.experiments.saes import from_tensors

    g = torch.Generator().manual_seed(5)
    d, n = smollm2.d_model, 32
    sae = from_tensors(
        {"W_enc": torch.randn(d, n, generator=g) / d**0.5, "b_enc": torch.randn(n, generator=g) * 0.2 - 0.6,
         "W_dec": torch.randn(n, d, generator=g) / n**0.5, "b_dec": torch.zeros(d)},
        address="resid_post.3",
    )  # fmt: skip
    words = [
        "the",
        "river",
        "runs",
        "over",
        "blue",
        "Paris",
        "token",
        "model",
        "layer",
        "sky",
        "quickly",
        "42",
    ]
    docs = [" ".join(words[(i * 7 + j) % len(words)] for j in range(5 + i % 9)) for i in range(40)]
    options = {"context": 20, "top_k": 5, "samples": 2, "logits": 3, "batch_windows": 8}
    got = {}
    for name, model in (("vllm", smollm2), ("eager", smollm2_eager)):
        atlas(model, sae, tmp_path / name, documents=docs, progress=False, **options)
        got[name] = open_atlas(tmp_path / name)
    a, b = got["vllm"].state, got["eager"].state
    assert a.tokens == b.tokens > 200
    filled = b.top_sequence >= 0
    assert torch.equal(a.top_sequence >= 0, filled)
    scale = b.top_values[:, :1].clamp_min(1.0)
    assert (
        (a.top_values - b.top_values).abs()[filled] <= CROSS * scale.expand_as(filled)[filled]
    ).all()
    same_keys = (a.top_sequence == b.top_sequence) & (a.top_position == b.top_position)
    # Keys may swap only where two values lie within the tolerance of each other.
    for f, j in (~same_keys & filled).nonzero().tolist():
        assert (b.top_values[f] - a.top_values[f, j]).abs().min() <= CROSS * float(scale[f])
    assert (a.count - b.count).abs().max() <= 1
    ctx_a, ctx_b = got["vllm"].contexts["top_acts"], got["eager"].contexts["top_acts"]
    rows = same_keys & filled
    assert ((ctx_a - ctx_b).abs()[rows].amax(-1) <= CROSS * scale.expand_as(rows)[rows]).all()
    assert torch.equal(got["vllm"].logits["top_ids"], got["eager"].logits["top_ids"])
    # Negative control: against the eager values of the neighbouring feature, the check fails.
    both = filled & filled.roll(1, 0)
    shifted = (a.top_values - b.top_values.roll(1, 0)).abs()[both]
    assert not (shifted <= CROSS * scale.expand_as(both)[both]).all()


def test_generation_and_capture_from_embeddings_match_eager(
    smollm2: Any, smollm2_eager: Any
) -> None:
    embedded_generation_and_rows_match(smollm2, smollm2_eager, CROSS)


def test_patchscope_reads_of_every_layer_in_one_batch_match_eager(
    smollm2: Any, smollm2_eager: Any
) -> None:
    all_layer_reads_in_one_batch_match_eager(smollm2, smollm2_eager)


def test_embedded_prompt_of_the_wrong_width_is_refused_before_any_request(smollm2: Any) -> None:
    ids = smollm2.to_tokens("The capital of France is")
    before = registered_keys(smollm2)
    with pytest.raises(SteeringSpecError, match="width"):
        run(smollm2.generate(EmbeddedPrompt(ids, {1: torch.ones(smollm2.d_model - 1)})))
    assert registered_keys(smollm2) == before
    # the engine serves the next request as before
    assert run(smollm2.generate(ids, SamplingParams(max_new_tokens=2))).token_ids


def test_ie_fit_prices_the_weights_and_kv_cache_vllm_allocated(smollm2: Any) -> None:
    """`ie fit`'s weights and KV cache against what the engine's worker holds (`ie_memory`:
    parameters and buffers, the KV tensors, blocks x block size), within 10%; KV bytes per token
    exactly. Negative control: the KV priced at every query head (no GQA) is 3x off."""
    from dataclasses import replace

    from ie_core.fit import fit, model_shape, read_checkpoint
    from ie_core.sync import unwrap
    from ie_vllm.memory_prices import kv_bytes_per_token
    from vllm_support import MAX_MODEL_LEN, SMOLLM2

    (held,) = run(unwrap(smollm2).flow.engine.rpc("ie_memory"))
    report = fit(SMOLLM2, "vllm", max_model_len=MAX_MODEL_LEN)
    priced = {i.name: i.nbytes for i in report.items}
    assert abs(priced["weights"] - held["weights"]) <= 0.10 * held["weights"], (priced, held)
    # vllm_support sets VLLM_CPU_KVCACHE_SPACE, so the priced cache is that space.
    assert abs(priced["KV cache"] - held["kv_cache"]) <= 0.10 * held["kv_cache"], (priced, held)
    shape = model_shape(read_checkpoint(SMOLLM2).config)
    per_token = kv_bytes_per_token(shape, 4, MAX_MODEL_LEN)
    assert per_token == held["kv_cache"] / held["kv_tokens"]
    no_gqa = kv_bytes_per_token(replace(shape, n_kv_heads=shape.n_heads), 4, MAX_MODEL_LEN)
    assert abs(no_gqa - per_token) > 0.10 * per_token


# --- LoRA adapters per request (the shared engine starts with enable_lora=True) ------------------


@pytest.fixture(scope="module")
def lora_specs(smollm2_eager: Any, tmp_path_factory: pytest.TempPathFactory) -> Any:
    from vllm_lora_checks import adapters

    return adapters(smollm2_eager, tmp_path_factory.mktemp("lora"))


def test_lora_matches_eager_and_zero_b_is_base(
    smollm2: Any, smollm2_eager: Any, lora_specs: Any
) -> None:
    from vllm_lora_checks import check_matches_eager

    check_matches_eager(smollm2, smollm2_eager, lora_specs)


def test_lora_adapters_and_base_in_one_batch_equal_serial(
    smollm2: Any, smollm2_eager: Any, lora_specs: Any
) -> None:
    from vllm_lora_checks import check_batch

    check_batch(smollm2, smollm2_eager, lora_specs)


def test_lora_hostile_adapters_are_refused(smollm2: Any, tmp_path: Path) -> None:
    from ie_core import load_model
    from vllm_lora_checks import check_refusals

    other = load_model("ie-synthetic/llama", backend="eager", device="cpu", dtype="float32")
    check_refusals(smollm2, other.hf_model, tmp_path)
