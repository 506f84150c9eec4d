"""`EmbeddedPrompt` without a model: what a plan lowers it to (ids, and a Patch at `embeddings`
first among the steering), its JSON forms, and its refusals; the patchscope request's JSON."""

from __future__ import annotations

import math

import pytest
from ie_core import Additive, SamplingParams, steer_at
from ie_core.embedded import EmbeddedPrompt, from_embeddings
from ie_core.errors import BadPromptError, SteeringSpecError
from ie_core.experiments.patchscopes import IDENTITY, SELFIE, patchscope_plans, reads_from_wire
from ie_core.plan import CAPTURE, GENERATE, Plan

V = [0.5, -1.0, 2.0, 0.0]


def test_a_generate_plan_carries_ids_and_the_write_first() -> None:
    user = steer_at("embeddings", Additive([1.0, 0, 0, 0], 2.0))
    plan = Plan.of(GENERATE, EmbeddedPrompt([7, 8, 9], {-1: V}), (), user, SamplingParams())
    assert plan.prompt == [7, 8, 9]
    first, second = plan.steering
    assert first.point == "embeddings" and second == user
    (patch,) = first.ops
    assert patch.positions == (2,) and patch.values == (tuple(V),)
    again = Plan.from_wire(GENERATE, plan.to_wire())
    assert again.prompt == plan.prompt and again.steering == plan.steering
    # The prompt's own JSON form is read back as the same lowered plan.
    body = {"prompt": EmbeddedPrompt([7, 8, 9], {2: V}).to_wire(), "steering": []}
    assert Plan.from_wire(GENERATE, body).steering[0] == first


def test_a_batch_gives_each_embedded_row_its_own_write() -> None:
    rows = [EmbeddedPrompt([1, 2], {0: V}), [3, 4], from_embeddings([V, V])]
    plan = Plan.of(CAPTURE, rows, ["resid_post.0"])
    assert plan.prompt == [[1, 2], [3, 4], [0, 0]]
    a, b, c = plan.row_steering
    assert a[0].ops[0].positions == (0,) and b == () and c[0].ops[0].positions == (0, 1)
    with pytest.raises(SteeringSpecError, match="per row"):
        Plan.of(CAPTURE, rows, ["resid_post.0"], steer_at("embeddings", Additive(V, 1.0)))
    with pytest.raises(SteeringSpecError, match="one per prompt"):
        Plan.of(CAPTURE, rows, ["resid_post.0"], None, None, False, [None])


def test_bad_embedded_prompts_are_refused_with_what_to_do() -> None:
    for ids, vectors, needle in [
        ("text", {0: V}, "tokenize first"),
        ([1, 2], {}, "at least one"),
        ([1, 2], {2: V}, "outside the prompt"),
        ([1, 2], {0: V, -2: V}, "two vectors"),
        ([1, 2], {0: V, 1: V[:3]}, "different widths"),
        ([1, 2], {0: [math.nan, 1.0]}, "finite"),
        ([1.5, 2], {0: V}, "integers"),
    ]:
        with pytest.raises(BadPromptError, match=needle):
            EmbeddedPrompt(ids, vectors)
    with pytest.raises(BadPromptError, match="empty"):
        from_embeddings([])


def test_patchscope_plans_write_the_state_at_every_placeholder() -> None:
    plans = patchscope_plans([V, V], [5, 6, 7, 8], (1, 3), [2, 4])
    assert [p.steering[0].layers for p in plans] == [(2,), (4,)]
    assert plans[0].steering[0].ops[0].positions == (1, 3)
    assert plans[0].prompt == [5, 6, 7, 8] and plans[0].sampling == SamplingParams(
        max_new_tokens=10
    )
    assert SELFIE.parts.count(0) == 5 and IDENTITY.parts[-1] == 0


def test_a_patchscope_request_is_read_or_refused() -> None:
    got = reads_from_wire({"source": "Hi", "position": -1, "target": "selfie", "layers": [1]})
    assert got["target"] == SELFIE and got["layers"] == [1] and got["target_layer"] is None
    custom = reads_from_wire({"source": [1], "position": 0, "target": {"parts": ["a", 0]}})
    assert custom["target"].parts == ("a", 0)
    for body, needle in [
        ({"source": [1]}, "position"),
        ({"source": [1], "position": 0, "target": "nope"}, "presets"),
        ({"source": [1], "position": 0, "layers": "all"}, "list of ints"),
        ({"source": [1], "position": 0, "target": {"parts": ["a", 2.5]}}, "preset's name"),
        ({"source": [1], "position": 0, "target": {"parts": ["a"]}}, "placeholder"),
    ]:
        with pytest.raises(BadPromptError, match=needle):
            reads_from_wire(body)
