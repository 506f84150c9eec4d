# pyright: reportArgumentType=false
# (these tests hand specs the wrong types on purpose, to see them refused)
"""Steering specs are validated in the dtype their math runs in (float32), with strict types.

A spec that is accepted must give finite activations; everything else is a SteeringSpecError
at construction, never a coerced value or a NaN at run time.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from ie_core import (
    Additive,
    LensAblate,
    LensSteer,
    LensSwap,
    Orthogonal,
    PositionMask,
    ProjectionCap,
    Steering,
)
from ie_core.errors import SteeringSpecError
from ie_core.ops import OP_KINDS
from ie_core.ops.apply import apply_ops

F32_MAX = float(torch.finfo(torch.float32).max)


def _h(width: int = 8, scale: float = 3.0) -> torch.Tensor:
    return scale * torch.randn(2, 5, width, generator=torch.Generator().manual_seed(0))


def _direction_ops(v: list[float]) -> list:
    return [
        Orthogonal(v, 0.0),
        ProjectionCap(v, min=-0.1, max=0.1),
        LensAblate(v),
        LensSteer(v, strength=0.5),
        LensSwap(v, list(reversed(v))),
    ]


@pytest.mark.parametrize("scale", [1e-30, 1e-37, 1e25, 1e30, 3e37])
def test_tiny_and_huge_direction_vectors_give_the_same_finite_result(scale: float) -> None:
    # Their float32 norms under- or overflow (|v|^2 below 1e-45 or above 3e38) when computed
    # naively; the direction is what the op uses, so the result must equal the unit-scale one.
    h = _h()
    v = torch.randn(8, generator=torch.Generator().manual_seed(1))
    for small, unit in zip(
        _direction_ops((v * scale).tolist()), _direction_ops(v.tolist()), strict=True
    ):
        out = apply_ops(h, [small])
        assert torch.isfinite(out).all(), f"{small.kind} at scale {scale:g} gave inf / NaN"
        want = apply_ops(h, [unit])
        assert float((out - want).abs().max()) <= 1e-4 * float(h.abs().max()), small.kind
    # Negative control: the ops change h, so matching the unit-scale result is not trivial.
    assert float((apply_ops(h, [LensAblate(v.tolist())]) - h).abs().max()) > 0.1


@pytest.mark.parametrize(
    "build",
    [
        lambda: Additive([1e39, 1.0]),  # beyond float32 max: inf in the math
        lambda: Additive([1e38, 1.0], coeff=10.0),  # coeff * vector beyond float32 max
        lambda: Additive([1.0], coeff=1e39),
        lambda: Additive([1e-50, -1e-50]),  # all zero in float32
        lambda: Orthogonal([1e-47, 0.0]),  # all zero in float32: no direction
        lambda: LensAblate([1e-40, 3e-41]),  # subnormal in float32: the direction is lost
        lambda: ProjectionCap([1.0], max=1e39),
        lambda: LensSteer([1.0], strength=1e40),
    ],
)
def test_values_outside_float32_are_refused(build) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(SteeringSpecError, match="float32"):
        build()


@pytest.mark.parametrize(
    ("build", "match"),
    [
        (lambda: Additive(torch.ones(2, 4)), "1-D"),
        (lambda: Additive(np.ones((2, 4))), "1-D"),
        (lambda: Additive(torch.ones(1, 4)), "1-D"),
        (lambda: Additive([[1.0, 2.0]]), "1-D"),
        (lambda: Additive(torch.tensor([1 + 1j, 2 + 0j])), "complex"),
        (lambda: Additive(np.array([1 + 1j, 2])), "complex"),
        (lambda: Additive([1 + 1j, 2.0]), "real number"),
        (lambda: Additive(torch.tensor([True, False])), "bool"),
        (lambda: Additive([True, False]), "real number"),
        (lambda: Additive(["1", "2"]), "real number"),
        (lambda: Additive("12"), "1-D sequence"),
        (lambda: Additive(3.0), "1-D sequence"),
        (lambda: Additive([1.0], coeff="2"), "real number"),  # type: ignore[arg-type]
        (lambda: Additive([1.0], coeff=True), "real number"),
        (lambda: Orthogonal([1.0], coeff=None), "real number"),  # type: ignore[arg-type]
        (lambda: ProjectionCap([1.0], min="0"), "real number"),  # type: ignore[arg-type]
        (lambda: LensSteer([1.0], strength=1j), "real number"),  # type: ignore[arg-type]
    ],
)
def test_vectors_and_scalars_are_not_coerced(build, match: str) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(SteeringSpecError, match=match):
        build()


def test_real_scalars_of_any_numeric_type_are_accepted() -> None:
    a = Additive(np.arange(1, 4, dtype=np.int64), coeff=np.float32(2.0))
    assert a == Additive([1.0, 2.0, 3.0], 2.0)
    assert Additive([1.0, 2.0], coeff=torch.tensor(3.0)).coeff == 3.0
    assert Orthogonal(torch.tensor([1.0, 2.0], dtype=torch.bfloat16)).vector == (1.0, 2.0)


@pytest.mark.parametrize(
    ("build", "match"),
    [
        (lambda: Steering("resid_post", (1.5,), (Additive([1.0]),)), "int"),
        (lambda: Steering("resid_post", (True,), (Additive([1.0]),)), "int"),
        (lambda: Steering("resid_post", ("1",), (Additive([1.0]),)), "int"),
        (lambda: Steering("resid_post", 1, (Additive([1.0]),)), "sequence"),  # type: ignore[arg-type]
        (lambda: Steering("resid_post", (1, 2, 1), (Additive([1.0]),)), "more than once"),
        (lambda: Steering("resid_post", (1,), Additive([1.0])), "tuple of ops"),  # type: ignore[arg-type]
        (lambda: Steering("resid_post", (1,), (Additive([1.0]),), stream=1.0), "int"),  # type: ignore[arg-type]
        (lambda: PositionMask((1.7,)), "int"),
        (lambda: PositionMask((True,)), "int"),
        (lambda: PositionMask(3), "sequence"),  # type: ignore[arg-type]
        (lambda: PositionMask((1,), special_tokens=1), "True or False"),  # type: ignore[arg-type]
    ],
)
def test_layers_and_positions_are_strict_ints(build, match: str) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(SteeringSpecError, match=match):
        build()


def test_numpy_integer_layers_and_positions_are_plain_ints() -> None:
    spec = Steering("resid_post", (np.int64(2),), (Additive([1.0]),), PositionMask((np.int32(1),)))
    assert spec.layers == (2,) and type(spec.layers[0]) is int
    assert spec.mask.positions == (1,) and type(spec.mask.positions[0]) is int


def test_mask_positions_past_the_prompt_are_refused() -> None:
    mask = PositionMask((1, 4, 9))
    with pytest.raises(SteeringSpecError, match=r"\[4, 9\] are past the prompt, which has 4"):
        mask.masked([5, 6, 7, 8])
    assert mask.masked(list(range(10))) == frozenset({1, 4, 9})  # inside: masked as asked


# --- property: any accepted spec gives finite activations in fp32 ---------------------------

# Every finite float64 (tiny, subnormal, huge) and every finite float32 near its limits.
ELEMENTS = st.floats(allow_nan=False, allow_infinity=False) | st.floats(
    allow_nan=False, allow_infinity=False, width=32
)
SCALARS = st.floats(-1e6, 1e6, allow_nan=False)
ACTIVATIONS = st.floats(-1e4, 1e4, allow_nan=False, width=32)


@st.composite
def op_fields(draw, elements=ELEMENTS, scalars=SCALARS, width=None):  # type: ignore[no-untyped-def]
    """(kind, constructor kwargs) for one op, drawn without regard to validity."""
    width = width or draw(st.integers(1, 6))
    vector = st.lists(elements, min_size=width, max_size=width)
    kind = draw(st.sampled_from(sorted(OP_KINDS)))
    fields = {
        "additive": lambda: {"vector": draw(vector), "coeff": draw(scalars)},
        "orthogonal": lambda: {"vector": draw(vector), "coeff": draw(scalars)},
        "projection_cap": lambda: {
            "vector": draw(vector),
            "min": draw(st.none() | scalars),
            "max": draw(st.none() | scalars),
        },
        "lens_steer": lambda: {
            "direction": draw(vector),
            "strength": draw(scalars),
            "max_fraction": draw(scalars),
        },
        "lens_ablate": lambda: {"direction": draw(vector)},
        "lens_swap": lambda: {"source": draw(vector), "target": draw(vector)},
        "patch": lambda: {"values": draw(vector)},
        "scale": lambda: {"factor": draw(scalars)},
        "feature_clamp": lambda: {
            "encoder": draw(vector),
            "decoder": draw(vector),
            "bias": draw(scalars),
            "value": draw(scalars),
        },
        "transcoder_clamp": lambda: {
            "encoder": draw(vector),
            "decoder": draw(vector),
            "read": "mlp_in.0",
            "bias": draw(scalars),
            "value": draw(scalars),
        },
        "conditional": lambda: {
            "op": {"kind": "additive", "vector": draw(vector), "coeff": draw(scalars)},
            "probe": draw(vector),
            "bias": draw(scalars),
            "threshold": draw(scalars),
        },
    }[kind]()
    return kind, fields


def _build(kind: str, fields: dict):  # type: ignore[no-untyped-def]
    try:
        return OP_KINDS[kind](**fields)
    except SteeringSpecError:
        return None  # refused with the project's error: fine, nothing to apply


def _rows(draw, width: int) -> torch.Tensor:  # type: ignore[no-untyped-def]
    rows = draw(
        st.lists(st.lists(ACTIVATIONS, min_size=width, max_size=width), min_size=1, max_size=3)
    )
    return torch.tensor(rows, dtype=torch.float32)


@settings(max_examples=400, deadline=None)
@given(op_fields(), st.data())
def test_any_accepted_op_gives_finite_activations(drawn, data) -> None:  # type: ignore[no-untyped-def]
    kind, fields = drawn
    op = _build(kind, fields)
    if op is None:
        return
    h = _rows(data.draw, op.width or 4)  # a Scale fits any width
    out = apply_ops(h, _judged([op], h))
    assert torch.isfinite(out).all(), (op, h)


def _judged(ops, rows: torch.Tensor) -> list:  # type: ignore[no-untyped-def]
    """Ops that read an earlier point (a transcoder clamp at mlp_in) judged on `rows` there,
    as a backend does before the write."""
    return [op.judged(op.judge(rows)) if op.kind == "transcoder_clamp" else op for op in ops]


@st.composite
def specs(draw):  # type: ignore[no-untyped-def]
    width = draw(st.integers(1, 6))
    # Chains compound: keep each op's growth bounded (|scalars| <= 1e3, |elements| <= 1e30) so
    # that three ops in a row stay inside float32; tiny and subnormal vectors stay in.
    elements = st.floats(-1e30, 1e30, allow_nan=False)
    drawn = draw(
        st.lists(
            op_fields(elements, st.floats(-1e3, 1e3, allow_nan=False), width),
            min_size=1,
            max_size=3,
        )
    )
    layers = draw(st.lists(st.integers(0, 40), min_size=1, max_size=3))
    return width, drawn, layers


@settings(max_examples=300, deadline=None)
@given(specs(), st.data())
def test_any_accepted_spec_gives_finite_activations(drawn, data) -> None:  # type: ignore[no-untyped-def]
    width, fields, layers = drawn
    try:
        spec = Steering("resid_post", tuple(layers), tuple(OP_KINDS[k](**f) for k, f in fields))
    except SteeringSpecError:
        return
    if any(_clamp_growth(op) > 1e3 for op in spec.ops):
        return  # beyond the chain's growth bound (a lone clamp up to its range check is above)
    rows = _rows(data.draw, width)
    out = apply_ops(rows, _judged(spec.ops, rows))
    assert torch.isfinite(out).all(), spec


def _clamp_growth(op) -> float:  # type: ignore[no-untyped-def]
    """How much a FeatureClamp can multiply a row's size: |encoder| * max|decoder| (its other
    ops' growth is their scalar, bounded by the draw)."""
    if op.kind not in ("feature_clamp", "transcoder_clamp"):
        return 0.0
    return float(np.hypot.reduce(op.encoder)) * max(abs(x) for x in op.decoder)


def test_values_exactly_at_the_float32_limits_are_accepted() -> None:
    """The bounds are inclusive: float32's max itself is a float32 value, its smallest normal a
    usable direction scale (a `>=` or `<=` in the checks would refuse them)."""
    from ie_core.ops import FeatureClamp
    from ie_core.ops.values import FLOAT32_MAX, FLOAT32_MIN_NORMAL, as_vector, real_number

    assert real_number(FLOAT32_MAX, "x") == FLOAT32_MAX
    assert as_vector([FLOAT32_MAX, 0.0]) == (FLOAT32_MAX, 0.0)
    assert as_vector([FLOAT32_MIN_NORMAL]) == (FLOAT32_MIN_NORMAL,)
    # FeatureClamp's own bound (feature_ops.delta_bound) is inclusive too: an encoder whose
    # bound lands exactly on the limit is accepted, the next float above it is refused.
    from ie_core.ops import ROW_NORM_MAX, delta_bound

    limit = FLOAT32_MAX / 2
    enc = limit / ROW_NORM_MAX
    clamp = FeatureClamp([enc], [1.0], bias=0.0, threshold=0.0, value=0.0)
    assert clamp.encoder[0] == enc and delta_bound((enc,), (1.0,), 0.0, 0.0) <= limit
    with pytest.raises(SteeringSpecError, match="beyond float32's range"):
        FeatureClamp([enc * 1.001], [1.0], bias=0.0, threshold=0.0, value=0.0)


def test_tensor_dtypes_are_judged_by_name() -> None:
    import numpy as np
    from ie_core.ops.values import as_row, real_number

    with pytest.raises(SteeringSpecError, match=r"dtype torch\.bool"):
        as_row(torch.tensor([True, False]))
    with pytest.raises(SteeringSpecError, match="complex"):
        as_row(np.array([1 + 1j]))
    assert as_row(np.array([1.5, 2.0], dtype=np.float16)) == (1.5, 2.0)
    assert real_number(torch.tensor(2.5), "x") == 2.5 and real_number(np.float32(1.5), "x") == 1.5
    with pytest.raises(SteeringSpecError, match="must be a real number"):
        real_number(torch.tensor(True), "x")
