"""The HTTP wire form of specs, sampling and tensors round-trips and refuses malformed input."""

from __future__ import annotations

import json

import pytest
import torch
from ie_core import Additive, Orthogonal, PositionMask, SamplingParams, steer_at
from ie_core.errors import SteeringSpecError, UnsupportedOperationError
from ie_core.wire import (
    decode_tensors,
    encode_tensors,
    sampling_from_wire,
    sampling_to_wire,
    steering_from_wire,
    steering_to_wire,
)


def test_steering_round_trips_through_json() -> None:
    specs = (
        steer_at("resid_post.1", Additive([1.0, -2.0, 0.5], 3.0), mask=PositionMask((0, 2))),
        steer_at("mlp_out.0", Orthogonal([0.0, 1.0, 0.0])),
    )
    assert steering_from_wire(json.loads(json.dumps(steering_to_wire(specs)))) == specs


@pytest.mark.parametrize(
    ("data", "needle"),
    [
        ({"point": "resid_post"}, "must be a JSON list"),
        ([{"point": "resid_post", "layers": [1]}], "lacks the field"),
        (
            [{"point": "resid_post", "layers": [1], "ops": [{"kind": "nope"}]}],
            "unknown steering op",
        ),
        (
            [
                {
                    "point": "resid_post",
                    "layers": [1],
                    "ops": [{"kind": "additive", "vector": [float("nan")], "coeff": 1}],
                }
            ],
            "NaN",
        ),
        ([{"point": "resid_post", "layers": [1], "ops": "additive"}], "list of JSON objects"),
        (
            [{"point": "resid_post", "layers": [1], "ops": [], "extra": 1}],
            "unknown steering spec fields",
        ),
        (["resid_post.1"], "must be a JSON object"),
    ],
)
def test_malformed_steering_is_refused_with_a_sentence(data: object, needle: str) -> None:
    with pytest.raises(SteeringSpecError, match=needle):
        steering_from_wire(data)


def test_sampling_round_trips_and_refuses_unknown_fields() -> None:
    params = SamplingParams(max_new_tokens=5, temperature=0.7, top_k=3, seed=1)
    assert sampling_from_wire(sampling_to_wire(params)) == params
    assert sampling_from_wire(None) == SamplingParams()
    with pytest.raises(ValueError, match="unknown sampling fields"):
        sampling_from_wire({"max_tokens": 3})


def test_tensors_round_trip_bit_exact_with_metadata() -> None:
    tensors = {"resid_post.1": torch.randn(2, 3, 4), "ids": torch.arange(6).reshape(2, 3)}
    got, meta = decode_tensors(encode_tensors(tensors, {"token_ids": [1, 2]}))
    assert meta == {"token_ids": [1, 2]}
    for name, t in tensors.items():
        assert got[name].dtype == t.dtype and torch.equal(got[name], t)


def test_logprobs_travel_only_when_asked() -> None:
    """Servers from before per-step logprobs read the same JSON when none are asked for."""
    from ie_core.protocol import SamplingParams
    from ie_core.wire import sampling_from_wire, sampling_to_wire

    assert "logprobs" not in sampling_to_wire(SamplingParams())
    assert sampling_from_wire(sampling_to_wire(SamplingParams(top_k=3))) == SamplingParams(top_k=3)
    # The HTTP responses carry no logprobs: a server refuses the request (422) instead of
    # answering without them.
    with pytest.raises(UnsupportedOperationError, match="not carried over HTTP"):
        sampling_from_wire(sampling_to_wire(SamplingParams(logprobs=4)))
