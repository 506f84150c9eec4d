"""The exact words of ie-core's refusals of bad values, byte for byte.

A user reads these sentences to fix a call, so each one is pinned whole: the label it names (the
argument at fault), the offending value, and what to do instead. Other tests match key phrases;
these catch a message that lost its label, its value or its advice (mutation testing showed a
phrase match misses those)."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest
import torch
from ie_core import wire
from ie_core.errors import BadPromptError, SteeringSpecError, UnsupportedOperationError
from ie_core.experiments import ragged, sae_math
from ie_core.experiments.ragged import PaddedCache
from ie_core.ops import Additive, FeatureClamp, Hook, Patch, Scale
from ie_core.ops import apply as steer_math
from ie_core.ops.transcoder_clamp import Clamped, TranscoderClamp
from ie_core.ops.values import as_row, as_vector, integer, real_number


class _NoShape:
    """An array-like that reports two dimensions but no shape."""

    ndim = 2


_RULE = "the dtype the steering math runs in"
_ROW = "must be a 1-D sequence of numbers, got"
_REAL = "must be a real number (int or float), got"

CASES: dict[str, tuple[Callable[[], Any], type[Exception], str]] = {
    "row_of_a_number": (lambda: as_row(3.0), SteeringSpecError, f"values {_ROW} float"),
    "row_default_label": (lambda: as_row("abc"), SteeringSpecError, f"values {_ROW} str"),
    "vector_default_label": (lambda: as_vector("abc"), SteeringSpecError, f"vector {_ROW} str"),
    "vector_zero": (
        lambda: as_vector([0.0, 0.0]),
        SteeringSpecError,
        f"vector is all zeros or too small for float32, {_RULE} (largest entry 0, below its "
        "smallest normal 1.18e-38, where the direction loses precision); a direction needs a "
        "non-zero vector: rescale it",
    ),
    "row_2d": (
        lambda: as_row(torch.zeros(2, 3), "v"),
        SteeringSpecError,
        "v must be 1-D, got shape (2, 3); pick one row (e.g. v[0]) rather than letting it be "
        "flattened",
    ),
    "row_2d_without_shape": (
        lambda: as_row(_NoShape(), "v"),
        SteeringSpecError,
        "v must be 1-D, got shape (); pick one row (e.g. v[0]) rather than letting it be flattened",
    ),
    "row_complex": (
        lambda: as_row(torch.zeros(2, dtype=torch.complex64), "v"),
        SteeringSpecError,
        "v has dtype torch.complex64; steering vectors are real numbers (a complex vector would "
        "lose its imaginary part)",
    ),
    # numpy strings become Python strings first: the message names `str`, not `str_`.
    "row_numpy_strings": (
        lambda: as_row(np.array(["a"]), "v"),
        SteeringSpecError,
        "v[0] must be a real number, got str 'a'",
    ),
    "row_not_iterable": (lambda: as_row(object(), "v"), SteeringSpecError, f"v {_ROW} object"),
    "row_nested": (
        lambda: as_row([[1.0]], "v"),
        SteeringSpecError,
        "v must be 1-D; element 0 is a sequence",
    ),
    "row_element_string": (
        lambda: as_row([1.0, "x"], "v"),
        SteeringSpecError,
        "v[1] must be a real number, got str 'x'",
    ),
    "row_element_nan": (
        lambda: as_row([1.0, float("nan")], "v"),
        SteeringSpecError,
        "v contains NaN or infinite values (at 1)",
    ),
    "row_element_overflow": (
        lambda: as_row([0.0, 1e39], "v"),
        SteeringSpecError,
        f"v[1] = 1e+39 overflows float32 (max 3.403e+38), {_RULE}; rescale the vector",
    ),
    "row_empty": (lambda: as_row([], "v"), SteeringSpecError, "v is empty"),
    "real_string": (
        lambda: real_number("1", "coeff"),
        SteeringSpecError,
        f"coeff {_REAL} str '1'; pass a float",
    ),
    # 0-d tensors of complex or bool dtype are refused as tensors, not unpacked first.
    "real_complex_tensor": (
        lambda: real_number(torch.tensor(1 + 0j), "coeff"),
        SteeringSpecError,
        f"coeff {_REAL} Tensor tensor(1.+0.j); pass a float",
    ),
    "real_bool_tensor": (
        lambda: real_number(torch.tensor(True), "coeff"),
        SteeringSpecError,
        f"coeff {_REAL} Tensor tensor(True); pass a float",
    ),
    "real_inf": (
        lambda: real_number(float("inf"), "coeff"),
        SteeringSpecError,
        "coeff must be finite, got inf",
    ),
    "real_overflow": (
        lambda: real_number(1e39, "coeff"),
        SteeringSpecError,
        f"coeff = 1e+39 overflows float32 (max 3.403e+38), {_RULE}; use a smaller value",
    ),
    "integer_float": (
        lambda: integer(1.5, "k"),
        SteeringSpecError,
        "k must be an int, got float 1.5; floats are not truncated and bools are not ints",
    ),
    "integer_negative": (lambda: integer(-1, "k"), SteeringSpecError, "k must be >= 0, got -1"),
    "clamp_encoder": (
        lambda: FeatureClamp("e", [1.0]),
        SteeringSpecError,
        f"encoder {_ROW} str",
    ),
    "clamp_decoder": (
        lambda: FeatureClamp([1.0], "d"),
        SteeringSpecError,
        f"decoder {_ROW} str",
    ),
    "clamp_widths": (
        lambda: FeatureClamp([1.0], [1.0, 2.0]),
        SteeringSpecError,
        "encoder (1) and decoder (2) widths differ: a clamp reads and writes one point, so a "
        "transcoder's feature cannot be clamped",
    ),
    "clamp_value": (
        lambda: FeatureClamp([1.0], [1.0], value="big"),  # type: ignore[arg-type]
        SteeringSpecError,
        f"value {_REAL} str 'big'; pass a float",
    ),
    "clamp_bias": (
        lambda: FeatureClamp([1.0], [1.0], bias=float("nan")),
        SteeringSpecError,
        "bias must be finite, got nan",
    ),
    "clamp_threshold": (
        lambda: FeatureClamp([1.0], [1.0], threshold=float("inf")),
        SteeringSpecError,
        "threshold must be finite, got inf",
    ),
    "clamp_bound": (
        lambda: FeatureClamp([1e10, 1e10], [1.0, 1.0]),
        SteeringSpecError,
        "this FeatureClamp could write 1.41e+40 (|value| + |bias| + 1e+30 * |encoder|, times "
        "max|decoder|), beyond float32's range for rows of norm up to 1e+30; a real "
        "dictionary's |encoder| * max|decoder| is near 1: rescale the encoder column or decoder "
        "row, or use feature_steer",
    ),
    "wire_hook": (
        lambda: Hook(lambda x, a: None).to_wire(),
        UnsupportedOperationError,
        "a Hook runs your Python function, which is never sent to a server (it would be "
        "arbitrary code there); express it as ops (Patch, Scale, Additive, ...) or load the "
        "model in-process with backend='eager'",
    ),
    "wire_steering_not_list": (
        lambda: wire.steering_from_wire({}),
        SteeringSpecError,
        "steering must be a JSON list of specs",
    ),
    "wire_sampling_not_object": (
        lambda: wire.sampling_from_wire([]),
        ValueError,
        "sampling must be a JSON object",
    ),
    "wire_sampling_logprobs": (
        lambda: wire.sampling_from_wire({"logprobs": 2}),
        UnsupportedOperationError,
        "per-step logprobs are not carried over HTTP; load the model in-process "
        "(backend='vllm' or 'eager') for SamplingParams(logprobs=k)",
    ),
    "ragged_empty": (
        lambda: asyncio.run(ragged.capture_ragged_async(None, [], ["resid_post.0"])),
        BadPromptError,
        "capture_ragged takes a non-empty list of prompts",
    ),
    "ragged_item": (
        lambda: asyncio.run(ragged.capture_ragged_async(None, [3], ["resid_post.0"])),
        BadPromptError,
        "capture_ragged takes a list of prompts (texts or token-id lists), got an item int 3",
    ),
    "patch_without_positions": (
        lambda: Patch([[1.0]], positions=(0,)).rows(None, torch.zeros(1, 1)),
        RuntimeError,
        "a Patch at given positions needs the rows' positions",
    ),
    # Patch and TranscoderClamp read their positions through ops.values.absolute_positions.
    "patch_positions_empty": (
        lambda: Patch([1.0], positions=()),
        SteeringSpecError,
        "patch positions are empty; give positions, or None to patch every position",
    ),
    "patch_positions_repeat": (
        lambda: Patch([1.0], positions=(2, 2)),
        SteeringSpecError,
        "patch positions [2, 2] repeat a position",
    ),
    "clamp_positions_empty": (
        lambda: TranscoderClamp([1.0], [1.0], read="mlp_in.0", positions=[]),
        SteeringSpecError,
        "clamp positions are empty; give positions, or None for all",
    ),
    "clamp_positions_repeat": (
        lambda: TranscoderClamp([1.0], [1.0], read="mlp_in.0", positions=(3, 1, 3)),
        SteeringSpecError,
        "clamp positions [3, 1, 3] repeat a position or are negative; give each absolute "
        "position once",
    ),
    "clamp_position_negative": (
        lambda: TranscoderClamp([1.0], [1.0], read="mlp_in.0", positions=-1),
        SteeringSpecError,
        "clamp position must be >= 0, got -1",
    ),
    "clamp_without_positions": (
        lambda: Clamped((1.0,), 0.0, torch.zeros(1, 1), (0,)).apply(torch.zeros(1, 1, 1), None),
        RuntimeError,
        "a clamp at given positions needs the rows' positions",
    ),
    "replacing_op_delta": (
        lambda: Scale(2.0).delta(torch.zeros(1, 1)),
        TypeError,
        "scale replaces rows; it has no delta (use apply)",
    ),
    "unknown_activation": (
        lambda: sae_math.activate(torch.zeros(1, 2), {}, sae_math.DictMeta("softplus")),
        ValueError,
        "unknown activation 'softplus'; use one of ('relu', 'jumprelu', 'topk')",
    ),
    "dtype_overflow_clamp": (
        lambda: steer_math.check_ops_fit(
            [FeatureClamp([0.0, 1.0], [1e4, 0.0], value=10.0)], torch.float16, "site"
        ),
        SteeringSpecError,
        "site: feature clamp value * decoder reaches 100000, beyond the torch.float16 max 65504 "
        "of this model's activations, so the steered value would be inf; use a smaller value or "
        "load the model in float32",
    ),
    "dtype_overflow": (
        lambda: steer_math.check_ops_fit([Additive([1.0, 2.0], 4e4)], torch.float16, "site"),
        SteeringSpecError,
        "site: additive delta reaches 80000, beyond the torch.float16 max 65504 of this model's "
        "activations, so the steered value would be inf; use a smaller value or load the model "
        "in float32",
    ),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_refusal_reads_exactly(case: str) -> None:
    call, error, message = CASES[case]
    with pytest.raises(error) as info:
        call()
    assert str(info.value) == message


def test_padded_cache_repr_names_the_lengths() -> None:
    cache = PaddedCache({"resid_post.0": torch.zeros(2, 3, 4)}, [3, 1])
    assert repr(cache) == "PaddedActivationCache(resid_post.0: (2, 3, 4), lengths=[3, 1])"


def test_unit_vector_defaults_to_the_cpu() -> None:
    v = steer_math.unit_vector([3.0, 4.0])
    assert v.device.type == "cpu"
    torch.testing.assert_close(v, torch.tensor([0.6, 0.8]), rtol=1e-6, atol=0.0)


def test_op_wire_form_is_plain_lists() -> None:
    """Tuples go out as lists: the wire form equals what a JSON round trip gives back."""
    assert Additive((1.0, 2.0), 0.5).to_wire() == {
        "kind": "additive",
        "vector": [1.0, 2.0],
        "coeff": 0.5,
    }


def test_tensors_without_ie_metadata_decode_with_empty_meta() -> None:
    """A safetensors payload from a producer that writes no `ie` metadata still decodes."""
    from safetensors.torch import save

    tensors, meta = wire.decode_tensors(save({"x": torch.arange(3.0)}))
    assert meta == {} and torch.equal(tensors["x"], torch.arange(3.0))
    tensors, meta = wire.decode_tensors(save({"x": torch.arange(3.0)}, metadata={"other": "1"}))
    assert meta == {}


def test_feature_clamp_stores_plain_float_tuples() -> None:
    """Encoder and decoder are kept as float tuples whatever was passed (the op is hashable and
    compares by value)."""
    op = FeatureClamp(torch.tensor([1.0, 2.0]), np.array([3.0, 4.0]))
    assert op.encoder == (1.0, 2.0) and op.decoder == (3.0, 4.0)
    assert type(op.encoder) is tuple and type(op.decoder) is tuple
    assert hash(op) == hash(FeatureClamp([1.0, 2.0], [3.0, 4.0]))


def test_feature_clamp_bound_is_inclusive() -> None:
    """A clamp that can write exactly half of float32's max is accepted; one ulp more is not."""
    import math

    from ie_core.ops.values import FLOAT32_MAX

    half = FLOAT32_MAX / 2
    FeatureClamp([0.0], [1.0], value=half)
    with pytest.raises(SteeringSpecError, match="beyond float32's range"):
        FeatureClamp([0.0], [1.0], value=math.nextafter(half, math.inf))
