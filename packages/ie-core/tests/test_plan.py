"""A request is one `Plan`: its JSON is the HTTP body both sides read, and every backend's request
methods are the front's, written once."""

from __future__ import annotations

import json

import pytest
from ie_core import Additive, SamplingParams, steer_at
from ie_core.errors import SamplingParamsError, SteeringSpecError
from ie_core.front import ModelFront
from ie_core.plan import CAPTURE, CAPTURE_GENERATION, DECODE, GENERATE, Plan, PlanWireError
from ie_core.reduce import Cast, LensTopK, Reduction

SPEC = steer_at("resid_post.1", Additive([1.0, -2.0, 0.5], 3.0))
SAMPLING = SamplingParams(max_new_tokens=3, temperature=0.5, seed=7)


@pytest.mark.parametrize(
    "plan",
    [
        Plan.of(CAPTURE, [[1, 2, 3], [4, 5, 6]], ["resid_post.1", "attn_out.0"], SPEC),
        Plan.of(CAPTURE, "a text prompt", "resid_pre.2"),
        Plan.of(CAPTURE, [[1, 2], [3, 4]], ["resid_post.0"], None, row_steering=[None, SPEC]),
        Plan.of(GENERATE, [1, 2, 3], (), [SPEC], SAMPLING),
        Plan.of(CAPTURE_GENERATION, "text", ["mlp_out.1"], None, SamplingParams()),
    ],
)
def test_a_plan_round_trips_through_its_json(plan: Plan) -> None:
    body = json.loads(json.dumps(plan.to_wire()))
    assert Plan.from_wire(plan.kind, body) == plan


def test_the_wire_names_addresses_canonically() -> None:
    """Negative control for the round trip: the body carries the canonical address, so a
    TransformerLens name comes back as the engine's."""
    plan = Plan.of(CAPTURE, [[1, 2]], ["blocks.1.hook_resid_post"])
    assert plan.to_wire()["addresses"] == ["resid_post.1"]
    assert Plan.from_wire(CAPTURE, plan.to_wire()) != plan


def test_a_tensor_prompt_travels_as_lists() -> None:
    torch = pytest.importorskip("torch")
    plan = Plan.of(CAPTURE, torch.tensor([[1, 2], [3, 4]]), ["resid_post.0"])
    assert plan.to_wire()["prompts"] == [[1, 2], [3, 4]]


@pytest.mark.parametrize(
    ("kind", "body", "error", "needle"),
    [
        (CAPTURE, [1, 2], PlanWireError, "must be a JSON object"),
        (CAPTURE, {"addresses": ["resid_post.1"]}, PlanWireError, "lacks the field 'prompts'"),
        (CAPTURE, {"prompts": 3, "addresses": []}, PlanWireError, r"'prompts' has the wrong type"),
        (CAPTURE, {"prompts": [[1]]}, PlanWireError, "lacks the field 'addresses'"),
        (CAPTURE, {"prompts": [[1]], "addresses": [3]}, PlanWireError, "list of strings"),
        (GENERATE, {"prompts": [1]}, PlanWireError, "lacks the field 'prompt'"),
        (GENERATE, {"prompt": [1], "sampling": {"beam": 2}}, ValueError, "unknown sampling"),
        (GENERATE, {"prompt": [1], "sampling": {"top_p": 0}}, SamplingParamsError, "top_p"),
        (GENERATE, {"prompt": [1], "steering": [{"point": "x"}]}, SteeringSpecError, "lacks"),
        (GENERATE, {"prompt": [1], "row_steering": [[]]}, PlanWireError, "of capture"),
        (CAPTURE, {"prompts": [[1]], "addresses": [], "row_steering": 3}, PlanWireError, "a list"),
    ],
)
def test_a_malformed_body_is_refused_with_a_sentence(
    kind: str, body: object, error: type[Exception], needle: str
) -> None:
    with pytest.raises(error, match=needle):
        Plan.from_wire(kind, body)


def test_a_plan_states_its_sampling_by_kind() -> None:
    with pytest.raises(ValueError, match="capture plan takes no sampling"):
        Plan(CAPTURE, [[1]], (), (), SamplingParams())
    with pytest.raises(ValueError, match="generate plan needs sampling"):
        Plan(GENERATE, [1])
    with pytest.raises(ValueError, match="unknown plan kind"):
        Plan("train", [1])
    with pytest.raises(ValueError, match="decode_residuals plan takes no sampling"):
        Plan(DECODE, [[0.0]], (), (), SamplingParams())


def test_a_decode_plan_reads_its_rows_only_reduced_by_one_lens_top_k() -> None:
    lens = Reduction("", LensTopK(3), "lens")
    assert Plan(DECODE, [[0.5]], reductions=(lens,)).reductions == (lens,)
    with pytest.raises(ValueError, match="no addresses or steering"):
        Plan(DECODE, [[0.5]], ("resid_post.0",))
    with pytest.raises(ValueError, match="no addresses or steering"):
        Plan.of(DECODE, [[0.5]], steering=steer_at("resid_post.0", Additive((1.0,))))
    with pytest.raises(ValueError, match="one LensTopK at most"):
        Plan(DECODE, [[0.5]], reductions=(lens, Reduction("", LensTopK(2), "other")))
    with pytest.raises(ValueError, match="one LensTopK at most"):
        Plan(DECODE, [[0.5]], reductions=(Reduction("", Cast("float16"), "half"),))


def test_the_resolver_sees_the_raw_steering_first() -> None:
    seen: list[object] = []

    def resolve(specs: list[object]) -> list[object]:
        seen.append(specs)
        return []

    plan = Plan.from_wire(GENERATE, {"prompt": [1], "steering": [{"named": "x"}]}, resolve)
    assert seen == [[{"named": "x"}]] and plan.steering == ()


REQUESTS = (
    "capture",
    "capture_attention",
    "capture_generation",
    "generate",
    "generate_stream",
    "reduce",
    "final_token_logits",
    "probe_scores",
    "dictionary_features",
    "decode_residuals",
    "decode_residuals_topk",
)
BACKENDS = [
    ("ie_eager.backend", "EagerModel"),
    ("ie_vllm.host.backend", "VLLMModel"),
    ("ie_static.backend", "StaticModel"),
    ("ie_remote.backend", "RemoteModel"),
]


@pytest.mark.parametrize(("module", "name"), BACKENDS)
def test_every_backend_takes_its_requests_from_the_front(module: str, name: str) -> None:
    """The protocol's requests are written once: a backend class executes plans and restates
    none of them (a restated method would bypass the front's plan and checks)."""
    cls = getattr(pytest.importorskip(module), name)
    assert issubclass(cls, ModelFront)
    restated = [m for m in REQUESTS for k in cls.__mro__ if k is not ModelFront and m in vars(k)]
    assert restated == []
    for method in ("execute", "execute_stream", "attention_layers"):
        assert getattr(cls, method) is not getattr(ModelFront, method), method


def test_the_restatement_check_sees_a_restated_method() -> None:
    """Negative control: a subclass that writes its own generate is caught."""

    class Restating(ModelFront):
        async def generate(self, *a: object, **k: object) -> None:  # type: ignore[override]
            return None

    assert [m for m in REQUESTS if m in vars(Restating)] == ["generate"]


def test_a_generate_plan_carries_reductions_only_to_its_stream() -> None:
    from ie_core.errors import UnsupportedOperationError

    lens = (Reduction("resid_post.1", LensTopK(3), "l"),)
    plan = Plan(GENERATE, [1, 2], sampling=SamplingParams(), reductions=lens)
    assert Plan.from_wire(GENERATE, json.loads(json.dumps(plan.to_wire()))) == plan
    with pytest.raises(UnsupportedOperationError, match="execute_stream"):
        plan.refuse_streamed_reductions()  # run whole, the per-step outputs would be dropped
    Plan(GENERATE, [1, 2], sampling=SamplingParams()).refuse_streamed_reductions()
    with pytest.raises(ValueError, match="reductions ride"):
        Plan(CAPTURE_GENERATION, [1, 2], sampling=SamplingParams(), reductions=lens)
