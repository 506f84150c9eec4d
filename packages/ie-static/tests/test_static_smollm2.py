"""vllm-static on SmolLM2 (compiled CPU engine) against the hooked `vllm` backend (eager engine).

One static engine and one hooked engine serve the whole module. Tolerance: both run vLLM's fp32
kernels, but inductor fuses norms and adds, so rows differ in rounding only. Measured: max |diff|
/ max |row| up to 1.2e-5 at resid_post.29 after a write at layer 4 (rows reach ~140 there, |diff|
~3e-4); checked at 5e-5, far below the 1e-2 that the negative controls show for a wrong row.
"""

from __future__ import annotations

import asyncio

import pytest
import torch
from ie_core.errors import PointUnavailableError, SteeringSpecError
from ie_core.experiments.patching import logit_diff, patch_sweep_async
from ie_core.ops import (
    Additive,
    LensAblate,
    LensSteer,
    LensSwap,
    Orthogonal,
    Patch,
    PositionMask,
    ProjectionCap,
    Scale,
    steer_at,
)
from ie_core.protocol import SamplingParams
from ie_core.runner import run

pytestmark = [pytest.mark.slow, pytest.mark.timeout(1800)]  # engine start: compile on a busy CPU

MODEL = "HuggingFaceTB/SmolLM2-135M-Instruct"
N_LAYERS = 30
WIDTH = 576
EXTRA = ["resid_pre.4", "attn_out.4", "mlp_out.4"]
# Queries and keys (#47): pre-rotary slices of the qkv output, post-rotary attention arguments, and
# the maps recomputed from the latter (the write at k_rot.7 must reach attn_probs.7).
QK_READS = ["q.3", "k.3", "q_rot.3", "k_rot.3", "attn_probs.3", "k_rot.7", "attn_probs.7"]
QK_WRITES = ["q.3", "k_rot.7"]
READS = [f"resid_post.{i}" for i in range(N_LAYERS)] + EXTRA + QK_READS
WRITES = ["resid_post.10", *EXTRA, *QK_WRITES]
REL = 5e-5
CROSS = 1e-4  # against eager (HF's attention and unfused norms), as ie-vllm's SmolLM2 tests
PROMPTS = [
    "The capital of France is",
    "Water boils at a temperature of",
    "List three colours: red,",
    "In 1492, Columbus",
]


def _close(got: torch.Tensor, want: torch.Tensor) -> float:
    """Max |diff| relative to the largest value of the reference."""
    assert got.shape == want.shape, (got.shape, want.shape)
    return float((got.float() - want.float()).abs().max() / want.float().abs().max().clamp_min(1.0))


@pytest.fixture(scope="module")
def engines():
    from ie_static.backend import load
    from ie_vllm import load_hooked

    common = {"max_model_len": 512}
    static = load(MODEL, static_points=READS, static_writes=WRITES, **common)
    try:
        hooked = load_hooked(MODEL, **common)
    except BaseException:
        run(static.shutdown())
        raise
    yield static, hooked
    run(static.shutdown())
    run(hooked.shutdown())


@pytest.fixture(scope="module")
def eager_model():
    """The eager backend (HF transformers, no engine start): the reference for queries and keys."""
    from ie_core import load_model

    return load_model(MODEL, backend="eager", device="cpu", dtype="float32")


async def _all(*coros):
    return await asyncio.gather(*coros)


def _vec(seed: int) -> torch.Tensor:
    return torch.randn(WIDTH, generator=torch.Generator().manual_seed(seed))


def test_capture_equals_hooked_at_every_declared_site(engines) -> None:
    static, hooked = engines
    got = run(static.capture(PROMPTS[0], READS))
    want = run(hooked.capture(PROMPTS[0], READS))
    worst = max(_close(got[a], want[a]) for a in READS)
    assert worst <= REL, worst
    # Negative control: neighbouring layers differ by far more than the tolerance.
    assert _close(got["resid_post.3"], want["resid_post.4"]) > 1e-2


def test_capture_generation_equals_hooked_over_prompt_and_decode(engines) -> None:
    static, hooked = engines
    sp = SamplingParams(max_new_tokens=6, stop_at_eos=False)
    sites = ["resid_post.0", "resid_post.15", "resid_post.29", *EXTRA]
    got = run(static.capture_generation(PROMPTS[1], sites, sp))
    want = run(hooked.capture_generation(PROMPTS[1], sites, sp))
    assert got.generation.token_ids == want.generation.token_ids
    n = len(got.generation.prompt_ids) + 5
    for a in sites:
        assert got.cache[a].shape[1] == n
        assert _close(got.cache[a], want.cache[a]) <= REL


KINDS = {
    "additive": Additive(_vec(1), 6.0),
    "orthogonal": Orthogonal(_vec(2), 0.0),
    "projection_cap": ProjectionCap(_vec(3), min=20.0, max=30.0),  # always binds
    "lens_steer": LensSteer(_vec(4), 0.5, 0.25),
    "lens_ablate": LensAblate(_vec(5)),
    "lens_swap": LensSwap(_vec(6), _vec(7)),
}


@pytest.mark.parametrize("kind", list(KINDS))
def test_each_op_kind_with_a_mask_equals_hooked(engines, kind: str) -> None:
    static, hooked = engines
    spec = steer_at("resid_post.10", KINDS[kind], mask=PositionMask((0, 2)))
    sp = SamplingParams(max_new_tokens=4, stop_at_eos=False)
    sites = ["resid_post.10", "resid_post.20"]
    got = run(static.capture_generation(PROMPTS[0], sites, sp, steering=spec))
    want = run(hooked.capture_generation(PROMPTS[0], sites, sp, steering=spec))
    plain = run(hooked.capture_generation(PROMPTS[0], sites, sp))
    assert got.generation.token_ids == want.generation.token_ids
    for a in sites:
        assert _close(got.cache[a], want.cache[a]) <= REL
    # Masked prompt positions are untouched at the write site; the others moved (negative control).
    site = got.cache["resid_post.10"][0]
    base = plain.cache["resid_post.10"][0]
    assert _close(site[[0, 2]], base[[0, 2]]) <= REL
    assert _close(site[1:2], base[1:2]) > 1e-4


def test_writes_at_resid_pre_attn_out_mlp_out_equal_hooked(engines) -> None:
    static, hooked = engines
    specs = [steer_at(a, Additive(_vec(10 + i), 3.0)) for i, a in enumerate(EXTRA)]
    sites = ["resid_post.4", "resid_post.29"]
    got = run(static.capture(PROMPTS[2], sites, steering=specs))
    want = run(hooked.capture(PROMPTS[2], sites, steering=specs))
    plain = run(static.capture(PROMPTS[2], sites))
    for a in sites:
        assert _close(got[a], want[a]) <= REL
    assert _close(got["resid_post.4"], plain["resid_post.4"]) > 1e-3


def test_mixed_batch_of_steered_and_unsteered_requests(engines) -> None:
    """Requests submitted together, some steered (different ops and masks), equal their serial runs."""
    static, hooked = engines
    sp = SamplingParams(max_new_tokens=5, stop_at_eos=False)
    sites = ["resid_post.10", "resid_post.29"]
    plan = [
        (PROMPTS[0], None),
        (PROMPTS[1], steer_at("resid_post.10", KINDS["additive"])),
        (PROMPTS[2], None),
        (PROMPTS[3], steer_at("resid_post.10", KINDS["lens_swap"], mask=PositionMask((1,)))),
        (PROMPTS[0], steer_at("mlp_out.4", Additive(_vec(30), 2.0))),
        (PROMPTS[1], None),
    ]
    together = run(_all(*(static.capture_generation(p, sites, sp, steering=s) for p, s in plan)))
    for (p, s), got in zip(plan, together, strict=True):
        want = run(hooked.capture_generation(p, sites, sp, steering=s))
        assert got.generation.token_ids == want.generation.token_ids
        for a in sites:
            assert _close(got.cache[a], want.cache[a]) <= REL
    stats = run(static.flow.on_engine(static.engine.rpc("ie_static_stats")))
    assert stats[0]["registered"] == 0  # every slot and capture was released


def test_more_steered_requests_than_slots_wait_for_a_slot(engines) -> None:
    static, _ = engines
    n = static.config.slots + 3
    sp = SamplingParams(max_new_tokens=2, stop_at_eos=False)
    spec = steer_at("resid_post.10", KINDS["additive"])
    outs = run(_all(*(static.generate(PROMPTS[0], sp, steering=spec) for _ in range(n))))
    assert len({o.token_ids for o in outs}) == 1


def test_refusals_name_the_declared_set(engines) -> None:
    static, _ = engines
    with pytest.raises(PointUnavailableError, match=r"resid_post at layers 0\.\.29.*static_points"):
        run(static.capture(PROMPTS[0], ["resid_pre.7"]))
    with pytest.raises(PointUnavailableError, match="use backend='vllm'"):
        run(static.capture(PROMPTS[0], ["mlp_act.3"]))
    with pytest.raises(SteeringSpecError, match=r"writes only at .*static_writes"):
        run(static.generate(PROMPTS[0], steering=steer_at("resid_post.11", KINDS["additive"])))
    with pytest.raises(SteeringSpecError, match="static_max_ops"):
        run(
            static.generate(
                PROMPTS[0], steering=steer_at("resid_post.10", *([KINDS["additive"]] * 5))
            )
        )
    # capture_attention reads the declared attn_probs layers and no other.
    maps = run(static.capture_attention(PROMPTS[0]))
    assert {str(a) for a in maps} == {"attn_probs.3", "attn_probs.7"}
    with pytest.raises(PointUnavailableError, match=r"attn_probs\.5 is not a declared site"):
        run(static.capture_attention(PROMPTS[0], [5]))


def test_self_test_reads_and_sentinel_write(engines) -> None:
    """The self-test's read and its sentinel generations are the hooked engine's values."""
    from ie_static.backend import SELF_TEST_PROMPT

    static, hooked = engines
    report = run(static.self_test())
    ids = hooked.to_tokens(SELF_TEST_PROMPT)
    site = report["read_site"]
    want = float(run(hooked.capture(ids, [site]))[site].float().norm())
    assert abs(report["read_norm"] - want) <= REL * want
    write = report["write_site"]
    sp = SamplingParams(max_new_tokens=4, stop_at_eos=False)
    assert report["base"] == run(hooked.generate(ids, sp)).token_ids
    # The same sentinel as the self-test's: a unit vector times 50 mean row norms at its site.
    scale = 50.0 * float(run(hooked.capture(ids, [write]))[write].float().norm(dim=-1).mean())
    vector = torch.randn(WIDTH, generator=torch.Generator().manual_seed(0))
    sentinel = steer_at(write, Additive(vector / vector.norm(), scale))
    assert report["steered"] == run(hooked.generate(ids, sp, steering=sentinel)).token_ids
    assert report["base"] != report["steered"]  # negative control: the sentinel acts


CLEAN = "The Eiffel Tower is in the city of"
CORRUPT = "The Colosseum is in the city of"


def test_patch_sweep_and_ablations_equal_hooked(engines, monkeypatch) -> None:
    """The sweep at resid_pre.4 (a declared write site) cell for cell, zero and mean ablation of
    mlp_out.4 and a patch of every position, against the hooked engine (itself equal to eager's
    sweep, which equals hand-written HF hooks). The cells' specs and slots ride with their
    requests: the sweep makes no per-cell worker call."""
    from collections import Counter

    static, hooked = engines
    metric = logit_diff(" Paris", " Rome")
    calls: Counter[str] = Counter()
    real = static.engine.llm.collective_rpc

    async def counted(method, *args, **kwargs):
        calls[method] += 1
        return await real(method, *args, **kwargs)

    monkeypatch.setattr(static.engine.llm, "collective_rpc", counted)
    got = run(patch_sweep_async(static, CLEAN, CORRUPT, metric=metric, layers=(4,)))
    monkeypatch.undo()
    cells = got.values.numel()
    assert "ie_static_register" not in calls and "ie_static_collect" not in calls, calls
    assert "ie_decode" not in calls, calls  # the metric's logits are reduced in the worker
    # The source and the cells' drains: a handful of calls, where one register and one collect
    # per cell would be 2 * cells.
    assert cells >= 9 and sum(calls.values()) <= 6, (dict(calls), cells)
    want = run(patch_sweep_async(hooked, CLEAN, CORRUPT, metric=metric, layers=(4,)))
    scale = float(want.values.abs().max())
    assert (got.values - want.values).abs().max() <= REL * scale
    assert float(got.normalized()[0, 2]) > 0.5  # the subject token carries the answer
    same = run(patch_sweep_async(static, CLEAN, CLEAN, metric=metric, layers=(4,)))
    assert (same.values - same.clean).abs().max() <= REL * scale
    rows = run(hooked.capture(CLEAN, ["mlp_out.4"]))["mlp_out.4"][0]
    specs = [
        steer_at("mlp_out.4", Scale(0.0)),
        steer_at("mlp_out.4", Patch(rows.mean(0))),
        steer_at("mlp_out.4", Patch(rows[:9], positions=tuple(range(9)))),
        steer_at("mlp_out.4", Scale(0.5), Patch(rows[2], positions=(2, 5))),
    ]
    sites = ["mlp_out.4", "resid_post.29"]
    for spec in specs:
        a = run(static.capture(CORRUPT, sites, steering=spec))
        b = run(hooked.capture(CORRUPT, sites, steering=spec))
        for site in sites:
            assert _close(a[site], b[site]) <= REL, (spec, site)
    zeroed = run(static.capture(CORRUPT, ["mlp_out.4"], steering=specs[0]))["mlp_out.4"]
    assert zeroed.abs().max() == 0  # exact: h * 0


def test_patch_table_limits_are_refused_before_a_forward(engines) -> None:
    static, _ = engines
    two = steer_at(
        "mlp_out.4", Patch([0.0] * WIDTH, positions=(1,)), Patch([1.0] * WIDTH, positions=(2,))
    )
    with pytest.raises(SteeringSpecError, match="one per site"):
        run(static.capture(CORRUPT, ["mlp_out.4"], steering=two))
    wide = steer_at("mlp_out.4", Patch([0.0] * WIDTH, positions=tuple(range(17))))
    with pytest.raises(SteeringSpecError, match="static_patch_rows=17"):
        run(static.capture(CORRUPT * 3, ["mlp_out.4"], steering=wide))
    stats = run(static.flow.on_engine(static.engine.rpc("ie_static_stats")))
    assert stats[0]["registered"] == 0


HARVEST_POINTS = ["resid_post.3", "mlp_out.4", "resid_post.29"]


def test_harvest_rows_equal_hooked_one_window_captures_and_resume(engines, tmp_path) -> None:
    """`ie harvest` on vllm-static: sampled rows of every shard against a one-window capture on
    the hooked engine (REL), token ids against the tokenizer, and a resume after lost shards
    that rewrites them bit for bit (the same engine, the same batches)."""
    import json
    import random

    from ie_core.harvest import harvest, open_harvest

    static, hooked = engines
    rng = random.Random(5)
    words = [
        "the",
        "river",
        "model",
        "layer",
        "runs",
        "over",
        "blue",
        "quickly",
        "token",
        "Paris",
        "sky",
        "mountain",
    ]
    docs = [" ".join(rng.choice(words) for _ in range(rng.randint(4, 40))) for _ in range(60)]
    corpus = tmp_path / "corpus.txt"
    corpus.write_text("".join(d + "\n\n" for d in docs))
    options = {"context": 48, "shard_tokens": 240, "max_tokens": 720, "progress": False}
    out = tmp_path / "harvest"
    harvest(static, out, HARVEST_POINTS, files=[corpus], **options)
    data = open_harvest(out)
    assert data.complete and data.tokens == 720 and len(data.manifest.shards) == 3
    shards = list(data.iter_shards())
    neighbour = float("inf")
    for shard in shards:
        for row in (3, len(shard["token_ids"]) - 7):
            ids = shard["token_ids"][shard["window"] == shard["window"][row]].tolist()
            pos = int(shard["position"][row])
            alone = run(hooked.capture([ids], HARVEST_POINTS))
            for p in HARVEST_POINTS:
                assert _close(shard[p][row][None], alone[p][0, pos][None]) <= REL, (p, row)
                neighbour = min(
                    neighbour, _close(alone[p][0, pos + 1][None], alone[p][0, pos][None])
                )
    assert neighbour > 1e-2  # negative control: the next position's row is far away
    ids = torch.cat([s["token_ids"] for s in shards]).tolist()
    want = [t for d in docs for t in static.to_tokens(d, prepend_bos=False)]
    assert ids == want[: len(ids)]

    manifest = json.loads((out / "manifest.json").read_text())
    manifest["shards"], manifest["complete"] = manifest["shards"][:1], False
    (out / "manifest.json").write_text(json.dumps(manifest))
    (out / "shard-000002.safetensors").unlink()
    again = harvest(static, out, HARVEST_POINTS, files=[corpus], **options)
    assert (again.resumed_shards, again.shards, again.tokens) == (1, 3, 720)
    for a, b in zip(shards, open_harvest(out).iter_shards(), strict=True):
        for key in a:
            assert _close(b[key].float()[None], a[key].float()[None]) <= REL, key


def _unit(width: int, seed: int) -> torch.Tensor:
    v = torch.randn(width, generator=torch.Generator().manual_seed(seed))
    return v / v.norm()


def test_queries_and_keys_equal_eager_and_their_writes_move_attention_as_eager(
    engines, eager_model
) -> None:
    """q / k (the qkv output's slices) and q_rot / k_rot (attention's arguments) read as eager
    reads them; a write at q.3 moves layer 3's pattern, and one at k_rot.7 moves layer 7's and
    the decode that reads the written keys from the KV cache, each as on eager."""
    static, _ = engines
    ids = static.to_tokens("My favourite food is")
    sites = [*QK_READS, "resid_post.29"]
    plain = run(static.capture([ids], sites))
    want = run(eager_model.capture([ids], sites))
    diffs = {a: _close(plain[a], want[a]) for a in sites}
    print(f"\nstatic vs eager, unsteered: {diffs}")
    assert max(diffs.values()) <= CROSS, diffs
    # Negative control: the rotary leaves position 0 alone and moves every later row.
    assert _close(plain["q_rot.3"][:, :1], plain["q.3"][:, :1]) <= REL
    assert _close(plain["q_rot.3"][:, 1:], plain["q.3"][:, 1:]) > 1e-2
    # A vector added to every key shifts each query's scores alike and moves no softmax, so the
    # key write holds position 0: keys 1.. move against key 0.
    q_write = steer_at("q.3", Additive(_unit(static.point_width("q.3"), 21), 8.0))
    k_vec = _unit(static.point_width("k_rot.7"), 22)
    k_write = steer_at("k_rot.7", Additive(k_vec, 8.0), mask=PositionMask((0,)))
    cases = (
        ("q.3", q_write, "attn_probs.3", None),
        ("k_rot.7", k_write, "attn_probs.7", "attn_probs.3"),
    )
    for site, spec, moved, kept in cases:
        got = run(static.capture([ids], sites, steering=spec))
        want = run(eager_model.capture([ids], sites, steering=spec))
        diffs = {a: _close(got[a], want[a]) for a in sites}
        shift = float((got[moved] - plain[moved]).abs().max())
        print(f"static vs eager, steered at {site}: {diffs}; {moved} moved by {shift:.3g}")
        assert max(diffs.values()) <= CROSS, (site, diffs)
        assert shift > 1e-3, (site, shift)
        if kept is not None:  # the layer before the write is untouched
            assert _close(got[kept], plain[kept]) <= REL
    # Decode steps read the prompt's keys from the KV cache: equal to eager only if the cache
    # kept the written keys (the unsteered run shows how far the write moves them).
    sp = SamplingParams(max_new_tokens=6, stop_at_eos=False)
    last = "resid_post.29"
    gen = run(static.capture_generation(ids, [last], sp, steering=k_write))
    ref = run(eager_model.capture_generation(ids, [last], sp, steering=k_write))
    base = run(static.capture_generation(ids, [last], sp))
    n = len(ids)
    decode = {
        "vs eager": _close(gen.cache[last][:, n:], ref.cache[last][:, n:]),
        "vs unsteered": _close(gen.cache[last][:, n:], base.cache[last][:, n:]),
    }
    print(f"decode rows at {last}: {decode}; tokens {gen.generation.token_ids} (steered), "
          f"{base.generation.token_ids} (unsteered)")  # fmt: skip
    assert gen.generation.token_ids == ref.generation.token_ids
    assert _close(gen.cache[last], ref.cache[last]) <= CROSS
    assert decode["vs unsteered"] > 1e-3, decode


def test_atlas_equals_eager(engines, eager_model, tmp_path) -> None:
    """`ie atlas` on vllm-static (the atlas reducer run on the tap buffer in the worker) against
    eager: the same rows counted, top-k values within 1e-4 of each feature's scale with keys
    that swap only between values that close, counts within one (a value at 0 may round either
    side), and the kept contexts' per-token activations; a negative control against the
    neighbouring feature fails."""
    from ie_core.atlas import open_atlas
    from ie_core.atlas.running import atlas
    from ie_core.experiments.saes import from_tensors

    static, _ = engines
    g = torch.Generator().manual_seed(5)
    d, n = WIDTH, 32
    sae = from_tensors(
        {"W_enc": torch.randn(d, n, generator=g) / d**0.5,
         "b_enc": torch.randn(n, generator=g) * 0.2 - 0.6,
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
    for name, model in (("static", static), ("eager", eager_model)):
        atlas(model, sae, tmp_path / name, documents=docs, progress=False, **options)
        got[name] = open_atlas(tmp_path / name)
    a, b = got["static"].state, got["eager"].state
    assert a.tokens == b.tokens > 200
    filled = b.top_sequence >= 0
    assert torch.equal(a.top_sequence >= 0, filled)
    scale = b.top_values[:, :1].clamp_min(1.0)
    within = (a.top_values - b.top_values).abs()[filled] <= CROSS * scale.expand_as(filled)[filled]
    assert within.all()
    same_keys = (a.top_sequence == b.top_sequence) & (a.top_position == b.top_position)
    for f, j in (~same_keys & filled).nonzero().tolist():
        assert (b.top_values[f] - a.top_values[f, j]).abs().min() <= CROSS * float(scale[f])
    assert (a.count - b.count).abs().max() <= 1
    ctx_a, ctx_b = got["static"].contexts["top_acts"], got["eager"].contexts["top_acts"]
    rows = same_keys & filled
    assert ((ctx_a - ctx_b).abs()[rows].amax(-1) <= CROSS * scale.expand_as(rows)[rows]).all()
    both = filled & filled.roll(1, 0)
    shifted = (a.top_values - b.top_values.roll(1, 0)).abs()[both]
    assert not (shifted <= CROSS * scale.expand_as(both)[both]).all()
