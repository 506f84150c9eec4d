"""The hook session's own contract, beyond the point values: the order of writes and reads that
share a module, one-token and unshaped forwards, nested and doubly closed sessions, detached or
graph-keeping captures, attention maps in the model's dtype, and what an attention forward that
raises leaves behind. Each check compares against an unsteered run or a hand computation."""

from __future__ import annotations

import sys
import types
from typing import Any

import pytest
import torch
from eager_support import PROMPT, synthetic_model
from ie_core import capture
from ie_core.errors import PointUnavailableError
from ie_core.grammar import to_address
from ie_core.ops import Additive, steer_at
from ie_eager import attention
from ie_eager.backend import load
from ie_eager.hooks import Session, Write
from ie_eager.resolve import Resolved, Tap
from ie_eager.synthetic import build


def _ids(slug: str) -> list[list[int]]:
    return [synthetic_model(slug).to_tokens(PROMPT)]


def _vector(width: int, seed: int = 0) -> torch.Tensor:
    return torch.randn(width, generator=torch.Generator().manual_seed(seed))


def test_a_path_read_sees_the_point_writes_at_its_module() -> None:
    # Path addresses act last at their module: the raw module output includes mlp_out's write.
    model, ids = synthetic_model("llama"), _ids("llama")
    v = _vector(model.d_model)
    names = ["mlp_out.1", "path.model.layers.1.mlp"]
    base = capture(model, ids, names)
    got = capture(model, ids, names, steering=steer_at("mlp_out.1", Additive(v.tolist())))
    for name in names:
        torch.testing.assert_close(got[name], base[name] + v, rtol=1e-5, atol=1e-5)
    assert (base[names[1]] - base[names[0]]).abs().max() == 0  # the same tensor unsteered


def test_a_resid_mid_write_comes_after_the_attn_out_read_at_their_module() -> None:
    # resid_mid = resid_pre + attn_out, both read at the attention's output: attn_out precedes
    # resid_mid in forward order, so its capture is the unsteered attention output.
    model, ids = synthetic_model("llama"), _ids("llama")
    v = _vector(model.d_model, 1)
    names = ["attn_out.1", "resid_mid.1"]
    base = capture(model, ids, names)
    got = capture(model, ids, names, steering=steer_at("resid_mid.1", Additive(v.tolist())))
    torch.testing.assert_close(got["attn_out.1"], base["attn_out.1"], rtol=0, atol=0)
    torch.testing.assert_close(got["resid_mid.1"], base["resid_mid.1"] + v, rtol=1e-5, atol=1e-5)


def test_writes_at_two_streams_of_one_block_both_land_before_its_reads() -> None:
    model, ids = synthetic_model("deepseek-v4"), _ids("deepseek-v4")
    v0, v1 = _vector(model.d_model, 2), _vector(model.d_model, 3)
    names = ["resid_post.1.stream-1", "resid_post.1.stream-0"]
    base = capture(model, ids, names)
    steering = [
        steer_at("resid_post.1.stream-0", Additive(v0.tolist())),
        steer_at("resid_post.1.stream-1", Additive(v1.tolist())),
    ]
    got = capture(model, ids, names, steering=steering)
    torch.testing.assert_close(got[names[0]], base[names[0]] + v1, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(got[names[1]], base[names[1]] + v0, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize(("slug", "name"), [("llama", "resid_post.1"), ("opt", "mlp_act.1")])
def test_a_one_token_forward_captures_one_row(slug: str, name: str) -> None:
    # Causal: the first row of a longer prompt is the one-token prompt's row. OPT's MLP works
    # on [batch * seq, d] rows, viewed back as [batch, seq, d].
    model, ids = synthetic_model(slug), _ids(slug)
    full = capture(model, ids, [name])[name]
    one = capture(model, [ids[0][:1]], [name])[name]
    assert one.shape == (1, 1, full.shape[-1])
    torch.testing.assert_close(one[0, 0], full[0, 0], rtol=1e-5, atol=1e-5)


def _forward(model: Any, ids: list[list[int]]) -> None:
    with torch.no_grad():
        model.hf_model(input_ids=torch.tensor(ids), use_cache=False)


def test_a_session_without_a_batch_shape_keeps_a_modules_rows_as_they_are() -> None:
    model, ids = synthetic_model("opt"), _ids("opt")
    r = model.resolve("mlp_act.1")
    with Session(model.hf_model, [r]) as session:  # batch_shape left at (0, 0)
        _forward(model, ids)
    rows = session.captured[r.address]
    want = capture(model, ids, ["mlp_act.1"])["mlp_act.1"]
    assert rows.dim() == 2
    torch.testing.assert_close(rows, want.reshape(-1, want.shape[-1]), rtol=1e-5, atol=1e-5)


def test_a_nested_session_hands_the_forward_back_to_the_outer_one() -> None:
    model, ids = synthetic_model("llama"), _ids("llama")
    outer_r, inner_r = model.resolve("resid_post.0"), model.resolve("resid_post.1")
    with Session(model.hf_model, [outer_r]) as outer:
        with Session(model.hf_model, [inner_r]) as inner:
            _forward(model, ids)
        assert list(inner.captured) == [inner_r.address] and not outer.captured
        _forward(model, ids)
    assert list(outer.captured) == [outer_r.address]
    want = capture(model, ids, ["resid_post.0"])["resid_post.0"]
    torch.testing.assert_close(outer.captured[outer_r.address], want, rtol=0, atol=0)


def _hook_count(module: torch.nn.Module) -> int:
    return sum(len(m._forward_hooks) + len(m._forward_pre_hooks) for m in module.modules())


def test_closing_a_session_inside_its_block_is_safe_and_leaves_no_hooks() -> None:
    model, ids = synthetic_model("llama"), _ids("llama")
    before = _hook_count(model.hf_model)
    r = model.resolve("resid_post.1")
    with Session(model.hf_model, [r]) as session:
        assert _hook_count(model.hf_model) > before
        session.close()
    assert _hook_count(model.hf_model) == before
    _forward(model, ids)  # closed: nothing captured
    assert not session.captured


def test_captures_are_detached_unless_the_session_keeps_the_graph() -> None:
    model, ids = synthetic_model("llama"), _ids("llama")
    reads = [model.resolve("resid_post.1"), model.resolve("attn_probs.1")]
    for keep in (False, True):
        with torch.enable_grad(), Session(model.hf_model, reads, keep_graph=keep) as session:
            model.hf_model(input_ids=torch.tensor(ids), use_cache=False)
        for r in reads:
            assert session.captured[r.address].requires_grad is keep, (r.address, keep)
    probs = capture(model, ids, ["attn_probs.1"], grad=True)["attn_probs.1"]
    (grad,) = torch.autograd.grad(
        probs[0, :, -1, 0].sum(), model.hf_model.model.embed_tokens.weight
    )
    assert grad.abs().sum() > 0  # the map's graph reaches back to the embeddings


@pytest.mark.parametrize(
    ("slug", "scores_dtype"), [("llama", torch.bfloat16), ("gpt-j", torch.float32)]
)
def test_attention_maps_of_a_bf16_model_are_its_probabilities_in_bf16(
    slug: str, scores_dtype: torch.dtype
) -> None:
    # HF's eager attention takes the softmax in float32 and casts it to the query's dtype; GPT-J
    # also upcasts its scores. The map is what attention multiplies the values by.
    model = load(str(build(slug)), device="cpu", dtype="bfloat16")
    cache = capture(model, _ids(slug), ["attn_scores.1", "attn_probs.1"])
    scores, probs = cache["attn_scores.1"], cache["attn_probs.1"]
    assert scores.dtype == scores_dtype and probs.dtype == torch.bfloat16
    want = torch.softmax(scores.float(), dim=-1).to(torch.bfloat16)
    torch.testing.assert_close(probs, want, rtol=0, atol=0)


def test_an_attention_forward_that_raises_leaves_no_recorder_behind() -> None:
    # The session installs a softmax recorder for the attention's forward; a forward that
    # raises after the softmax must still remove it from this context.
    model, ids = synthetic_model("llama"), _ids("llama")
    o_proj = model.hf_model.model.layers[1].self_attn.o_proj

    def fail(*_: Any) -> None:
        raise RuntimeError("stop inside attention")

    handle = o_proj.register_forward_pre_hook(fail)
    try:
        with (
            pytest.raises(RuntimeError, match="stop inside attention"),
            Session(model.hf_model, [model.resolve("attn_probs.1")]),
        ):
            _forward(model, ids)
    finally:
        handle.remove()
    assert attention.CURRENT.get() is None
    again = capture(model, ids, ["attn_probs.1"])["attn_probs.1"]
    assert torch.allclose(again.sum(-1), torch.ones(()), atol=1e-5)  # rows are distributions


def _attention_reads(module: torch.nn.Module, layer: int = 1) -> list[Resolved]:
    tap = Tap(f"layers.{layer}.attn", module, "out")
    return [
        Resolved(to_address(f"{name}.{layer}"), "attention", tap, None, False)
        for name in ("attn_probs", "attn_scores")
    ]


def test_attention_a_session_cannot_record_is_refused_naming_the_addresses() -> None:
    # A module whose modeling module is not importable gives install() nothing to patch.
    cls = types.new_class("Attn", (torch.nn.Module,))
    cls.__module__ = "no_such_modeling_module"
    assert "no_such_modeling_module" not in sys.modules
    with pytest.raises(PointUnavailableError) as info, Session(cls(), _attention_reads(cls())):
        pass
    assert str(info.value) == (
        "attn_probs.1, attn_scores.1: Attn does not compute softmax through torch.nn.functional in "
        "its modeling module, so its scores cannot be recorded exactly"
    )
    # SDPA computes no softmax the session can see: the forward is refused, not half-recorded.
    model = load(str(build("llama")), device="cpu", dtype="float32")
    model.hf_model.set_attn_implementation("sdpa")
    attn = model.hf_model.model.layers[1].self_attn
    with (
        pytest.raises(PointUnavailableError) as info,
        Session(model.hf_model, _attention_reads(attn)),
    ):
        _forward(model, _ids("llama"))
    assert str(info.value) == (
        "attn_probs.1, attn_scores.1: expected one softmax inside LlamaAttention, saw 0; this "
        "attention does not expose one score tensor"
    )


class _OneTuple(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor]:
        return (x * 2,)


def test_a_write_on_a_module_that_returns_a_one_tuple_lands() -> None:
    module, v = _OneTuple(), _vector(4, 4)
    r = Resolved(to_address("path.inner"), "tap", Tap("inner", module, "out"), None, True)
    x = torch.ones(1, 3, 4)
    with Session(module, [], [Write(r, (Additive(v.tolist()),), (frozenset(),), None)]):
        (out,) = module(x)
    torch.testing.assert_close(out, x * 2 + v, rtol=1e-6, atol=1e-6)


def test_a_session_is_entered_once_at_a_time() -> None:
    model = synthetic_model("llama")
    with Session(model.hf_model, [model.resolve("resid_post.1")]) as session:
        with pytest.raises(RuntimeError) as info:
            session.__enter__()
        assert str(info.value) == "a Session is entered once at a time"


def test_a_path_to_a_module_whose_output_is_no_tensor_is_refused() -> None:
    model = synthetic_model("llama")
    with pytest.raises(PointUnavailableError) as info:
        capture(model, _ids("llama"), ["path.model"])
    assert str(info.value) == "LlamaModel returned BaseModelOutputWithPast, not a tensor or tuple"


def test_a_write_before_a_module_called_with_keyword_hidden_states_reaches_it() -> None:
    # HF's decoder layer calls its attention as self_attn(hidden_states=...): attn_in's write
    # must replace that keyword. Reference: the same vector added by a plain pre-hook.
    model, ids = synthetic_model("llama"), _ids("llama")
    v = _vector(model.d_model, 5)
    attn = model.hf_model.model.layers[1].self_attn

    def add(_: Any, args: tuple, kwargs: dict) -> tuple[tuple, dict]:
        assert not args and "hidden_states" in kwargs
        return args, {**kwargs, "hidden_states": kwargs["hidden_states"] + v}

    handle = attn.register_forward_pre_hook(add, with_kwargs=True)
    try:
        want = capture(model, ids, ["attn_out.1"])["attn_out.1"]
    finally:
        handle.remove()
    got = capture(model, ids, ["attn_out.1"], steering=steer_at("attn_in.1", Additive(v.tolist())))
    torch.testing.assert_close(got["attn_out.1"], want, rtol=1e-5, atol=1e-5)
    base = capture(model, ids, ["attn_out.1"])["attn_out.1"]
    assert (want - base).abs().max() > 100 * 1e-5  # the write moves attention's output
