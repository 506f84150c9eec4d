"""A plan's LoRA adapters: their wire form round-trips, and malformed ones are refused by name."""

from __future__ import annotations

import pytest
from ie_core.lora import LoraError, LoraSpec, base_name
from ie_core.plan import CAPTURE, DECODE, GENERATE, Plan, PlanWireError
from ie_core.protocol import SamplingParams

A, B = LoraSpec("a", "/adapters/a"), LoraSpec("b", "/adapters/b")


def test_wire_round_trip() -> None:
    gen = Plan.of(GENERATE, "hi", sampling=SamplingParams(), lora=A)
    assert Plan.from_wire(GENERATE, gen.to_wire()) == gen
    cap = Plan.of(CAPTURE, ["x", "y", "z"], ["resid_post.0"], row_lora=[A, None, B])
    back = Plan.from_wire(CAPTURE, cap.to_wire())
    assert back == cap
    assert [back.lora_of(i) for i in range(3)] == [A, None, B]
    assert back.adapters() == (A, B)
    assert "lora" not in Plan.of(GENERATE, "hi", sampling=SamplingParams()).to_wire()


def test_malformed_adapters_are_refused() -> None:
    with pytest.raises(PlanWireError, match="name, path"):
        Plan.from_wire(GENERATE, {"prompt": "hi", "lora": {"name": "a"}})
    with pytest.raises(PlanWireError, match="row_lora"):
        Plan.from_wire(CAPTURE, {"prompts": ["x"], "addresses": [], "row_lora": "a"})
    with pytest.raises(ValueError, match="row_lora"):
        Plan.of(CAPTURE, ["x"], lora=A, row_lora=[B])
    with pytest.raises(ValueError, match="decode"):
        Plan(DECODE, [[0.0]], lora=A)
    with pytest.raises(LoraError, match="two folders"):
        Plan.of(CAPTURE, ["x", "y"], row_lora=[A, LoraSpec("a", "/elsewhere")])
    with pytest.raises(LoraError, match="name"):
        LoraSpec("", "/x")


def test_base_names_agree_across_hub_ids_and_folders() -> None:
    assert base_name("HuggingFaceTB/SmolLM2-135M-Instruct") == base_name(
        "/root/.cache/interp-engine/models/HuggingFaceTB--SmolLM2-135M-Instruct"
    )
    assert base_name("ie-synthetic/llama") != base_name("HuggingFaceTB/SmolLM2-135M-Instruct")
