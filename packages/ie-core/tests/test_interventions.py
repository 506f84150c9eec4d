"""`Patch` and `Scale`: their validation, the wire, and `apply_ops` against a reference written
here row by row from the definitions (USAGE's table), not from `steer_math`."""

from __future__ import annotations

import pytest
import torch
from ie_core.errors import SteeringSpecError
from ie_core.experiments.patching import SweepResult, answer_prob, logit_diff
from ie_core.ops import Additive, Patch, Scale, steer_at
from ie_core.ops.apply import apply_ops
from ie_core.wire import steering_from_wire, steering_to_wire

W, HEAD = 8, 4  # two heads of four columns


def _reference(h: torch.Tensor, positions: list[int], op: Patch | Scale) -> torch.Tensor:
    """The definition, one row and one column at a time."""
    out = h.clone()
    cols = (
        range(W)
        if not op.heads
        else [c for hd in op.heads for c in range(hd * HEAD, hd * HEAD + HEAD)]
    )
    for i, p in enumerate(positions):
        if isinstance(op, Scale):
            for c in cols:
                out[i, c] = h[i, c] * op.factor
            continue
        if op.positions is None:
            row = op.values[0]
        elif p in op.positions:
            row = op.values[0] if len(op.values) == 1 else op.values[op.positions.index(p)]
        else:
            continue
        for c in cols:
            out[i, c] = row[c]
    return out


CASES = {
    "scale": Scale(0.5),
    "zero_ablate": Scale(0.0),
    "scale_head": Scale(3.0, heads=(1,), head_dim=HEAD),
    "patch_all_positions": Patch([float(c) for c in range(W)]),
    "patch_two_positions": Patch([[1.0] * W, [-2.0] * W], positions=(1, 4)),
    "patch_one_row_broadcast": Patch([7.0] * W, positions=(0, 2, 3)),
    "patch_head": Patch([[5.0] * W], positions=(3,), heads=(0,), head_dim=HEAD),
}


@pytest.mark.parametrize("name", list(CASES))
def test_apply_ops_equals_the_definition(name: str) -> None:
    op = CASES[name]
    g = torch.Generator().manual_seed(0)
    h = torch.randn(6, W, generator=g) * 3
    positions = [10, 1, 2, 3, 4, 5]  # not arange: the op must read the positions it is given
    got = apply_ops(h, [op], positions=torch.tensor(positions))
    want = _reference(h, positions, op)
    assert torch.equal(got, want)  # replacements are exact: one multiply or a copy
    assert not torch.equal(got, h)  # negative control: the op moved something


def test_patch_at_a_position_the_rows_do_not_hold_changes_nothing() -> None:
    h = torch.randn(3, W)
    op = Patch([[1.0] * W], positions=(9,))
    assert torch.equal(apply_ops(h, [op], positions=torch.tensor([0, 1, 2])), h)


def test_wrong_positions_give_a_different_answer() -> None:
    """A kernel reading rows by index instead of position would pass with arange; not here."""
    h = torch.zeros(4, W)
    op = Patch([[1.0] * W], positions=(2,))
    got = apply_ops(h, [op], positions=torch.tensor([5, 6, 2, 7]))
    assert got[2].eq(1).all() and got[[0, 1, 3]].eq(0).all()


def test_patch_then_additive_in_order() -> None:
    h = torch.randn(2, W)
    ops = (Patch([0.0] * W), Additive([1.0] * W, 2.0))
    assert torch.equal(apply_ops(h, ops, positions=torch.tensor([0, 1])), torch.full((2, W), 2.0))


def test_patch_of_own_values_is_the_identity_bit_for_bit() -> None:
    h = torch.randn(5, W, dtype=torch.float64).float() * 1e3
    op = Patch(h, positions=tuple(range(5)))
    assert torch.equal(apply_ops(h, [op], positions=torch.arange(5)), h)


def test_bfloat16_patch_values_round_trip_exactly() -> None:
    h = torch.randn(3, W).to(torch.bfloat16)
    op = Patch(h.float(), positions=(0, 1, 2))
    assert torch.equal(apply_ops(h, [op], positions=torch.arange(3)), h)


@pytest.mark.parametrize(
    ("make", "match"),
    [
        (lambda: Patch([[1.0, 2.0], [1.0]], positions=(0, 1)), "different widths"),
        (lambda: Patch([[1.0] * W] * 3, positions=(0, 1)), "3 value rows for 2 positions"),
        (lambda: Patch([[1.0] * W] * 2), "positions=None takes one"),
        (lambda: Patch([1.0] * W, positions=(1, 1)), "repeat"),
        (lambda: Patch([1.0] * W, positions=()), "empty"),
        (lambda: Patch([float("nan")] * W), "NaN"),
        (lambda: Patch([1.0] * W, positions=(-1,)), ">= 0"),
        (lambda: Patch([1.0] * W, heads=(0,)), "head_dim"),
        (lambda: Patch([1.0] * W, heads=(2,), head_dim=HEAD), "out of range"),
        (lambda: Patch([1.0] * W, heads=(0,), head_dim=3), "does not divide"),
        (lambda: Scale(float("inf")), "finite"),
        (lambda: Scale("2"), "real number"),
        (lambda: Scale(1.0, heads=(0, 0), head_dim=2), "more than once"),
    ],
)
def test_bad_specs_are_refused_with_the_reason(make, match: str) -> None:
    with pytest.raises(SteeringSpecError, match=match):
        make()


def test_width_is_checked_against_the_point_and_heads_against_its_width() -> None:
    steer_at("resid_pre.2", Patch([0.0] * W)).check_width(W)
    with pytest.raises(SteeringSpecError, match="width 8"):
        steer_at("resid_pre.2", Patch([0.0] * W)).check_width(12)
    spec = steer_at("z.2", Scale(0.0, heads=(3,), head_dim=4))
    assert spec.width is None  # a scale fits any width
    spec.check_width(16)
    with pytest.raises(SteeringSpecError, match="heads"):
        spec.check_width(8)


def test_wire_round_trip_keeps_every_field() -> None:
    specs = (
        steer_at("resid_pre.1", Patch([[1.5] * W, [2.5] * W], positions=(0, 3))),
        steer_at("z.0", Scale(0.25, heads=(1,), head_dim=HEAD), Patch([0.0] * W)),
    )
    assert steering_from_wire(steering_to_wire(specs)) == specs


def test_from_cache_takes_the_rows_at_the_positions() -> None:
    t = torch.arange(2 * 5 * W, dtype=torch.float32).reshape(2, 5, W)
    op = Patch.from_cache({"resid_pre.0": t}, "resid_pre.0", [1, 3], batch=1)
    assert op.positions == (1, 3)
    assert torch.equal(torch.tensor(op.values), t[1, [1, 3]])
    with pytest.raises(SteeringSpecError, match="outside the cached prompt"):
        Patch.from_cache({"resid_pre.0": t}, "resid_pre.0", [5])


def test_metrics_of_the_final_logits() -> None:
    logits = torch.tensor([[2.0, 0.5, -1.0], [0.0, 0.0, 0.0]])
    diff = logit_diff(0, 2)
    assert torch.equal(diff.fn(logits, (0, 2)), torch.tensor([3.0, 0.0]))
    prob = answer_prob(1)
    want = torch.softmax(logits, -1)[:, 1]
    assert torch.allclose(prob.fn(logits, (1,)), want, atol=1e-7)


def test_normalized_sweep_is_one_at_clean_and_zero_at_corrupt() -> None:
    r = SweepResult("resid_pre", (0,), (0, 1), "position", torch.tensor([[4.0, -2.0]]), 4.0, -2.0)
    assert torch.equal(r.normalized(), torch.tensor([[1.0, 0.0]]))


def test_align_positions_pairs_from_the_end_the_start_or_given_pairs() -> None:
    from ie_core.errors import BadPromptError
    from ie_core.experiments.patching import align_positions

    assert align_positions(3, 3, None) == {0: 0, 1: 1, 2: 2}
    with pytest.raises(BadPromptError, match=r'5 and 3 tokens.*align="end"'):
        align_positions(5, 3, None)
    assert align_positions(5, 3, "end") == {0: 2, 1: 3, 2: 4}
    assert align_positions(3, 5, "end") == {2: 0, 3: 1, 4: 2}
    assert align_positions(5, 3, "start") == {0: 0, 1: 1, 2: 2}
    assert align_positions(5, 3, [(4, 2), (0, 0)]) == {0: 0, 2: 4}
    with pytest.raises(SteeringSpecError, match="twice"):
        align_positions(5, 3, [(4, 2), (3, 2)])
    with pytest.raises(SteeringSpecError, match="outside the prompts"):
        align_positions(5, 3, [(5, 0)])


def test_multi_token_metrics_score_summed_logprobs() -> None:
    from ie_core.experiments.patching import answer_tokens

    assert answer_tokens(None, 7) == (7,) and answer_tokens(None, [3, 4]) == (3, 4)
    with pytest.raises(SteeringSpecError, match="sequence of int ids"):
        answer_tokens(None, [3, "a"])
    lp = torch.tensor([[-1.0, -3.5], [-2.0, -2.0]])
    assert torch.equal(logit_diff(0, 1).seq_fn(lp), torch.tensor([2.5, 0.0]))  # type: ignore[misc]
    assert torch.allclose(answer_prob(0).seq_fn(lp), torch.exp(lp[:, 0]))  # type: ignore[misc]
