"""Conditional steering on eager against its definition: a plain HF forward whose block output is
steered by a forward hook written here (score = h . probe + bias in float64, the vector added on
the rows whose score passes the threshold). fp32; tolerance 1e-5 relative to the rows' scale.
Negative controls: a condition that never holds equals plain, one that always holds equals the
unconditional op. Bad input is refused before any forward."""

from __future__ import annotations

import math
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pytest
import torch
from eager_support import PROMPT, synthetic_model
from ie_core.errors import ConditionPointError, DictionaryShapeError, SteeringSpecError
from ie_core.experiments.features import when_feature
from ie_core.experiments.sae_math import encode
from ie_core.experiments.saes import from_tensors
from ie_core.ops import Additive, Conditional, op_from_dict, steer_at
from ie_core.protocol import SamplingParams
from ie_core.runner import run
from ie_eager.backend import EagerModel

LAYER = 1
READ = f"resid_post.{LAYER + 1}"
TOL = 1e-5
EARLY = f"resid_post.{LAYER - 1}"  # a condition judged here ...
LATE = f"mlp_out.{LAYER + 1}"  # ... written here, in the same forward


@pytest.fixture(scope="module")
def model() -> EagerModel:
    return synthetic_model("llama")


def _vec(width: int, seed: int) -> torch.Tensor:
    return torch.randn(width, generator=torch.Generator().manual_seed(seed))


@contextmanager
def _hand_hooks(model: EagerModel, probe: torch.Tensor, threshold: float, vector: torch.Tensor,
                far: bool = False, bias: float = 0.0) -> Iterator[list[torch.Tensor]]:  # fmt: skip
    """The condition written as forward hooks on the plain HF model: score = h . probe + bias in
    float64 judged on block LAYER's output, the vector added to that output where it passes the
    threshold; `far`: judged on block LAYER - 1's output (EARLY), added to block LAYER + 1's MLP
    output (LATE). Yields each forward's judged rows."""
    hf: Any = model.hf_model
    layers = hf.model.layers
    judged, written = (layers[LAYER - 1], layers[LAYER + 1].mlp) if far else (layers[LAYER],) * 2
    held: list[torch.Tensor] = []

    def judge(module: torch.nn.Module, args: tuple, output: torch.Tensor) -> None:
        held.append(output.double() @ probe.double() + bias > threshold)

    def steer(module: torch.nn.Module, args: tuple, output: torch.Tensor) -> torch.Tensor:
        return torch.where(held[-1].unsqueeze(-1), output + vector, output)

    # In this order, so that one module judges its own rows before they are steered.
    handles = [judged.register_forward_hook(judge), written.register_forward_hook(steer)]
    try:
        yield held
    finally:
        for h in handles:
            h.remove()


def _hand_forward(model: EagerModel, ids: list[int], probe: torch.Tensor, threshold: float,
                  vector: torch.Tensor, far: bool = False,
                  bias: float = 0.0) -> tuple[torch.Tensor, torch.Tensor]:  # fmt: skip
    """(block LAYER + 1's output, the rows the condition held on) from a plain HF forward."""
    hf: Any = model.hf_model
    out: list[torch.Tensor] = []
    keep = hf.model.layers[LAYER + 1].register_forward_hook(lambda m, a, o: out.append(o[0]))
    try:
        with _hand_hooks(model, probe, threshold, vector, far, bias) as held, torch.no_grad():
            hf(input_ids=torch.tensor([ids]), use_cache=False)
    finally:
        keep.remove()
    return out[0], held[0][0]


def _hand_greedy(model: EagerModel, ids: list[int], probe: torch.Tensor, threshold: float,
                 vector: torch.Tensor, far: bool = False, steps: int = 5) -> list[int]:  # fmt: skip
    """Greedy tokens by repeated full forwards (no KV cache) with the hand hooks."""
    hf: Any = model.hf_model
    seq = list(ids)
    with _hand_hooks(model, probe, threshold, vector, far):
        for _ in range(steps):
            with torch.no_grad():
                logits = hf(input_ids=torch.tensor([seq]), use_cache=False).logits[0, -1]
            seq.append(int(logits.argmax()))
    return seq[len(ids) :]


def _capture(model: EagerModel, ids: list[int], steering: Any = None) -> torch.Tensor:
    return run(model.capture([ids], [READ], steering=steering))[READ][0]


def _scaled(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a - b).abs().max()) / max(1.0, float(b.abs().max()))


def _setup(
    model: EagerModel, far: bool = False
) -> tuple[list[int], torch.Tensor, torch.Tensor, float]:
    """Prompt ids, a probe, a vector and a threshold midway between two middle scores of the
    judged rows (block LAYER's, or EARLY's when `far`), so no row sits at the threshold and about
    half the rows pass."""
    ids = model.to_tokens(PROMPT)
    judged, seeds = (EARLY, (6, 7)) if far else (f"resid_post.{LAYER}", (1, 2))
    probe, vector = _vec(model.d_model, seeds[0]), _vec(model.d_model, seeds[1]) * 4
    rows = run(model.capture([ids], [judged]))[judged][0]
    scores = (rows.double() @ probe.double()).sort().values
    mid = len(scores) // 2
    return ids, probe, vector, float(scores[mid - 1] + scores[mid]) / 2


def test_conditional_steering_equals_its_definition_row_by_row(model: EagerModel) -> None:
    ids, probe, vector, threshold = _setup(model)
    bias = 0.25
    op = Conditional(Additive(vector, 1.0), probe, bias, threshold + bias)
    got = _capture(model, ids, steer_at(f"resid_post.{LAYER}", op))
    want, held = _hand_forward(model, ids, probe, threshold + bias, vector, bias=bias)
    assert 0 < int(held.sum()) < len(ids)  # some rows steered, some not
    assert _scaled(got, want) <= TOL
    plain = _capture(model, ids)
    assert _scaled(got, plain) > 100 * TOL  # the steering moved the rows it hit
    # The same op after the wire form (what ie serve and the vLLM worker receive).
    again = op_from_dict(op.to_wire())
    assert again == op
    assert torch.equal(_capture(model, ids, steer_at(f"resid_post.{LAYER}", again)), got)


def test_condition_never_holding_is_plain_and_always_holding_is_unconditional(
    model: EagerModel,
) -> None:
    ids, probe, vector, _ = _setup(model)
    at = f"resid_post.{LAYER}"
    plain = _capture(model, ids)
    never = Conditional(Additive(vector, 1.0), probe, threshold=1e30)
    assert torch.equal(_capture(model, ids, steer_at(at, never)), plain)
    # sigmoid(.) > -1 on every row.
    always = Conditional(Additive(vector, 1.0), probe, threshold=-1.0, activation="sigmoid")
    unconditional = _capture(model, ids, steer_at(at, Additive(vector, 1.0)))
    assert torch.equal(_capture(model, ids, steer_at(at, always)), unconditional)
    assert _scaled(unconditional, plain) > 100 * TOL


def test_conditional_generation_equals_full_forwards_with_the_hand_hook(model: EagerModel) -> None:
    """Generated tokens are judged by their own rows: KV-cached generation equals greedy decoding
    by repeated full forwards with the hand hook (tokens exactly)."""
    ids, probe, vector, threshold = _setup(model)
    op = Conditional(Additive(vector, 1.0), probe, 0.0, threshold)
    params = SamplingParams(max_new_tokens=5, stop_at_eos=False)
    got = run(model.generate(ids, params, steering=steer_at(f"resid_post.{LAYER}", op))).token_ids
    assert list(got) == _hand_greedy(model, ids, probe, threshold, vector)


def test_feature_condition_equals_the_dictionary_encode(model: EagerModel) -> None:
    """when_feature: the op applies exactly where the JumpReLU feature's activation passes."""
    at = f"resid_post.{LAYER}"
    d, n = model.d_model, 16
    g = torch.Generator().manual_seed(5)
    weights = {"W_enc": torch.randn(d, n, generator=g) / d**0.5, "b_enc": torch.randn(n, generator=g) / 8,
               "W_dec": torch.randn(n, d, generator=g), "b_dec": torch.randn(d, generator=g) / 8,
               "threshold": torch.full((n,), 0.05)}  # fmt: skip
    sae = from_tensors(weights, address=at, activation="jumprelu", b_dec_in=True)
    ids = model.to_tokens(PROMPT)
    rows = run(model.capture([ids], [at]))[at][0]
    acts = encode(rows, sae.weights, sae.meta).double()
    f = int(((acts > 0).sum(0) - len(ids) / 2).abs().argmin())  # fires on about half the rows
    t = float(acts[:, f][acts[:, f] > 0].median()) / 2
    vector = _vec(d, 3) * 4
    op = when_feature(sae, f, Additive(vector, 1.0), t)
    assert op.holds(rows).tolist() == (acts[:, f] > t).tolist()
    assert 0 < int((acts[:, f] > t).sum()) < len(ids)
    got = _capture(model, ids, steer_at(at, op))
    want, held = _hand_forward(
        model, ids, torch.tensor(op.probe), op.threshold, vector, bias=op.bias
    )
    assert held.tolist() == (acts[:, f] > t).tolist()
    assert _scaled(got, want) <= TOL
    with pytest.raises(DictionaryShapeError, match="outside"):
        when_feature(sae, n, Additive(vector, 1.0))
    with pytest.raises(ConditionPointError, match=at):  # judged after the write: refused
        steer_at(f"resid_post.{LAYER - 1}", op)


def test_bad_conditions_are_refused_before_any_forward(model: EagerModel) -> None:
    ids = model.to_tokens(PROMPT)
    d = model.d_model
    vec = _vec(d, 4)
    calls: list[int] = []
    hook = model.hf_model.register_forward_pre_hook(lambda *a: calls.append(1))  # type: ignore[union-attr]
    try:
        with pytest.raises(SteeringSpecError, match="probe is 7 wide"):
            Conditional(Additive(vec, 1.0), [1.0] * 7)
        narrow = Conditional(Additive([1.0] * 7, 1.0), [1.0] * 7)
        with pytest.raises(SteeringSpecError, match="width 7"):
            run(model.capture([ids], [READ], steering=steer_at(f"resid_post.{LAYER}", narrow)))
        with pytest.raises(SteeringSpecError, match="threshold must be finite"):
            Conditional(Additive(vec, 1.0), vec, threshold=math.nan)
        with pytest.raises(SteeringSpecError, match="activation"):
            Conditional(Additive(vec, 1.0), vec, activation="softplus")
        with pytest.raises(SteeringSpecError, match="probe is 7 wide"):
            op_from_dict({"kind": "conditional", "op": Additive(vec).to_wire(), "probe": [1.0] * 7})
        with pytest.raises(ConditionPointError, match=r"resid_post\.2"):
            steer_at(f"resid_post.{LAYER}", Conditional(Additive(vec), vec, read="resid_post.2"))
    finally:
        hook.remove()
    assert calls == []


# -- a condition read at an earlier point than the one written --


def test_a_condition_read_at_an_earlier_point_equals_its_definition(model: EagerModel) -> None:
    ids, probe, vector, threshold = _setup(model, far=True)
    op = Conditional(Additive(vector, 1.0), probe, 0.0, threshold, read=EARLY)
    got = _capture(model, ids, steer_at(LATE, op))
    want, held = _hand_forward(model, ids, probe, threshold, vector, far=True)
    assert 0 < int(held.sum()) < len(ids)
    assert _scaled(got, want) <= TOL
    # Negative control: the same condition judged on the written rows picks other rows.
    here = Conditional(Additive(vector, 1.0), probe, 0.0, threshold)
    assert _scaled(_capture(model, ids, steer_at(LATE, here)), want) > 100 * TOL
    # The wire form keeps `read` (what ie serve and the vLLM worker receive).
    assert torch.equal(_capture(model, ids, steer_at(LATE, op_from_dict(op.to_wire()))), got)
    # Never and always holding.
    plain = _capture(model, ids)
    never = Conditional(Additive(vector, 1.0), probe, threshold=1e30, read=EARLY)
    assert torch.equal(_capture(model, ids, steer_at(LATE, never)), plain)
    always = Conditional(Additive(vector, 1.0), probe, threshold=-1.0, activation="sigmoid",
                         read=EARLY)  # fmt: skip
    unconditional = _capture(model, ids, steer_at(LATE, Additive(vector, 1.0)))
    assert torch.equal(_capture(model, ids, steer_at(LATE, always)), unconditional)


def test_an_earlier_condition_in_generation_equals_full_forwards(model: EagerModel) -> None:
    """Each generated token is judged by its own row at the earlier point (KV-cached steps)."""
    ids, probe, vector, threshold = _setup(model, far=True)
    op = Conditional(Additive(vector, 1.0), probe, 0.0, threshold, read=EARLY)
    params = SamplingParams(max_new_tokens=5, stop_at_eos=False)
    got = run(model.generate(ids, params, steering=steer_at(LATE, op))).token_ids
    assert list(got) == _hand_greedy(model, ids, probe, threshold, vector, far=True)


def test_rows_with_their_own_earlier_conditions_equal_their_serial_runs(
    model: EagerModel,
) -> None:
    """Batched row steering: each row's condition is judged on its own row only."""
    ids, probe, vector, threshold = _setup(model, far=True)
    specs = [
        steer_at(
            LATE,
            Conditional(Additive(vector * (1 + i), 1.0), probe, 0.0, threshold + i, read=EARLY),
        )
        for i in range(3)
    ]
    batched = run(model.capture([ids] * 3, [READ], row_steering=specs))[READ]
    for i, spec in enumerate(specs):
        assert torch.equal(batched[i], _capture(model, ids, spec)), i


def test_conditions_at_later_or_unreadable_points_are_refused(model: EagerModel) -> None:
    ids = model.to_tokens(PROMPT)
    vec = _vec(model.d_model, 8)
    with pytest.raises(ConditionPointError, match="not computed after"):
        steer_at(EARLY, Conditional(Additive(vec), vec, read=LATE))
    with pytest.raises(ConditionPointError, match="not computed after"):  # same layer, later point
        steer_at(f"attn_out.{LAYER}", Conditional(Additive(vec), vec, read=f"mlp_out.{LAYER}"))
    with pytest.raises(ConditionPointError, match="one row per token"):
        steer_at(LATE, Conditional(Additive(vec), vec, read=f"attn_probs.{LAYER}"))
    inner = Conditional(Additive(vec), vec, read=EARLY)
    with pytest.raises(ConditionPointError, match="outermost"):
        steer_at(LATE, Conditional(inner, vec))
    narrow = Conditional(Additive(vec), [1.0] * 7, read=EARLY)  # the probe is the read point's
    with pytest.raises(SteeringSpecError, match=f"reads {EARLY}"):
        run(model.capture([ids], [READ], steering=steer_at(LATE, narrow)))
    hf: Any = model.hf_model
    wide = hf.config.intermediate_size
    mlp = Conditional(Additive(vec), _vec(wide, 9), read=f"mlp_act.{LAYER}")
    got = run(model.capture([ids], [READ], steering=steer_at(LATE, mlp)))[READ]
    assert got.shape[-1] == model.d_model  # a probe as wide as the point it reads is taken
