"""Fast tests of ie-vllm's pieces without an engine: codec, accumulation, attention recompute,
layout recording, wire specs, refusals (vllm-generate, TP-sharded points, bad input)."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest
import torch
from ie_core.errors import PointUnavailableError, SteeringSpecError, UnsupportedOperationError
from ie_core.ops import Additive, Orthogonal, PositionMask, ProjectionCap, steer_at
from ie_vllm import payload
from ie_vllm.host.lens_decode import residual_rows
from ie_vllm.specs import RequestSpec, SteerSpec
from ie_vllm.worker.access import BranchSum
from ie_vllm.worker.captures import attention_rows
from ie_vllm.worker.extension import WorkerState, _acquire, _release
from ie_vllm.worker.layout import KEY_ARG
from ie_vllm.worker.point_table import AttnGeom, PointTable, SiteDef
from ie_vllm.worker.registry import Rows
from ie_vllm.worker.resolve import SHARDED_POINTS, _refuse_rest
from ie_vllm.worker.runner_adapter import record_layout


def test_payload_round_trip_keeps_dtype_shape_and_bits() -> None:
    g = torch.Generator().manual_seed(0)
    tensors = {
        "a": torch.randn(3, 5, generator=g),
        "b": torch.randn(2, 4, 4, generator=g).to(torch.bfloat16),
        "ids": torch.arange(7, dtype=torch.int64).reshape(7, 1),
        "empty": torch.empty(0, 8),
        "t": torch.randn(6, 4, generator=g).t(),  # non-contiguous
    }
    wire = payload.encode(tensors)
    assert isinstance(wire["data"], bytes)
    back = payload.decode(wire)
    assert list(back) == list(tensors)
    for name, t in tensors.items():
        assert back[name].dtype == t.dtype and back[name].shape == t.shape
        assert torch.equal(back[name], t), name


def test_payload_of_nothing() -> None:
    assert payload.decode(payload.encode({})) == {}


def test_rows_accumulate_chunks_and_overwrite_on_recompute() -> None:
    rows = Rows()
    rows.add(0, torch.full((4, 2), 0.0))  # chunked prefill, first chunk
    rows.add(4, torch.full((3, 2), 1.0))  # second chunk
    rows.add(7, torch.full((1, 2), 2.0))  # a decode step
    assert rows.count() == 8
    assert rows.gather(2, 6)[:, 0].tolist() == [0, 0, 1, 1]
    # Preempted and recomputed from position 5: the old rows 5.. are replaced, not duplicated.
    rows.add(5, torch.full((3, 2), 9.0))
    assert rows.gather()[:, 0].tolist() == [0, 0, 0, 0, 1, 9, 9, 9]


def test_rows_append_path_equals_trimming_every_chunk() -> None:
    """The O(1) append must keep exactly what trimming every earlier chunk keeps."""
    import random

    rng = random.Random(0)
    rows, naive = Rows(), []  # naive: (pos, tensor) trimmed on every add, the reference rule
    pos = 0
    for step in range(200):
        n = rng.choice([1, 1, 1, 3, 5])
        if step and rng.random() < 0.1:
            pos = rng.randrange(pos)  # a recompute from an earlier position
        chunk = torch.full((n, 2), float(step))
        rows.add(pos, chunk)
        naive = [(p, t[: pos - p]) for p, t in naive if p < pos] + [(pos, chunk)]
        pos += n
    want = torch.cat([t for _, t in naive if t.shape[0]])
    assert torch.equal(rows.gather(), want)
    assert rows.count() == want.shape[0]


def _naive_scores(q: torch.Tensor, k: torch.Tensor, geom: AttnGeom) -> torch.Tensor:
    n = q.shape[0]
    out = torch.empty(geom.heads, n, n)
    group = geom.heads // geom.kv_heads
    for h in range(geom.heads):
        kv = h // group  # repeat-interleave: consecutive query heads share a KV head
        qh = q.reshape(n, geom.heads, geom.head_dim)[:, h]
        kh = k.reshape(n, geom.kv_heads, geom.head_dim)[:, kv]
        for i in range(n):
            for j in range(n):
                s = float(qh[i] @ kh[j]) * geom.scale
                if geom.softcap:
                    s = geom.softcap * float(np.tanh(s / geom.softcap))
                visible = j <= i and (geom.window is None or i - j < geom.window)
                out[h, i, j] = s if visible else torch.finfo(torch.float32).min
    return out


@pytest.mark.parametrize(
    "geom",
    [
        AttnGeom(heads=4, kv_heads=2, head_dim=8, scale=8**-0.5, softcap=0.0, window=None),
        AttnGeom(heads=4, kv_heads=1, head_dim=8, scale=0.3, softcap=5.0, window=3),
    ],
)
def test_attention_recompute_matches_a_naive_loop(geom: AttnGeom) -> None:
    g = torch.Generator().manual_seed(1)
    n = 7
    q = torch.randn(n, geom.heads * geom.head_dim, generator=g)
    k = torch.randn(n, geom.kv_heads * geom.head_dim, generator=g)
    want = _naive_scores(q, k, geom)
    got = attention_rows(q, k, geom, 0, probs=False)
    torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)
    probs = attention_rows(q, k, geom, 0, probs=True)
    torch.testing.assert_close(probs, torch.softmax(want, -1), atol=1e-6, rtol=1e-5)
    torch.testing.assert_close(probs.sum(-1), torch.ones(geom.heads, n))
    # A later slice of query rows equals the same rows of the full map.
    tail = attention_rows(q[4:], k, geom, 4, probs=False)
    torch.testing.assert_close(tail, want[:, 4:], atol=1e-5, rtol=1e-5)
    # Negative control: tiling KV heads instead of repeat-interleaving gives other scores.
    if geom.kv_heads > 1:
        tiled = geom.heads // geom.kv_heads
        kt = k.reshape(n, geom.kv_heads, geom.head_dim).repeat(1, tiled, 1).reshape(n, -1)
        wrong = attention_rows(
            q,
            kt,
            AttnGeom(geom.heads, geom.heads, geom.head_dim, geom.scale, geom.softcap, geom.window),
            0,
            probs=False,
        )
        assert (wrong - want).abs().max() > 1e-3


def _fake_runner(
    req_ids: list[str], lens: list[int], computed: list[int], keys: dict[str, str]
) -> Any:
    qsl = np.zeros(8, dtype=np.int32)
    qsl[1 : len(lens) + 1] = np.cumsum(lens)
    requests = {
        r: SimpleNamespace(
            sampling_params=SimpleNamespace(extra_args={KEY_ARG: keys[r]} if r in keys else None)
        )
        for r in req_ids
    }
    batch = SimpleNamespace(
        num_reqs=len(req_ids),
        req_ids=req_ids,
        num_computed_tokens_cpu=np.array(computed + [0] * 3, dtype=np.int32),
    )
    return SimpleNamespace(
        input_batch=batch, query_start_loc=SimpleNamespace(np=qsl), requests=requests
    )


def test_layout_maps_internal_ids_to_keys_and_rows_to_positions() -> None:
    runner = _fake_runner(
        ["a-1234abcd", "b-5678", "c-0000"],
        [5, 1, 3],
        [0, 9, 4],
        {"a-1234abcd": "ka", "c-0000": "kc"},
    )
    layout = record_layout(runner)
    assert layout.num_tokens == 9
    a, b, c = layout.rows
    assert (a.key, a.start, a.end, a.first_pos) == ("ka", 0, 5, 0)
    assert (b.key, b.start, b.end, b.first_pos) == (None, 5, 6, 9)
    assert (c.key, c.start, c.end) == ("kc", 6, 9)
    assert c.positions().tolist() == [4, 5, 6]
    assert [r.key for r in layout.keyed()] == ["ka", "kc"]
    assert [r.req_id for r in layout.rows] == ["a-1234abcd", "b-5678", "c-0000"]
    assert c.positions().dtype == np.int64


def test_layout_skips_requests_without_rows_and_unknown_ids() -> None:
    """A request scheduled no tokens this step has no rows; one the runner does not know (or
    whose params carry no extra_args) has no key; an empty batch has no tokens."""
    runner = _fake_runner(["a-1", "b-2", "c-3"], [2, 0, 1], [0, 3, 5], {"a-1": "ka"})
    del runner.requests["c-3"]
    runner.requests["b-2"] = SimpleNamespace()  # no sampling_params at all
    layout = record_layout(runner)
    assert [(r.req_id, r.key, r.start, r.end) for r in layout.rows] == [
        ("a-1", "ka", 0, 2),
        ("c-3", None, 2, 3),
    ]
    assert layout.num_tokens == 3
    empty = record_layout(_fake_runner([], [], [], {}))
    assert empty.rows == () and empty.num_tokens == 0


def test_request_spec_round_trips_through_plain_data() -> None:
    ops = (
        Additive((1.0, 2.0), 3.0),
        Orthogonal((0.0, 1.0), 0.5),
        ProjectionCap((1.0, 1.0), max=2.0),
    )
    spec = RequestSpec(
        "k1", ("resid_post.1", "attn_probs.0"), (SteerSpec("resid_post.1", ops, (0, 2)),), 5
    )
    wire = spec.to_wire()
    import json

    json.dumps(wire)  # plain data only: msgpack carries it without insecure serialization
    assert RequestSpec.from_wire(wire) == spec


def test_sharded_points_are_refused_at_tensor_parallel_size_2() -> None:
    table = PointTable(n_layers=1, d_model=8)
    for address in ("resid_post.0", "z.0", "value.0", "mlp_act.0", "attn_probs.0", "attn_scores.0"):
        table.widths[address] = 8
        table.addresses[address] = address
    _refuse_rest(table, "LlamaForCausalLM", tp_size=2)
    assert "resid_post.0" in table.widths
    for name in ("z", "value", "mlp_act", "attn_probs", "attn_scores"):
        assert f"{name}.0" not in table.widths
        assert "tensor_parallel_size=2" in table.refused[name]
    assert {"q_norm_in", "k_norm_out"} <= SHARDED_POINTS
    # Negative control: at TP=1 nothing is taken away.
    table1 = PointTable(n_layers=1, d_model=8, widths={"z.0": 8}, addresses={"z.0": "z.0"})
    _refuse_rest(table1, "LlamaForCausalLM", tp_size=1)
    assert "z.0" in table1.widths


class _StubEngine:
    closed = False
    loop = None
    dtype = torch.float32

    async def rpc(self, *_: Any) -> list[Any]:
        raise AssertionError("a refused call must not reach the engine")


def _stub_model(backend: str) -> Any:
    from ie_vllm.host.backend import VLLMModel

    info = {
        "n_layers": 2,
        "d_model": 4,
        "vocab_size": 100,
        "architecture": "LlamaForCausalLM",
        "widths": {"resid_post.0": 4, "resid_post.1": 4, "router_logits.1": 3},
        "writable": ["resid_post.0", "resid_post.1"],
        "refused": {"mlp_pre": "mlp_pre is unreachable on vLLM: fused; use backend='eager'"},
    }
    model = VLLMModel(_StubEngine(), info, _Tok(), "stub", backend)  # type: ignore[arg-type]
    return model


class _Tok:
    all_special_ids = (0,)
    bos_token_id = 0

    def __len__(self) -> int:
        return 100


def test_vllm_generate_refuses_capture_and_steering_naming_the_alternatives() -> None:
    model = _stub_model("vllm-generate")
    with pytest.raises(UnsupportedOperationError, match=r"backend='vllm'.*vllm-static"):
        asyncio.run(model.capture([1, 2, 3], ["resid_post.0"]))
    with pytest.raises(UnsupportedOperationError, match="vllm-static"):
        asyncio.run(model.capture_generation([1, 2], ["resid_post.0"]))
    spec = steer_at("resid_post.0", Additive((1.0, 0.0, 0.0, 0.0)))
    with pytest.raises(UnsupportedOperationError, match="steering"):
        asyncio.run(model.generate([1, 2], steering=spec))
    assert model.points() == ()


def test_bad_input_is_refused_before_the_engine() -> None:
    model = _stub_model("vllm")
    with pytest.raises(PointUnavailableError, match="unreachable on vLLM"):
        model.admission.check("mlp_pre.0")
    with pytest.raises(PointUnavailableError, match="layer 0"):
        model.admission.check("router_logits.0")
    with pytest.raises(ValueError, match="out of range"):
        model.admission.check("resid_post.2")
    with pytest.raises(ValueError, match="vocabulary"):
        model.admission.prompt_ids([1, 500])
    with pytest.raises(ValueError, match="empty"):
        model.admission.prompt_ids([])
    with pytest.raises(SteeringSpecError, match="width 3"):
        model.admission.steer_specs(steer_at("resid_post.0", Additive((1.0, 2.0, 3.0))), [1, 2])
    with pytest.raises(SteeringSpecError, match="capture-only"):
        model.admission.steer_specs(steer_at("router_logits.1", Additive((1.0, 2.0, 3.0))), [1, 2])
    with pytest.raises(ValueError, match="d_model=4"):
        residual_rows(torch.zeros(2, 5), model.d_model)
    masked = model.admission.steer_specs(
        steer_at(
            "resid_post.1", Additive((1.0, 0, 0, 0)), mask=PositionMask((1,), special_tokens=True)
        ),
        [0, 5, 6],
    )
    assert masked[0].masked == (0, 1)


def test_capture_prompts_go_through_the_shared_strict_normaliser() -> None:
    import numpy as np
    from ie_core.errors import BadPromptError

    model = _stub_model("vllm")
    assert model.admission.prompts(list(np.array([1, 2, 3]))) == [(1, 2, 3)]
    assert model.admission.prompts(torch.tensor([[1, 2], [3, 4]])) == [(1, 2), (3, 4)]
    with pytest.raises(BadPromptError, match="not flattened"):
        model.admission.prompts(torch.tensor([[[1, 2]]]))
    with pytest.raises(BadPromptError, match="integers"):
        model.admission.prompts(torch.tensor([1.5, 2.0]))


def test_branch_sum_reads_the_sum_and_a_write_makes_the_layer_add_it() -> None:
    """Granite-4.0-H's mlp_out: routed + shared, read at the shared MLP; a write `new` becomes
    `new / scale - routed` there, so the layer's own addition gives `new / scale`."""
    g = torch.Generator().manual_seed(0)
    routed, shared, new = (torch.randn(3, 4, generator=g) for _ in range(3))
    branch = BranchSum()
    read, write = branch.rw(scale=0.5)
    branch.companion(None, (), routed)
    assert torch.equal(read((), {}, shared), (routed + shared) * 0.5)
    assert torch.allclose((routed + write((), {}, shared, new)) * 0.5, new, atol=1e-6)
    # No routed output of this forward (none seen, or another forward's): refused, never the
    # shared MLP alone.
    with pytest.raises(RuntimeError, match="routed MLP"):
        BranchSum().rw()[0]((), {}, shared)
    branch.companion(None, (), torch.randn(5, 4, generator=g))
    with pytest.raises(RuntimeError, match="routed MLP"):
        read((), {}, shared)


def test_a_site_installs_and_removes_its_companion_hooks() -> None:
    routed, shared = torch.nn.Linear(4, 4), torch.nn.Linear(4, 4)
    branch = BranchSum()
    read, write = branch.rw()
    site = SiteDef(
        "mlp_out.0", shared, "post", read, write, 4, companions=((routed, branch.companion),)
    )
    table = PointTable(n_layers=1, d_model=4, sites={site.name: site})
    state = WorkerState(table=table)
    _acquire(state, [site.name])
    assert len(routed._forward_hooks) == 1 and len(shared._forward_hooks) == 1
    x = torch.randn(2, 4)
    routed(x)
    assert branch.first is not None and torch.equal(branch.first, routed(x))
    _release(state, [site.name])
    assert not routed._forward_hooks and not shared._forward_hooks


@pytest.mark.parametrize("order", [("attn_k.0", "k_rot.0"), ("k_rot.0", "attn_k.0")])
def test_a_write_site_runs_before_the_read_only_sites_of_its_module(order: tuple[str, str]) -> None:
    """Whatever order requests acquire them in, a site that can write is the first hook of its
    module, so a read-only site there (the attention maps' key read) sees the written rows."""
    m = torch.nn.Linear(4, 4)
    same = lambda a, k, o: o  # noqa: E731
    reader = SiteDef("attn_k.0", m, "post", same, None, 4)
    writer = SiteDef("k_rot.0", m, "post", same, lambda a, k, o, new: new, 4)
    table = PointTable(n_layers=1, d_model=4, sites={s.name: s for s in (reader, writer)})
    state = WorkerState(table=table)
    for name in order:
        _acquire(state, [name])
    first = next(iter(m._forward_hooks))
    assert first == state.handles["k_rot.0"][-1].id
    _release(state, list(order))
    assert not m._forward_hooks
